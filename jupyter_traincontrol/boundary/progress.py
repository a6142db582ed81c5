"""Where training stands, as its driver counts it: the numbers a boundary needs.

`TrainingProgress` is kept by whatever drives the training (a `fit`'s
callback, a `TrainLoop`) through the same few calls at its boundaries
(`begin_epoch`, `step_done`, `end_epoch`), cheap enough for every batch, so
an epoch is counted alike under every driver. The boundary layer reads it to know where a checkpoint is taken
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

    def __init__(self, epoch: int = 0):
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
        self.last_batch_ends_epoch = True
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
