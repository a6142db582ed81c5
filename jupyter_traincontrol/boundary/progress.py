"""Where training stands, as its driver counts it: the numbers a boundary needs.

`TrainingProgress` is kept by whatever drives the training (a `fit`'s
callback, a `TrainLoop`) and by what acts at its boundaries, through its
own methods only, each named for what happened (`begin_epoch`,
`step_done`, `end_epoch`, `ends_here`, `resume_at`, ...): cheap enough
for every batch, the one writer of the counters and flags (checked by
``tests/test_architecture.py``), so an epoch is counted alike under every
driver. The fields are read freely. The boundary layer reads it to know where a checkpoint is taken
(`position`), and the run reads it as its `ProgressSource` when it publishes
(`progress`, a frozen `RunProgress`).
"""

from __future__ import annotations

from typing import Any

from ..checkpoint import TrainingPosition
from ..run.progress import RunProgress

__all__ = ["TrainingProgress"]


class TrainingProgress:
    """The counters of one training (one `fit`, one loop).

    Attributes:
        epoch: Zero-based index of the epoch in progress.
        epoch_begun: True once an epoch has begun (before, the record shows
            epoch 0, even for a resume that continues in a later one).
        epochs: The epochs asked for, or None.
        step: Batches of the epoch in progress trained.
        steps: Batches an epoch has, or None until known.
        boundary: Batch boundaries passed since training began.
        mid_epoch: True while commands are applied right after a training
            batch (rather than at an epoch's start or end, or in validation).
        stopped_mid_epoch: True once a stop or abort came before the
            epoch's last batch.
        in_validation: Between the epoch's first validation batch and its end.
        metrics: The latest logs.
        global_step: The optimizer's step as of the last checkpoint, resume
            or rollback (None until then).
        tunables: What ``set`` can change, and the current values.
        last_batch_ends_epoch: True where nothing of the epoch runs after
            its last batch (``fit``: its epoch-end work is the callbacks').
            False for a custom loop, whose body may go on (a scheduler's
            step, a validation): a checkpoint taken right after the last
            item resumes in that epoch, so that code still runs.
        pinned: While set, the position every checkpoint records: a resume
            that still draws the batches its checkpoint already trained
            holds that checkpoint's weights, whatever batch it is at.
        version: Changes whenever the counters do (the run compares it).
    """

    def __init__(self, epoch: int = 0, last_batch_ends_epoch: bool = True):
        self.epoch = epoch
        self.epoch_begun = False
        self.epochs: int | None = None
        self.step = 0
        self.steps: int | None = None
        self.boundary = 0
        self.mid_epoch = False
        self.stopped_mid_epoch = False
        self.in_validation = False
        self.metrics: dict[str, Any] = {}
        self.global_step: int | None = None
        self.tunables: dict[str, float | None] = {}
        self.last_batch_ends_epoch = last_batch_ends_epoch
        self.pinned: TrainingPosition | None = None
        self.version = 0

    def begin_epoch(self, epoch: int, steps: int | None = None) -> None:
        """Epoch `epoch` (zero-based) begins: its steps are counted from 0.

        Args:
            epoch: The epoch.
            steps: Its batches, if the driver knows them now; None keeps
                what is known (from the driver's start, or a first epoch).
        """
        self.epoch, self.step, self.stopped_mid_epoch, self.epoch_begun = epoch, 0, False, True
        if steps is not None:
            self.steps = steps
        self.version += 1

    def step_done(self, step: int, metrics: dict[str, Any] | None = None) -> None:
        """The boundary after a training step: `step` batches of the epoch
        trained; `metrics`, the step's logs (None or empty: kept as they are)."""
        self.boundary += 1
        self.step = step
        if metrics:
            self.metrics = metrics
        self.version += 1

    def end_epoch(self, metrics: dict[str, Any] | None = None) -> None:
        """The epoch ends (its validation too): an epoch's length is learned
        from the first that ran whole; `metrics`, its logs (None or empty:
        kept as they are)."""
        self.in_validation = False
        if self.steps is None and not self.stopped_mid_epoch:
            self.steps = self.step
        if metrics:
            self.metrics = dict(metrics)
        self.version += 1

    def plan(self, epochs: int | None, steps: int | None) -> None:
        """The epochs asked for and an epoch's batches, as known now (None: not known)."""
        self.epochs, self.steps = epochs, steps

    def batch_begins(self, batch: int, passed: int) -> None:
        """A step is about to train `batch` (zero-based) of the epoch;
        `passed`: the boundaries passed before it (some counted on a pool)."""
        if passed > self.boundary:
            self.boundary = passed
        self.step = batch

    def catch_up(self, passed: int, step: int) -> None:
        """Counts what a pool of threads saw ahead of the training thread:
        `passed` boundaries, `step` batches of the epoch."""
        if passed > self.boundary:
            self.boundary = passed
        if step > self.step:
            self.step = step

    def seen_on_pool(self, metrics: dict[str, Any] | None) -> None:
        """A step's logs, seen on a pool of threads (the caller holds its lock)."""
        if metrics:
            self.metrics = metrics
        self.version += 1

    def step_skipped(self) -> None:
        """A batch the resumed checkpoint already trained was drawn, not trained."""
        self.step += 1

    def set_metrics(self, metrics: dict[str, Any]) -> None:
        """The latest logs, as they are to be shown."""
        self.metrics = metrics

    def begin_validation(self) -> None:
        """The epoch's validation begins (its training batches are over)."""
        self.in_validation = True

    def acting(self, mid_epoch: bool) -> None:
        """Commands act at this boundary: `mid_epoch`, right after a
        training batch (else at an epoch's start or end, or in validation)."""
        self.mid_epoch = mid_epoch

    def ends_here(self) -> None:
        """Training ends at this boundary: an epoch it leaves before its
        last batch was stopped early (a checkpoint resumes inside it)."""
        if self.mid_epoch and not self.epoch_is_over:
            self.stopped_mid_epoch = True

    def ended_after_last_epoch(self) -> None:
        """Training ran to its end: the position is after its last epoch's
        end, but for an epoch a callback of the user's ended early."""
        self.mid_epoch = self.in_validation = False
        if self.steps is not None and self.step < self.steps:
            self.stopped_mid_epoch = True

    def resume_at(self, epoch: int, global_step: int | None, pinned: TrainingPosition | None = None) -> None:
        """A resume continues in `epoch` at optimizer step `global_step`;
        `pinned`: the position checkpoints record until `unpin` (see the class)."""
        self.epoch, self.global_step = epoch, global_step
        if pinned is not None:
            self.pinned = pinned

    def pin(self, position: TrainingPosition) -> None:
        """Until `unpin`, every checkpoint records `position`."""
        self.pinned = position

    def unpin(self) -> None:
        """Checkpoints record where training is again."""
        self.pinned = None

    def set_global_step(self, global_step: int | None) -> None:
        """The optimizer's step as of a checkpoint or a rollback."""
        self.global_step = global_step
        self.version += 1

    def show_tunables(self, values: dict[str, float | None]) -> None:
        """What ``set`` can change, with the current values."""
        self.tunables = values
        self.version += 1

    def progress(self) -> RunProgress:
        """The progress as the run shows it (epochs counted from 1)."""
        return RunProgress(
            epoch=self.epoch + 1 if self.epoch_begun else 0, epochs=self.epochs, step=self.step, steps=self.steps,
            global_step=self.global_step, metrics=dict(self.metrics), tunables=dict(self.tunables),
        )

    def position(self, global_step: int | None) -> TrainingPosition:
        """The position a checkpoint taken now records.

        Args:
            global_step: The optimizer's step count now.
        """
        if self.pinned is not None:
            return self.pinned
        if self.mid_epoch:
            complete = self.last_batch_ends_epoch and self.steps is not None and self.step >= self.steps
        else:
            complete = self.step > 0 and not self.stopped_mid_epoch
        return TrainingPosition(
            epoch=self.epoch,
            step_in_epoch=self.step,
            steps_per_epoch=self.steps,
            global_step=global_step,
            epoch_complete=complete,
        )

    @property
    def epoch_is_over(self) -> bool:
        """True once every batch of the epoch in progress was trained."""
        return self.steps is not None and self.step >= self.steps
