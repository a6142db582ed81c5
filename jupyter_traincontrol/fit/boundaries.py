"""The batch boundaries of one `fit`: counted on every step, acted on where commands wait.

`Boundaries` is what the hooks of `ControlCallback` do between two steps:

- ``on_train_batch_begin`` (always on the training thread): counts the
  step about to run (`TrainingProgress.boundary`: steps whose batch-end
  hooks have been passed) and, when something waits, makes sure the
  step's batch-end hooks run on the training thread (`BatchDispatch.hold`);
  in a job, it is where the training thread waits for an agreed step.
- ``on_train_batch_end`` on Keras's thread pool (nothing waits): the logs
  as progress, the loss into the run's history, the NaN check; a loss that
  is not finite is noted and the next boundary is made one on the training
  thread. Hooks of several steps may run at once there: a lock keeps the
  counts whole.
- ``on_train_batch_end`` on the training thread, at an epoch's begin and
  end, in validation: `at_boundary`, where what is noted is acted on.
  First the hooks still on the pool are waited for (`BatchDispatch.flush`),
  so every step up to this one has been counted and checked; then a loss
  that was not finite meets the NaN policy, then the commands act
  (`CommandActions.apply_pending`), and the dispatch is Keras's own again.

What the lag means for ``on_nan``: a non-finite loss seen on the pool is
acted on at the next boundary on the training thread, one step or a few
later (as many as the host had queued ahead of the device): ``stop`` ends
`fit` there, ``rollback`` loads the newest checkpoint there; no checkpoint
is taken in between (a command's boundary first waits for every earlier
step's check).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .dispatch import BatchDispatch

if TYPE_CHECKING:
    from ..boundary.actions import CommandActions
    from ..boundary.progress import TrainingProgress

__all__ = ["Boundaries"]


class Boundaries:
    """The per-step counting and the boundaries of one `fit`.

    Args:
        progress: The fit's counters.
        history: The run's history (``add_loss``).
        actions: Carries out the commands.
        dispatch: Where Keras calls the batch-end hooks.
        on_non_finite: Called on the training thread with ``(loss, epoch,
            batch)`` of the earliest step whose loss was not finite since
            the last boundary.
        gate: In a job, the agreed channel (``before_step``, ``acting``,
            ``acted``: `job.agreement.AgreedChannel`); None otherwise.
    """

    def __init__(self, progress: "TrainingProgress", history, actions: "CommandActions", dispatch: BatchDispatch,
                 on_non_finite, gate=None):
        self.progress = progress
        self.history = history
        self.actions = actions
        self.dispatch = dispatch
        self._on_non_finite = on_non_finite
        self._gate = gate
        self._lock = threading.Lock()  # the pool's hooks of several steps may run at once
        self._non_finite: list[tuple] = []  # (loss, epoch, batch), noted since the last boundary
        self._last_on_pool = 0  # the highest step of this epoch whose hook ran on the pool
        self.begun = 0  # steps begun in this fit

    def wanted(self) -> bool:
        """True while something waits for a boundary on the training thread (cheap)."""
        return bool(self._non_finite) or self.actions.pending

    # The hooks -----------------------------------------------------------------------

    def batch_began(self, batch: int) -> None:
        """``on_train_batch_begin``: the step about to run (training thread)."""
        progress = self.progress
        progress.batch_begins(batch, passed=self.begun)  # the hooks of the steps before it may have run on the pool
        gate = self._gate
        if gate is not None and gate.before_step(progress.boundary):
            self.dispatch.hold()  # an agreed command's step: its batch end on this thread
        self.begun = progress.boundary + 1
        if not self.dispatch.held and self.dispatch.asynchronous and self.wanted():
            self.dispatch.hold()  # came after the last hold was released

    def batch_ended(self, batch: int, logs) -> None:
        """``on_train_batch_end``, wherever Keras calls it."""
        dispatch = self.dispatch
        if dispatch.asynchronous and not dispatch.on_training_thread():
            self._seen_on_pool(batch, logs)
            return
        if dispatch.asynchronous:
            dispatch.flush()  # the steps before this one, counted and checked
        self.progress.step_done(batch + 1, logs)
        loss = logs.get("loss") if logs else None
        self.history.add_loss(loss)
        if loss is not None and loss - loss != 0:  # NaN or infinite (Keras made it a float already)
            self._note_non_finite(loss, batch)
        if self._non_finite or self.actions.pending:
            self._act(mid_epoch=True)
        elif dispatch.held:
            dispatch.release(self.wanted)

    def at_boundary(self, mid_epoch: bool = False, before_step: bool = False) -> None:
        """An epoch's begin or end, a validation batch: on the training
        thread, every step dispatched is done; what waits acts now (at an
        epoch's begin, `before_step`: a ``stop`` after the next step, see
        `CommandActions.apply_pending`; in a job, agreed requests come due at
        a step's end, and act where they do)."""
        self.catch_up()
        self._act(mid_epoch, before_step and self._gate is None)

    def catch_up(self) -> None:
        """Counts the steps whose batch-end hooks ran on the pool (after
        Keras waited for them, or `BatchDispatch.flush`)."""
        self.dispatch.flush()
        self.progress.catch_up(passed=self.begun, step=self._last_on_pool)

    def epoch_began(self) -> None:
        """A new epoch: its steps are counted from 0 (the pool has none of it yet)."""
        self._last_on_pool = 0

    # Inside ----------------------------------------------------------------------------

    def _seen_on_pool(self, batch: int, logs) -> None:
        loss = logs.get("loss") if logs else None
        progress = self.progress
        with self._lock:
            if batch + 1 > self._last_on_pool:
                self._last_on_pool = batch + 1
            progress.seen_on_pool(logs)
            self.history.add_loss(loss)
            if loss is not None and loss - loss != 0:
                self._non_finite.append((loss, progress.epoch, batch))
                self.dispatch.hold()

    def _note_non_finite(self, loss, batch: int) -> None:
        with self._lock:
            self._non_finite.append((loss, self.progress.epoch, batch))

    def _act(self, mid_epoch: bool, before_step: bool = False) -> None:
        gate = self._gate
        if gate is not None:
            gate.acting()  # a job: this process may say it acts here
        while True:
            with self._lock:
                noted, self._non_finite = self._non_finite, []
            if noted:  # the policy acts once for them all, on the earliest step's (the pool's threads may note out of order)
                self._on_non_finite(*min(noted, key=lambda entry: (entry[1], entry[2])))
            self.actions.apply_pending(mid_epoch=mid_epoch, before_step=before_step)
            if gate is None or not gate.acted():
                break
        self.dispatch.release(self.wanted)
