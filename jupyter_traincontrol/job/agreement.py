"""Agreeing on commands: proposed by one process, applied by every process at one step.

Any process that takes a command (from its FIFO, Ctrl+C, SIGTERM) proposes
it (`Agreement.propose`): a sequence number from a counter, the command
under ``cmd/N`` with the step to apply it at (the next batch boundary),
then it waits for every process to acknowledge it. While it waits, no
process can finish the next step (each step needs all of them), so every
process sees the proposal before that step and applies it there. Each
process's watcher reads the next ``cmd/N`` (`receive`) and queues it by
step; `AgreedChannel` hands the queued requests to the boundary layer once
their step has come. The training thread pays two checks per batch.
"""

from __future__ import annotations

import heapq
import json
import threading
import time
from typing import Callable

from ..protocol import Request, parse_request
from .coordination import Coordination, JobLostError, first_line, timed_out

__all__ = ["Agreement", "AgreedChannel"]

_HOLD_POLL_SECONDS = 0.05


class Agreement:
    """The commands one process of a job proposed and received, by step.

    Args:
        coordination: The job's key-value store.
        process_id: This process's index.
        num_processes: How many processes the job has.
        agree_timeout: Seconds to wait for every process to acknowledge.
    """

    def __init__(self, coordination: Coordination, process_id: int, num_processes: int, agree_timeout: float):
        self.coordination = coordination
        self.process_id = process_id
        self.num_processes = num_processes
        self.agree_timeout = agree_timeout
        self._agreed: list[tuple[int, int, Request]] = []  # heap of (step, seq, request)
        self._lock = threading.Lock()
        self.next_seq = 1

    def propose(self, request: Request, step: int) -> None:
        """Training thread: proposes `request` for `step`, waits until every
        process has it (they cannot pass `step` meanwhile).

        Raises:
            JobLostError: A process was lost meanwhile.
            RuntimeError: A process did not acknowledge in time.
        """
        kv = self.coordination
        seq = kv.increment(kv.key("seq"), 1)
        line = str(request) + (f" #{request.request_id}" if request.request_id else "")
        kv.set(kv.key("cmd", seq), json.dumps({"line": line, "step": step, "from": self.process_id}))
        for process in range(self.num_processes):
            try:
                kv.wait_for(kv.key("ack", seq, process), self.agree_timeout, f"process {process} to acknowledge {request}")
            except (TimeoutError, RuntimeError) as error:
                if isinstance(error, JobLostError):
                    raise
                raise RuntimeError(
                    f"Process {process} of {self.num_processes} did not acknowledge {request} "
                    f"within {self.agree_timeout:g} s: {first_line(error)}"
                ) from None

    def receive(self, timeout: float) -> bool:
        """Watcher thread: takes the next proposal if it comes within
        `timeout` seconds, queues it by its step and acknowledges it.

        Returns:
            True if one came.
        """
        kv = self.coordination
        try:
            value = kv.get(kv.key("cmd", self.next_seq), timeout)
        except Exception as error:
            if not timed_out(error):
                raise
            return False
        proposal = json.loads(value)
        with self._lock:
            heapq.heappush(self._agreed, (int(proposal["step"]), self.next_seq, parse_request(proposal["line"])))
        kv.set(kv.key("ack", self.next_seq, self.process_id), "1")
        self.next_seq += 1
        return True

    def due(self, boundary: int) -> bool:
        """True when a received request's step has come (cheap)."""
        agreed = self._agreed
        return bool(agreed) and agreed[0][0] <= boundary

    def pop_due(self, boundary: int) -> Request | None:
        """The next request whose step has come, or None."""
        with self._lock:
            if self._agreed and self._agreed[0][0] <= boundary:
                return heapq.heappop(self._agreed)[2]
        return None

    def undelivered(self) -> list[Request]:
        """Agreed requests whose step never came (the `fit` ended first)."""
        with self._lock:
            left, self._agreed = [entry[2] for entry in sorted(self._agreed)], []
        return left


class AgreedChannel:
    """What the boundary layer reads in a job: the requests every process
    agreed on, each once its step has come. Requests that arrive locally
    (FIFO, Ctrl+C) are proposed first. Cheap per batch: two checks.

    Args:
        agreement: The job's agreement.
        local: The run's own channel (its FIFO).
        progress: Where training stands (its ``boundary`` counter).
        lost: Returns why a peer is lost, or None.
    """

    def __init__(self, agreement: Agreement, local, progress, lost: Callable[[], str | None]):
        self.agreement = agreement
        self.local = local
        self.progress = progress
        self._lost = lost
        self._holding = False

    @property
    def kind(self) -> str:
        return self.local.kind

    @property
    def address(self) -> str:
        return self.local.address

    @property
    def pending(self) -> bool:
        if self.local.pending:
            self._propose_local()
        return self.agreement.due(self.progress.boundary)

    def _propose_local(self) -> None:
        # Held, every process waits at this very boundary: apply it here.
        step = self.progress.boundary + (0 if self._holding else 1)
        while (request := self.local.pop()) is not None:
            self.agreement.propose(request, step)

    def pop(self) -> Request | None:
        return self.agreement.pop_due(self.progress.boundary)

    def get(self, timeout: float | None) -> Request | None:
        """While paused: proposes what arrives, returns what is due."""
        self._holding = True
        try:
            deadline = time.monotonic() + (timeout or 0)
            while True:
                if self.local.pending:
                    self._propose_local()
                request = self.pop()
                if request is not None or self._lost() or time.monotonic() >= deadline:
                    return request
                time.sleep(_HOLD_POLL_SECONDS)
        finally:
            self._holding = False
