"""The checkpoints of one training: taken at a boundary, written without holding training.

`SaveScheduler` carries out every checkpoint a run's commands ask for (in
the background or not, a ``save`` or a ``stop``'s):

- ``save``: at the batch boundary, a snapshot (`state.ModelSnapshot` for a
  Keras model) takes the model's and optimizer's variables (the only time
  training is held: on TensorFlow and JAX without a copy, on torch a host
  copy); a `CheckpointWriter` thread writes the ``.keras`` file and its
  sidecar with the store's crash-safe protocol, flushes and prunes. A host
  copy's arrays are kept (`SnapshotBuffers`) and reused by the next
  snapshot, until the end of `fit`: no fresh memory to map at each save.
  The request is acknowledged (``applied`` with the file, or ``failed``) when
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

Autosave (``autosave=SECONDS``): `tick_autosave`, called by the run's own
thread twice a second, counts the seconds the run spends ``running`` since
its newest checkpoint of any kind; past `SECONDS` it marks a checkpoint
due, taken at the next boundary as a ``save`` is (reason ``autosave``, in
the background where saves are), unless no batch was trained since the
last checkpoint. The boundary pays nothing more: it already checks `due`.

What may refuse a checkpoint, and what a checkpoint records of steering,
is a `SavePolicy` (the run's steering registers itself as one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from typing import Callable, ContextManager, Mapping, NamedTuple, Protocol

from ..checkpoint import AUTOSAVE_REASON, Attached, Checkpoint, CheckpointError, CheckpointStore, CheckpointWriter, TrainingPosition
from ..protocol import Request
from ..state.snapshot import SnapshotBuffers
from .port import RunPort, Trained
from .progress import TrainingProgress

__all__ = ["SaveScheduler", "SavePolicy", "SaveTerms", "Outcome"]

Outcome = tuple[str, str]  # ("applied" | "ignored" | "failed", a sentence)


class SaveTerms(NamedTuple):
    """What a `SavePolicy` says of a checkpoint about to be taken.

    Attributes:
        refused: Why it may not be written now, or None.
        tunables: The values steered so far, for the sidecar (a resume sets
            them again).
        around: Wraps taking it (the optimizer as the user built it).
    """

    refused: str | None
    tunables: Mapping[str, float]
    around: ContextManager[None]


class SavePolicy(Protocol):
    """What may refuse a checkpoint, wraps taking one, and what it records
    of steering (`steering.Steering`)."""

    def terms(self) -> SaveTerms:
        """The terms of a checkpoint taken now."""


_NO_POLICY = SaveTerms(None, {}, contextlib.nullcontext())


class SaveScheduler:
    """The checkpoints of one training, written off the training thread.

    Args:
        trained: What a checkpoint holds (`state.KerasState` of the model).
        run: The run (journal, store, record).
        progress: Where training stands: a checkpoint's position, and saves
            at the boundary of the last checkpoint (no batch trained since)
            are answered with that checkpoint.
        say: Prints one line for the user.
        background: Write ``save`` checkpoints on a writer thread. Defaults
            to True.
        resume_state: Returns the sidecar's ``resume_state`` for a
            checkpoint at a position (called on the training thread).
        store: Where checkpoints are written. Defaults to the run's (a job
            gives its own).
        autosave: Seconds of training after the newest checkpoint at which
            an autosave is taken; None or 0: never. Defaults to None.
        attachments: Returns the files a checkpoint taken now carries in its
            model part (`checkpoint.Attached`; called on the training
            thread, with `resume_state`): the state of a `fit`'s callbacks.
    """

    def __init__(self, trained: Trained, run: RunPort, progress: TrainingProgress, say: Callable[..., None],
                 background: bool = True, resume_state: Callable[[TrainingPosition], Mapping | None] | None = None,
                 store: CheckpointStore | None = None, autosave: float | None = None,
                 attachments: Callable[[], Mapping] | None = None):
        self.trained = trained
        self.policy: SavePolicy | None = None  # set by the steering of the run, if it steers
        self.run = run
        self.store = store or run.store
        self.background = background
        self._progress = progress
        self._resume_state = resume_state or (lambda _position: None)
        self._attachments = attachments
        self._taken_at: int | None = None  # the boundary of the last checkpoint taken
        self._taken_auto = False  # and whether it is an autosave
        self._last_outcome: Outcome | None = None  # and its outcome, once written
        self._say = say
        self._writer = CheckpointWriter(self.store, run.name or "run", on_idle=self._writer_idle)
        self._buffers = SnapshotBuffers()  # the host copy, reused from one snapshot to the next
        self._lock = threading.RLock()  # re-entrant: defensive, a signal handler may land while it is held
        self._waiting: list[Request] = []  # saves not yet in a checkpoint being written
        self._in_flight: list[Request] = []  # saves the write in flight answers
        self._owner = threading.get_ident()  # the training thread
        self.due = False  # True while saves wait for the writer (checked at every boundary)
        self.autosave_every = autosave or None
        self._trained_for = 0.0  # seconds spent running since the newest checkpoint (autosave's clock)
        self._last_tick: float | None = None
        self._autosave_due = False
        self.last: Checkpoint | None = None
        #: Called (any thread) when saves that waited can start: the front end
        #: makes its next boundary one where commands act (`fit.dispatch`).
        self.wake: Callable[[], None] = lambda: None

    # Asked by commands ------------------------------------------------------

    def request(self, request: Request) -> None:
        """Takes a ``save``; it is acknowledged when its checkpoint is committed."""
        with self._lock:
            # merged with a checkpoint of this boundary, unless that is an autosave (kept apart from `keep`)
            if self._taken_at is not None and self._taken_at == self._progress.boundary and not self._taken_auto:
                if self._last_outcome is None:  # being written: answered with it
                    self._in_flight.append(request)
                    return
                outcome, message = self._last_outcome
                merged = f"merged with the save just taken (no batch trained since): {message}"
            else:
                self._waiting.append(request)
                self.due = True
                return
        self.run.journal.log("info", merged[0].upper() + merged[1:])
        self.run.journal.acknowledge(request, outcome, merged)

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

    def tick_autosave(self, running: bool) -> None:
        """Counts the seconds since the last call if the run was `running`;
        marks an autosave due once they reach `autosave_every` (the run's
        thread, about twice a second)."""
        now = time.monotonic()
        last, self._last_tick = self._last_tick, now
        if self.autosave_every is None or last is None or not running:
            return
        self._trained_for += now - last
        if self._trained_for < self.autosave_every or self._autosave_due:
            return
        with self._lock:
            self._autosave_due = self.due = True
        self.wake()

    @property
    def ready(self) -> bool:
        """True when saves wait and the writer is free (cheap)."""
        return self.due and not self._writer.busy

    def start_due(self) -> None:
        """At a batch boundary (the state synced): snapshots and starts
        writing if saves wait and the writer is free. Cheap when nothing waits."""
        if not self.due or self._writer.busy:
            return
        with self._lock:
            requests, self._waiting, self.due = self._waiting, [], False
            autosave, self._autosave_due = self._autosave_due, False
        if autosave:
            self._trained_for = 0.0  # the next one is an interval after this one, written or not
            if not requests and self._taken_at == self._progress.boundary:
                return  # no batch trained since the last checkpoint
        if not requests and not autosave:
            return
        reason = "save" if requests else AUTOSAVE_REASON
        self._taken_at, self._taken_auto, self._last_outcome = self._progress.boundary, not requests, None
        terms = self._terms()
        if terms.refused is not None or not self.background:
            self._last_outcome = self._write_here(reason, terms)
            self._answer(requests, *self._last_outcome)
            return
        position = self._progress.position(None)
        try:
            with terms.around:
                snapshot = self.trained.snapshot(self._buffers)
        except Exception as error:
            self._last_outcome = self._failed(CheckpointError(f"Could not copy the model's state: {error}"))
            self._answer(requests, *self._last_outcome)
            return
        step = self.trained.step_later(snapshot)  # the step the snapshot took: no second read
        self._in_flight = requests
        at = _with_step(position, step) if position is not self._progress.pinned else position
        self._writer.submit(self._attached(snapshot), at, reason, self._progress.metrics, self._written,
                            self._resume_state(position), terms.tunables)

    def write_now(self, reason: str) -> Outcome:
        """A checkpoint of this boundary (the state synced), on disk when
        this returns (for ``stop``); saves waiting are answered with it too."""
        self._writer.wait()
        with self._lock:
            requests, self._waiting, self.due, self._autosave_due = self._waiting, [], False, False
        self._taken_at, self._taken_auto, self._last_outcome = self._progress.boundary, False, None
        terms = self._terms()
        outcome = self._last_outcome = self._write_here(reason, terms)
        if requests:
            self._answer(requests, *outcome)
        return outcome

    def write_at_end(self) -> None:
        """The checkpoint of a `fit` that ran to its end (see `write_end`),
        at its position after its last epoch's end."""
        self._progress.ended_after_last_epoch()
        self.write_end("fit")

    def write_end(self, what: str) -> None:
        """The last checkpoint (reason ``end``) of a training that ran to its
        end, on disk when this returns. A failure is said, never raised: the
        training is done all the same (a model Keras cannot serialize).

        Args:
            what: What ran to its end, for the message: ``fit``, ``loop``.
        """
        try:
            self.trained.sync()
            self.write_now("end")
        except Exception as error:
            message = f"Could not write the checkpoint at the end of the {what}: {error}"
            self.run.journal.log("error", message)
            self._say(message, stream=sys.stderr)

    def close(self) -> None:
        """At the end of training: waits for the write in flight and drops
        the host copy; saves still waiting are written now (on the training
        thread) or, from any other thread, answered as failed."""
        self._writer.wait()
        self._buffers.clear()
        with self._lock:
            requests, self._waiting, self.due, self._autosave_due = self._waiting, [], False, False
        try:
            if not requests:
                return
            if threading.get_ident() == self._owner:
                self.trained.sync()
                terms = self._terms()
                self._answer(requests, *self._write_here("save", terms))
            else:
                self._answer(requests, "failed", "the run ended before this save could be written")
        finally:
            self._writer.close()  # its thread ends with the training

    # Writing -----------------------------------------------------------------

    def _terms(self) -> SaveTerms:
        return self.policy.terms() if self.policy is not None else _NO_POLICY

    def _refused(self, reason: str, terms: SaveTerms) -> Outcome | None:
        """The outcome of a checkpoint the policy refuses now, or None."""
        if terms.refused is None:
            return None
        self.run.journal.log("error", f"Checkpoint ({reason}) {terms.refused}.")
        self._say(f"Checkpoint ({reason}) {terms.refused}.", stream=sys.stderr)
        return "failed", f"checkpoint {terms.refused}"

    def _write_here(self, reason: str, terms: SaveTerms) -> Outcome:
        """Writes the live state of this boundary while the training thread
        waits, unless the policy refuses it (`_refused`)."""
        refused = self._refused(reason, terms)
        if refused is not None:
            return refused
        position = self._progress.position(self.trained.step())
        metrics = self._progress.metrics
        try:
            resume_state = self._resume_state(position)
            with terms.around:
                if self.background:  # flushing and pruning on the writer's thread, which this one waits for
                    checkpoint = self._writer.write(self._attached(self.trained.views()), position, reason, metrics,
                                                    resume_state, terms.tunables)
                else:
                    checkpoint = self.store.save(self._attached(self.trained.live()), position, reason=reason,
                                                 metrics=metrics, run=self.run.name, resume_state=resume_state,
                                                 tunables=terms.tunables)
        except CheckpointError as error:
            return self._failed(error)
        return self._committed(checkpoint, position)

    def _attached(self, source):
        """`source` with the attachments of a checkpoint taken now, if any."""
        files = self._attachments() if self._attachments is not None else None
        return Attached(source, files) if files else source

    def _writer_idle(self) -> None:
        if self.due:
            self.wake()  # saves asked for during the write: the next boundary takes them

    def _written(self, checkpoint: Checkpoint | None, error: BaseException | None) -> None:
        """On the writer thread: a background write ended."""
        outcome = self._failed(error) if checkpoint is None else self._committed(checkpoint, checkpoint.position)
        with self._lock:
            requests, self._in_flight = self._in_flight, []
            self._last_outcome = outcome
        self._answer(requests, *outcome)
        self.run.publish(force=True)  # senders waiting with --wait see it now

    def _committed(self, checkpoint: Checkpoint, position: TrainingPosition) -> Outcome:
        self._trained_for = 0.0  # autosave counts from the newest checkpoint, of any kind
        self._progress.set_global_step(position.global_step)
        self.run.add_checkpoint(checkpoint)
        self.last = checkpoint
        self._say(f"Checkpoint ({checkpoint.info.get('reason')}) written: {checkpoint.path}")
        return "applied", f"checkpoint written: {checkpoint.path}"

    def _failed(self, error: BaseException) -> Outcome:
        self.run.journal.log("error", str(error))
        self._say(str(error), stream=sys.stderr)
        return "failed", str(error)

    def _answer(self, requests: list[Request], outcome: str, message: str) -> None:
        for request in requests:
            self.run.journal.acknowledge(request, outcome, message)


def _with_step(position: TrainingPosition, step: Callable[[], int | None]) -> Callable[[], TrainingPosition]:
    """`position` with the optimizer step `step` gives, when called (by the writer)."""
    return lambda: dataclasses.replace(position, global_step=step())
