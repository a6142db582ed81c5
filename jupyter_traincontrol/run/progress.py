"""How far a run has come, as a value: what the driver of the training reports.

The run does not keep the training's counters: whatever drives it (a
`fit`'s callback, a `TrainLoop`) keeps its own, and the run reads them as a
`RunProgress` through a `ProgressSource` when it publishes its record (at
most about twice a second), never per batch. The value is frozen: a reader
on another thread (the panel, the publisher) sees one consistent moment.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol

__all__ = ["RunProgress", "ProgressSource"]


@dataclasses.dataclass(frozen=True)
class RunProgress:
    """Where the training of a run stands.

    Attributes:
        epoch: The epoch in progress, from 1; 0 before the first began.
        epochs: The epochs asked for, or None if unknown.
        step: Batches done in the epoch in progress.
        steps: Batches an epoch has, or None until known.
        global_step: The optimizer's step count as of the last checkpoint,
            resume or rollback, or None.
        metrics: The latest logs.
        tunables: What ``set`` can change, and the current values.
    """

    epoch: int = 0
    epochs: int | None = None
    step: int = 0
    steps: int | None = None
    global_step: int | None = None
    metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tunables: Mapping[str, float | None] = dataclasses.field(default_factory=dict)


class ProgressSource(Protocol):
    """What the run reads progress from (the driver of the training).

    Attributes:
        version: Changes whenever progress changes (cheap to compare).
    """

    version: int

    def progress(self) -> RunProgress:
        """The progress now."""
