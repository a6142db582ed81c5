"""Agreeing on commands: proposed by one process, applied by every process at one step.

Any process that takes a command (from its FIFO, Ctrl+C, SIGTERM) proposes
it (`Agreement.propose`): a sequence number from a counter, the command
under ``cmd/N``; it does not wait. Every process's watcher thread reads the
next ``cmd/N`` (`Agreement.receive`) and agrees on its step with the
others:

1. it closes its process's gate, so the training thread begins no step
   until the step is agreed (it waits at its next ``on_train_batch_begin``,
   or at the end of the boundary it is acting at);
2. it writes where that process can still apply it (``at/N/PROCESS``):
   the boundary it is acting at, if its training thread is at one; else
   the end of the step it has begun, if an agreed request is due there
   (its training thread acts there: a ``pause`` holds there); else the end
   of the step after it (it may have passed this step's batch-end hooks on
   Keras's pool);
3. it reads every process's, takes the latest, queues the request for
   that step and opens the gate.

So the step is agreed whatever each training thread was doing: with
Keras's asynchronous dispatch of batch hooks a training thread runs ahead
of the device by as many steps as it has queued (35 were seen in a
2-process job on this machine), and the watchers, not the training
threads, agree. No training thread waits on another meanwhile, so no wait
of the agreement meets a step that waits on it (a step needs every
process). The training thread then makes the agreed step's batch-end hook
its own (`before_step` says so), and `AgreedChannel` hands the request to
the boundary layer there. The training thread pays two checks per batch.

A proposal never fails the job: if a process has already ended its `fit`
(its heartbeat says so) it will never say where it is, so the proposal is
dropped at once on every process and the process that proposed it answers
it ``failed``, saying why (`refused`); the others train on.

A process that ends its `fit` takes the next number too, for an end marker
(`mark_ended`): its own watcher, blocked on that number, wakes at once
instead of at the end of its read, and every watcher passes over it.
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
        agree_timeout: Seconds to wait for every process's word on a step.
        refused: Called (on the watcher thread) with a request this process
            proposed that the job cannot apply, and why. Defaults to None.
        agreed: Called (on the watcher thread) with each request the job
            agreed on, before any process applies it. Defaults to None.
        while_waiting: Called (on the watcher thread) between the slices of
            a wait for a process's word on a proposal: the job's heartbeat
            and its look at the others go on meanwhile. Defaults to None.
        unit: What a process is called in messages. Defaults to ``process``.
    """

    def __init__(self, coordination: Coordination, process_id: int, num_processes: int, agree_timeout: float,
                 refused: Callable[[Request, str], None] | None = None,
                 agreed: Callable[[Request], None] | None = None,
                 while_waiting: Callable[[], object] | None = None, unit: str = "process"):
        self.coordination = coordination
        self.refused = refused
        self.agreed = agreed
        self.while_waiting = while_waiting
        self.unit = unit
        self.process_id = process_id
        self.num_processes = num_processes
        self.agree_timeout = agree_timeout
        self._agreed: list[tuple[int, int, Request]] = []  # heap of (step, seq, request)
        self._lock = threading.Condition()
        self.next_seq = 1
        #: The gate: True while a proposal's step is being agreed.
        self.closed = False
        #: This process's training thread: steps begun, and the boundary it is
        #: acting at (None while it is not at one). Set under the lock.
        self.dispatched = 0
        self.acting_at: int | None = None

    def propose(self, request: Request) -> None:
        """Proposes `request` to every process (any thread; does not wait).
        If a process has already ended its `fit`, it is refused at once instead."""
        ended = next((process for process in range(self.num_processes) if self.ended(process)), None)
        if ended is not None and self.refused is not None:
            self.refused(request, self._not_applied(ended))
            return
        kv = self.coordination
        seq = kv.increment(kv.key("seq"), 1)
        line = str(request) + (f" #{request.request_id}" if request.request_id else "")
        kv.set(kv.key("cmd", seq), json.dumps({"line": line, "from": self.process_id}))

    def mark_ended(self) -> None:
        """Puts an end marker in the sequence (any thread; after this
        process's `fit` ended): every watcher blocked on its number wakes,
        this process's own among them, and passes over it."""
        kv = self.coordination
        seq = kv.increment(kv.key("seq"), 1)
        kv.set(kv.key("cmd", seq), json.dumps({"ended": self.process_id}))

    def receive(self, timeout: float) -> bool:
        """Watcher thread: takes the next proposal if it comes within
        `timeout` seconds and agrees on its step with every process.

        Returns:
            True if one came (agreed on, or dropped because a process has
            ended its `fit`), or an end marker (`mark_ended`).

        Raises:
            JobLostError: A process was lost meanwhile.
            RuntimeError: A process did not say where it is in time.
        """
        kv = self.coordination
        seq = self.next_seq
        try:
            value = kv.get(kv.key("cmd", seq), timeout)
        except Exception as error:
            if not timed_out(error):
                raise
            return False
        proposal = json.loads(value)
        if "ended" in proposal:  # a process's end marker: nothing to agree on
            with self._lock:
                self.next_seq = seq + 1
            return True
        request = parse_request(proposal["line"])
        with self._lock:
            self.closed = True
            here = self._where_it_can_act()
        try:
            kv.set(kv.key("at", seq, self.process_id), str(here))
            words = [self._word_of(process, seq, request) for process in range(self.num_processes)]
        except BaseException:
            self._open()
            raise
        ended = [process for process, word in enumerate(words) if word is None]
        with self._lock:
            if not ended:
                if self.agreed is not None:
                    self.agreed(request)
                heapq.heappush(self._agreed, (max(int(word) for word in words), seq, request))
            self.next_seq = seq + 1
        self._open()
        if ended and proposal.get("from") == self.process_id and self.refused is not None:
            self.refused(request, self._not_applied(ended[0]))
        return True

    def _where_it_can_act(self) -> int:
        """The first step at whose end this process can still apply a new
        proposal (the lock held): the boundary its training thread is acting
        at; else the end of the step it has begun, if an agreed request is
        due there (its training thread acts there anyway: a job that pauses
        there holds there, and a later step would never come while it is
        paused); else the end of the step after it."""
        if self.acting_at is not None:
            return self.acting_at
        return self.dispatched if self.due(self.dispatched) else self.dispatched + 1

    def _not_applied(self, ended: int) -> str:
        return f"{self.unit} {ended} of {self.num_processes} has ended its training; the job did not apply it"

    def _word_of(self, process: int, seq: int, request: Request) -> str | None:
        """Where `process` can apply proposal `seq`; None if it has ended its `fit`."""
        kv = self.coordination
        try:
            return kv.wait_for(kv.key("at", seq, process), self.agree_timeout, f"{self.unit} {process} to agree on {request}",
                               give_up=lambda: self._ended_meanwhile(process))
        except (TimeoutError, RuntimeError) as error:
            if isinstance(error, JobLostError):
                raise
            raise RuntimeError(
                f"{self.unit.capitalize()} {process} of {self.num_processes} did not agree on a step for {request} "
                f"within {self.agree_timeout:g} s: {first_line(error)}"
            ) from None

    def _ended_meanwhile(self, process: int) -> bool:
        """Asked between the slices of a wait for `process`'s word: the job's
        own watch goes on (`while_waiting`: a process found lost ends the wait
        with `JobLostError`); True once `process` has ended its `fit`."""
        if self.while_waiting is not None:
            self.while_waiting()
        return self.ended(process)

    def ended(self, process: int) -> bool:
        """True once `process` said in its heartbeat that its `fit` ended."""
        if process == self.process_id:
            return False
        beat = self.coordination.try_get(self.coordination.key("beat", process))
        try:
            return beat is not None and json.loads(beat).get("state") in {str(state) for state in FINAL_STATES}
        except (ValueError, AttributeError):
            return False

    def _open(self) -> None:
        with self._lock:
            self.closed = False
            self._lock.notify_all()

    def wait_open(self, lost: Callable[[], str | None]) -> None:
        """Training thread (the lock held): waits while a step is being agreed."""
        while self.closed and not lost():
            self._lock.wait(_HOLD_POLL_SECONDS)

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
    """

    def __init__(self, agreement: Agreement, local, progress, lost: Callable[[], str | None]):
        self.agreement = agreement
        self.local = local
        self.progress = progress
        self._lost = lost

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
        while (request := self.local.pop()) is not None:
            self.agreement.propose(request)

    # The training thread's side of the gate ----------------------------------------------

    def before_step(self, boundary: int) -> bool:
        """``on_train_batch_begin``, `boundary` steps done: waits while a
        step is being agreed, then counts the step begun.

        Returns:
            True if an agreed request is due at the end of this step (its
            batch-end hooks must run on the training thread).
        """
        if self.local.pending:
            self._propose_local()
        agreement = self.agreement
        with agreement._lock:
            agreement.wait_open(self._lost)
            agreement.dispatched = boundary + 1
        return agreement.due(boundary + 1)

    def acting(self) -> None:
        """The training thread is at a boundary where requests act (`acted` ends it)."""
        agreement = self.agreement
        with agreement._lock:
            agreement.acting_at = self.progress.boundary

    def acted(self) -> bool:
        """The training thread leaves its boundary: first waits for a step
        being agreed (this process may have said it acts here).

        Returns:
            True if a request came due here meanwhile (act again first).
        """
        agreement = self.agreement
        with agreement._lock:
            agreement.wait_open(self._lost)
            if agreement.due(self.progress.boundary):
                return True
            agreement.acting_at = None
        return False

    def pop(self) -> Request | None:
        return self.agreement.pop_due(self.progress.boundary)

    def get(self, timeout: float | None) -> Request | None:
        """While paused: proposes what arrives, returns what is due."""
        deadline = time.monotonic() + (timeout or 0)
        while True:
            if self.local.pending:
                self._propose_local()
            request = self.pop()
            if request is not None or self._lost() or time.monotonic() >= deadline:
                return request
            time.sleep(_HOLD_POLL_SECONDS)
