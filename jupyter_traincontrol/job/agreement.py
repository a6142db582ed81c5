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

from ..protocol import FINAL_STATES, Request, parse_request
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

    def propose(self, request: Request, step: int) -> str | None:
        """Training thread: proposes `request` for `step`, waits until every
        process has it (they cannot pass `step` meanwhile). Never raises into
        the training: a proposal that cannot be agreed on is answered.

        Returns:
            None once every process has it; else why it will not be applied
            (a process has ended its `fit`, was lost, or did not answer).
        """
        kv = self.coordination
        waiting_for = "the coordination service"
        try:
            seq = kv.increment(kv.key("seq"), 1)
            line = str(request) + (f" #{request.request_id}" if request.request_id else "")
            kv.set(kv.key("cmd", seq), json.dumps({"line": line, "step": step, "from": self.process_id}))
            for process in range(self.num_processes):
                waiting_for = f"process {process} of {self.num_processes}"
                answered = kv.wait_for(kv.key("ack", seq, process), self.agree_timeout,
                                       f"process {process} to acknowledge {request}",
                                       give_up=lambda process=process: self._ended(process))
                if answered is None:
                    self._withdraw(seq)
                    return f"process {process} of {self.num_processes} has ended fit; the job did not apply it"
        except JobLostError as error:
            return str(error)
        except Exception as error:  # a timeout, or the coordination service went away
            return f"the job could not agree on it: {waiting_for} did not answer within {self.agree_timeout:g} s ({first_line(error)})"
        return None

    def _ended(self, process: int) -> bool:
        """True once `process` said in its heartbeat that its `fit` ended."""
        if process == self.process_id:
            return False
        beat = self.coordination.try_get(self.coordination.key("beat", process))
        try:
            return beat is not None and json.loads(beat).get("state") in {str(state) for state in FINAL_STATES}
        except (ValueError, AttributeError):
            return False

    def _withdraw(self, seq: int) -> None:
        """Drops proposal `seq` from this process's queue (it will not be applied)."""
        with self._lock:
            kept = [entry for entry in self._agreed if entry[1] != seq]
            heapq.heapify(kept)
            self._agreed = kept

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


class AgreedChannel:
    """What the boundary layer reads in a job: the requests every process
    agreed on, each once its step has come. Requests that arrive locally
    (FIFO, Ctrl+C) are proposed first. Cheap per batch: two checks.

    Args:
        agreement: The job's agreement.
        local: The run's own channel (its FIFO).
        progress: Where training stands (its ``boundary`` counter).
        lost: Returns why a peer is lost, or None.
        refused: Called with a request the job could not agree on, and why
            (the run answers it ``failed``).
    """

    def __init__(self, agreement: Agreement, local, progress, lost: Callable[[], str | None],
                 refused: Callable[[Request, str], None]):
        self.agreement = agreement
        self.local = local
        self.progress = progress
        self._lost = lost
        self._refused = refused
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
            why = self.agreement.propose(request, step)
            if why is not None:
                self._refused(request, why)

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
