"""Checkpoints: crash-safe saves, strict sidecars, the folder lock, restoring.

- `records`: what a checkpoint is in memory (`Checkpoint`, `TrainingPosition`)
  and the store's errors.
- `sidecar`: the sidecar's format and its strict reader of outside data.
- `folder`: holding the folder (its OS lock, the intent record, recovery).
- `store`: `CheckpointStore`, which writes, lists, prunes and restores the
  checkpoints of one run in one folder, holding that folder while it lives.
- `snapshot`: `ModelSnapshot`, a host copy of what ``model.save`` writes,
  written as a ``.keras`` file later, on any thread.
- `writer`: `CheckpointWriter`, one background write at a time.
"""

from .records import (
    Checkpoint,
    CheckpointDirBusyError,
    CheckpointDirChangedError,
    CheckpointDirError,
    CheckpointError,
    MalformedSidecarError,
    Restored,
    SkippedCheckpoint,
    TrainingPosition,
)
from .sidecar import DEFAULT_RUN, SIDECAR_FORMAT, TOOL, parse_sidecar, read_sidecar
from .snapshot import ModelSnapshot, SnapshotBuffers, sync_model_state
from .store import LOCK_FILE, CheckpointStore, assign_variables, copy_variables, restore_weights
from .writer import CheckpointWriter, WriterBusyError

__all__ = [
    "Checkpoint",
    "CheckpointDirBusyError",
    "CheckpointDirChangedError",
    "CheckpointDirError",
    "CheckpointError",
    "CheckpointStore",
    "CheckpointWriter",
    "DEFAULT_RUN",
    "LOCK_FILE",
    "MalformedSidecarError",
    "ModelSnapshot",
    "Restored",
    "SIDECAR_FORMAT",
    "SkippedCheckpoint",
    "SnapshotBuffers",
    "TOOL",
    "TrainingPosition",
    "assign_variables",
    "copy_variables",
    "parse_sidecar",
    "read_sidecar",
    "restore_weights",
    "sync_model_state",
    "WriterBusyError",
]
