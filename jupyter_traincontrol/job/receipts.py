"""A receipt for a job's command: what every process did with it, told to its sender once.

Each process of a job applies an agreed command at the same step and
answers it in its own journal. `Receipts` sits in that answer's way (the
journal's ``receipt``): every process writes what it did, and at which step,
under ``done/ID/PROCESS`` in the job's key-value store; process 0 keeps its
own answer back and its job's watcher thread (`collect`) answers the sender
once every process has said: ``applied`` with "applied at step S on 2 of 2
ranks", or ``failed`` naming the process that refused, failed, or ended
before applying it. A sender waiting with ``send --wait`` exits 0 only then.

Only requests the job agreed on pass through here; one refused before any
process applied it (`agreement.Agreement.refused`) is answered at once.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Callable

from ..protocol import Request
from .coordination import Coordination

__all__ = ["Receipts"]

_FINISH_POLL_SECONDS = 0.02


class Receipts:
    """The answers of every process to the job's agreed commands.

    Args:
        coordination: The job's key-value store.
        process_id: This process's index.
        num_processes: How many processes the job has.
        unit: What a process is called in messages (``process``, ``rank``).
        step_of: This process's step now (where it applied a command).
        ended: True once the given process has ended its run (its heartbeat says so).
    """

    def __init__(self, coordination: Coordination, process_id: int, num_processes: int, unit: str,
                 step_of: Callable[[], int], ended: Callable[[int], bool]):
        self._kv = coordination
        self.process_id = process_id
        self.num_processes = num_processes
        self.unit = unit
        self._step_of = step_of
        self._ended = ended
        self._lock = threading.Lock()
        self._agreed: set[str] = set()  # ids agreed on, not yet answered here
        self._held: dict[str, tuple[Request, Callable[[Request, str, str], None]]] = {}  # process 0's, by id

    def agreed(self, request: Request) -> None:
        """The job agreed on `request` (watcher thread): its answers pass through here."""
        if request.request_id is not None:
            with self._lock:
                self._agreed.add(request.request_id)

    def relay(self, settle: Callable[[Request, str, str], None]) -> Callable[[Request, str, str], bool]:
        """The journal's ``receipt``: `settle` answers the sender (the journal's own)."""

        def receipt(request: Request, outcome: str, message: str) -> bool:
            return self._answered(request, outcome, message, settle)

        return receipt

    def _answered(self, request: Request, outcome: str, message: str, settle) -> bool:
        request_id = request.request_id
        with self._lock:
            if request_id not in self._agreed:
                return False
            self._agreed.discard(request_id)
        word = {"outcome": outcome, "message": message, "step": self._step_of()}
        self._kv.set(self._kv.key("done", request_id, self.process_id), json.dumps(word))
        if self.process_id != 0:
            return False  # its own record answers as usual; process 0's tells the sender
        with self._lock:
            self._held[request_id] = (request, settle)
        return True

    @property
    def waiting(self) -> bool:
        """True while process 0 holds an answer back."""
        return bool(self._held)

    def collect(self, final: bool = False) -> None:
        """Process 0 (its watcher): answers each held request every process
        has answered (or whose missing processes have ended); with `final`,
        answers every held request now, naming the processes that did not say."""
        for request_id in list(self._held):
            words = {process: self._word(request_id, process) for process in range(self.num_processes)}
            missing = [process for process, word in words.items() if word is None]
            if missing and not final and not all(self._ended(process) for process in missing):
                continue
            with self._lock:
                held = self._held.pop(request_id, None)
            if held is not None:  # not answered meanwhile by another thread (the watcher, or the run's end)
                request, settle = held
                settle(request, *self.combined(words))

    def finish(self, timeout: float) -> None:
        """Process 0, as its run ends: waits up to `timeout` seconds for the
        answers still missing (every process applies a ``stop`` at the same
        step, so theirs come at once), then answers every held request."""
        deadline = time.monotonic() + timeout
        while self._held and time.monotonic() < deadline:
            self.collect()
            if self._held:
                time.sleep(_FINISH_POLL_SECONDS)
        self.collect(final=True)

    def _word(self, request_id: str, process: int) -> dict | None:
        value = self._kv.try_get(self._kv.key("done", request_id, process))
        return json.loads(value) if value is not None else None

    def combined(self, words: dict[int, dict | None]) -> tuple[str, str]:
        """The one answer of the job, from every process's (None: did not say)."""
        count, unit = self.num_processes, self.unit
        units = unit + ("es" if unit.endswith("s") else "s")  # processes, ranks
        applied = [process for process, word in words.items() if word is not None and word["outcome"] == "applied"]
        ignored = [process for process, word in words.items() if word is not None and word["outcome"] == "ignored"]
        steps = sorted({words[process]["step"] for process in applied})
        at = f"at step {steps[0]}" if len(steps) == 1 else "at steps " + ", ".join(map(str, steps))
        problems = []
        for process, word in words.items():
            if word is None:
                problems.append(f"{unit} {process} did not say it applied it (it ended, or did not answer)")
            elif word["outcome"] == "failed":
                problems.append(f"{unit} {process} failed: {word['message']}")
        if problems:
            done = f"applied on {len(applied)} of {count} {units}" if applied else f"applied on none of {count} {units}"
            return "failed", f"{done}; " + "; ".join(problems)
        if not applied:
            return "ignored", f"{words[0]['message']} (on {count} of {count} {units})"
        text = f"{words[applied[0]]['message']}; applied {at} on {len(applied)} of {count} {units}"
        others = [f"{unit} {process}: {words[process]['message']}" for process in ignored]
        return "applied", text + ("; " + "; ".join(others) if others else "")
