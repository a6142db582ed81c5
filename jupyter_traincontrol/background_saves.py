"""Saves that do not hold training: snapshot on the training thread, write on another.

`BackgroundSaves` carries out the checkpoints a run's commands ask for:

- ``save``: at the batch boundary, `ModelSnapshot.take` copies the model's
  and optimizer's variables to host memory (the only time training is
  held); a `CheckpointWriter` thread writes the ``.keras`` file and its
  sidecar with the store's crash-safe protocol, flushes and prunes. The
  host arrays of that copy are kept (`SnapshotBuffers`) and reused by the
  next snapshot, until the end of `fit`: one host copy of the variables
  from the first ``save`` on, and no fresh memory to map at each save. The
  request is acknowledged (``applied`` with the file, or ``failed``) when
  the checkpoint is committed, so ``send --wait`` waits for the file.
- a ``save`` that arrives while a write is in flight waits, and every save
  waiting is merged into the next checkpoint, taken at the first batch
  boundary after the writer is free: at most one write (and one host copy
  of the variables) per run at a time.
- ``stop`` (and an interrupt's stop): waits for the write in flight, then
  writes the weights of this boundary with the training thread waiting (no
  copy: a snapshot of views of the variables, which do not change
  meanwhile), and returns when the checkpoint is on disk. Saves still
  waiting are answered with it.

With ``background=False`` every checkpoint is written on the training
thread, as ``model.save`` would be (no host copy: for short memory).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Callable, ContextManager, Protocol

from .checkpoint import (Checkpoint, CheckpointError, CheckpointWriter, ModelSnapshot, SnapshotBuffers, TrainingPosition,
                         sync_model_state)
from .commands import Request
from .lifecycle import RunLifecycle

__all__ = ["BackgroundSaves", "SaveGuard"]

Outcome = tuple[str, str]


class SaveGuard(Protocol):
    """What may refuse a checkpoint, and wraps taking one (`steering.Steering`)."""

    def refuse_checkpoint(self) -> str | None:
        """Why no checkpoint may be written now, or None."""

    def saving(self) -> ContextManager[None]:
        """Around taking a checkpoint of the model."""


class BackgroundSaves:
    """The checkpoints of one `fit`, written off the training thread.

    Args:
        model: The model being trained.
        lifecycle: The run (store, record, acknowledgements).
        position: Returns where training stands now (a `TrainingPosition`).
        boundary: Returns the number of batch boundaries passed: saves at
            the boundary of the last checkpoint (no batch trained since) are
            answered with that checkpoint.
        say: Prints one line for the user.
        background: Write ``save`` checkpoints on a writer thread. Defaults
            to True.
        resume_state: Returns the sidecar's ``resume_state`` for a
            checkpoint at a position (called on the training thread).
        guard: What may refuse a checkpoint and wraps taking one (the
            steering of a run: after a non-finite loss no checkpoint of
            non-finite weights is written; the model file gets the
            optimizer as the user built it). None: no such guard.
    """

    def __init__(self, model, lifecycle: RunLifecycle, position: Callable[[], TrainingPosition],
                 boundary: Callable[[], int], say: Callable[..., None], background: bool = True,
                 resume_state: Callable[[TrainingPosition], dict] | None = None, guard: "SaveGuard | None" = None):
        self.model = model
        self._guard = guard
        self.lifecycle = lifecycle
        self.background = background
        self._position = position
        self._boundary = boundary
        self._resume_state = resume_state or (lambda _position: None)
        self._taken_at: int | None = None  # the boundary of the last checkpoint taken
        self._last_outcome: Outcome | None = None  # and its outcome, once written
        self._say = say
        self._writer = CheckpointWriter(lifecycle.store, lifecycle.name or "run")
        self._buffers = SnapshotBuffers()  # the host copy, reused from one snapshot to the next
        self._lock = threading.RLock()  # re-entrant: defensive, a signal handler may land while it is held
        self._waiting: list[Request] = []  # saves not yet in a checkpoint being written
        self._in_flight: list[Request] = []  # saves the write in flight answers
        self._owner = threading.get_ident()  # the training thread
        self.due = False  # True while saves wait for the writer (checked at every boundary)
        self.last: Checkpoint | None = None

    # Asked by commands ------------------------------------------------------

    def request(self, request: Request) -> None:
        """Takes a ``save``; it is acknowledged when its checkpoint is committed."""
        with self._lock:
            if self._taken_at is not None and self._taken_at == self._boundary():
                if self._last_outcome is None:  # being written: answered with it
                    self._in_flight.append(request)
                    return
                outcome, message = self._last_outcome
                merged = f"merged with the save just taken (no batch trained since): {message}"
            else:
                self._waiting.append(request)
                self.due = True
                return
        self.lifecycle.log("info", merged[0].upper() + merged[1:])
        self.lifecycle.acknowledge(request, outcome, merged)

    def wait_for_writes(self) -> None:
        """Training thread, before the model changes without training (a
        rollback): writes the saves asked for so far, of the model as it is
        now, and waits until every one is committed or failed."""
        self._writer.wait()
        if self.due:
            self.start_due()
            self._writer.wait()

    def model_changed(self) -> None:
        """The model changed without training (a rollback): the next save is
        a new checkpoint, even at this boundary."""
        with self._lock:
            self._taken_at = None

    @property
    def ready(self) -> bool:
        """True when saves wait and the writer is free (cheap)."""
        return self.due and not self._writer.busy

    def start_due(self) -> None:
        """At a batch boundary: snapshots and starts writing if saves wait
        and the writer is free. Cheap when nothing waits."""
        if not self.due or self._writer.busy:
            return
        with self._lock:
            requests, self._waiting, self.due = self._waiting, [], False
        if not requests:
            return
        sync_model_state(self.model)  # JAX: the variables (and optimizer.iterations) of this boundary
        position = self._position()
        self._taken_at, self._last_outcome = self._boundary(), None
        refused = self._refused("save")
        if refused is not None or not self.background:
            self._last_outcome = refused or self._write_here(position, "save")
            self._answer(requests, *self._last_outcome)
            return
        try:
            with self._guarded():
                snapshot = ModelSnapshot.take(self.model, self._buffers)
        except Exception as error:
            self._last_outcome = self._failed(CheckpointError(f"Could not copy the model's state: {error}"))
            self._answer(requests, *self._last_outcome)
            return
        self._in_flight = requests
        self._writer.submit(snapshot, position, "save", self.lifecycle.metrics, self._written, self._resume_state(position))

    def write_now(self, reason: str) -> Outcome:
        """A checkpoint of this boundary, on disk when this returns (for
        ``stop``); saves waiting are answered with it too."""
        self._writer.wait()
        with self._lock:
            requests, self._waiting, self.due = self._waiting, [], False
        self._taken_at, self._last_outcome = self._boundary(), None
        sync_model_state(self.model)
        outcome = self._last_outcome = self._refused(reason) or self._write_here(self._position(), reason)
        self._answer(requests, *outcome)
        return outcome

    def close(self) -> None:
        """At the end of `fit`: waits for the write in flight and drops the
        host copy; saves still waiting are written now (on the training
        thread) or, from any other thread, answered as failed."""
        self._writer.wait()
        self._buffers.clear()
        with self._lock:
            requests, self._waiting, self.due = self._waiting, [], False
        if not requests:
            return
        if threading.get_ident() == self._owner:
            sync_model_state(self.model)
            self._answer(requests, *self._write_here(self._position(), "save"))
        else:
            self._answer(requests, "failed", "the run ended before this save could be written")

    # Writing -----------------------------------------------------------------

    def _refused(self, reason: str) -> Outcome | None:
        """The outcome of a checkpoint the guard refuses now, or None."""
        refused = self._guard.refuse_checkpoint() if self._guard is not None else None
        if refused is None:
            return None
        self.lifecycle.log("error", f"Checkpoint ({reason}) {refused}.")
        self._say(f"Checkpoint ({reason}) {refused}.", stream=sys.stderr)
        return "failed", f"checkpoint {refused}"

    def _guarded(self):
        return self._guard.saving() if self._guard is not None else contextlib.nullcontext()

    def _write_here(self, position: TrainingPosition, reason: str) -> Outcome:
        """Writes the model itself while the training thread waits."""
        sync_model_state(self.model)
        lifecycle = self.lifecycle
        try:
            resume_state = self._resume_state(position)
            with self._guarded():
                if self.background:  # flushing and pruning happen off the training thread
                    checkpoint = self._writer.write(self._waiting_source(), position, reason, lifecycle.metrics,
                                                    resume_state)
                else:
                    checkpoint = lifecycle.store.save(self.model, position, reason=reason, metrics=lifecycle.metrics,
                                                      run=lifecycle.name, resume_state=resume_state)
        except CheckpointError as error:
            return self._failed(error)
        return self._committed(checkpoint, position)

    def _waiting_source(self):
        """What the writer writes while the training thread waits: views of
        the variables (`ModelSnapshot` without a copy; its writer skips two
        copies ``model.save`` makes), or the model itself if they cannot be
        taken."""
        try:
            return ModelSnapshot.take(self.model, copy=False)
        except Exception:  # noqa: BLE001 - model.save then says what is wrong, as before
            return self.model

    def _written(self, checkpoint: Checkpoint | None, error: BaseException | None) -> None:
        """On the writer thread: a background write ended."""
        outcome = self._failed(error) if checkpoint is None else self._committed(checkpoint, checkpoint.position)
        with self._lock:
            requests, self._in_flight = self._in_flight, []
            self._last_outcome = outcome
        self._answer(requests, *outcome)
        self.lifecycle.publish(force=True)  # senders waiting with --wait see it now

    def _committed(self, checkpoint: Checkpoint, position: TrainingPosition) -> Outcome:
        lifecycle = self.lifecycle
        lifecycle.global_step = position.global_step
        lifecycle.add_checkpoint(checkpoint)
        self.last = checkpoint
        self._say(f"Checkpoint ({checkpoint.info.get('reason')}) written: {checkpoint.path}")
        return "applied", f"checkpoint written: {checkpoint.path}"

    def _failed(self, error: BaseException) -> Outcome:
        self.lifecycle.log("error", str(error))
        self._say(str(error), stream=sys.stderr)
        return "failed", str(error)

    def _answer(self, requests: list[Request], outcome: str, message: str) -> None:
        for request in requests:
            self.lifecycle.acknowledge(request, outcome, message)
