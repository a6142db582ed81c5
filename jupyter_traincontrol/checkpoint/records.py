"""What a checkpoint is, in memory: where training stood, and the errors of the store."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

__all__ = [
    "DEFAULT_RUN",
    "LEGACY_LINE",
    "Checkpoint",
    "CheckpointDirBusyError",
    "CheckpointDirChangedError",
    "CheckpointDirError",
    "CheckpointError",
    "MalformedSidecarError",
    "NonFiniteStateError",
    "Restored",
    "SkippedCheckpoint",
    "TrainingPosition",
    "skipping_words",
]

#: The run name of a store given none.
DEFAULT_RUN = "run"
#: The line of the checkpoints written before sidecars carried a ``run_id``
#: (format 1): the release that wrote them counted them all as one line of
#: their run's name, and a run that resumes one carries that line on.
LEGACY_LINE = "0" * 32


class CheckpointError(OSError):
    """A checkpoint could not be written or read."""


class CheckpointDirError(CheckpointError):
    """The checkpoint folder cannot be used: a file, a dangling symlink,
    unwritable, or unsafe."""


class CheckpointDirBusyError(CheckpointDirError):
    """Another live run holds the checkpoint folder."""


class CheckpointDirChangedError(CheckpointDirError):
    """The checkpoint folder was replaced or removed under a live run."""


class NonFiniteStateError(CheckpointError):
    """The state to write holds NaN or infinite values: it is not written.

    Attributes:
        variables: The variables that do (``layers/dense/vars/0``).
    """

    def __init__(self, variables: list[str]):
        self.variables = list(variables)
        more = f" and {len(self.variables) - 3} more" if len(self.variables) > 3 else ""
        super().__init__(f"not written: the weights are not all finite ({', '.join(self.variables[:3])}{more} hold NaN or inf)")


class MalformedSidecarError(CheckpointError):
    """A file is not a sidecar of this tool: not JSON, or a field is wrong."""


@dataclasses.dataclass(frozen=True)
class TrainingPosition:
    """Where training stands, in Keras's terms.

    Attributes:
        epoch: Zero-based index of the epoch in progress (as `initial_epoch`).
        step_in_epoch: Batches of that epoch already trained.
        steps_per_epoch: Batches in an epoch, or None while unknown.
        global_step: Optimizer steps taken in all (`optimizer.iterations`).
        epoch_complete: True once every batch of `epoch` is trained.
    """

    epoch: int
    step_in_epoch: int
    steps_per_epoch: int | None = None
    global_step: int = 0
    epoch_complete: bool = False

    @property
    def resume_epoch(self) -> int:
        """The epoch a resumed `fit` continues in."""
        return self.epoch + 1 if self.epoch_complete else self.epoch

    @property
    def resume_step(self) -> int:
        """Batches of `resume_epoch` already trained."""
        return 0 if self.epoch_complete else self.step_in_epoch


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk.

    Attributes:
        path: The model part: a ``.keras`` or ``.pt`` file, or a ``.ckpt`` folder.
        info: The sidecar's content, as checked by `parse_sidecar`.
    """

    path: Path
    info: Mapping[str, Any]

    @property
    def sidecar(self) -> Path:
        """The JSON sidecar next to `path`."""
        return self.path.with_suffix(".json")

    @property
    def sequence(self) -> int:
        """Position in the folder's order: larger is newer."""
        return int(self.info["sequence"])

    @property
    def run(self) -> str:
        """The name of the run that wrote it."""
        return self.info["run"] if self.info.get("run") is not None else DEFAULT_RUN

    @property
    def lineage(self) -> str:
        """The line of runs it belongs to: the ``run_id`` of the first run of
        a chain of resumes (its sidecar's ``lineage``; without one, its own
        ``run_id``; without that, `LEGACY_LINE`). A run counts and prunes
        the checkpoints of its own line only."""
        return self.info.get("lineage") or self.info.get("run_id") or LEGACY_LINE

    @property
    def position(self) -> TrainingPosition:
        """Where training stood when the checkpoint was taken."""
        return TrainingPosition(
            epoch=int(self.info["epoch"]),
            step_in_epoch=int(self.info["step_in_epoch"]),
            steps_per_epoch=self.info.get("steps_per_epoch"),
            global_step=int(self.info.get("global_step") or 0),
            epoch_complete=bool(self.info["epoch_complete"]),
        )


@dataclasses.dataclass(frozen=True)
class SkippedCheckpoint:
    """A checkpoint that a resume passed over, and why."""

    path: Path
    reason: str


@dataclasses.dataclass(frozen=True)
class Restored:
    """What `CheckpointStore.restore_latest` did.

    Attributes:
        checkpoint: The checkpoint now loaded in the model, or None (then the
            model is as it was).
        skipped: Newer checkpoints that could not be used, newest first.
    """

    checkpoint: Checkpoint | None
    skipped: list[SkippedCheckpoint]


def skipping_words(count: int, unit: str) -> str:
    """What a resume says of the items of its epoch it draws without training:
    ``, skipping its first 3 batches (already trained)``; '' for none.

    Args:
        count: How many.
        unit: ``batch`` or ``item``.
    """
    if not count:
        return ""
    what = unit if count == 1 else (f"{unit}es" if unit.endswith("ch") else f"{unit}s")
    first = f"first {what}" if count == 1 else f"first {count} {what}"
    return f", skipping its {first} (already trained)"
