"""Checkpoints: crash-safe saves, strict sidecars, the folder lock, restoring.

- `records`: what a checkpoint is in memory (`Checkpoint`, `TrainingPosition`)
  and the store's errors.
- `sidecar`: the sidecar's format and its strict reader of outside data.
- `store`: `CheckpointStore`, which writes, lists, prunes and restores the
  checkpoints of one run in one folder, holding that folder while it lives.
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
from .store import LOCK_FILE, CheckpointStore, restore_weights

__all__ = [
    "Checkpoint",
    "CheckpointDirBusyError",
    "CheckpointDirChangedError",
    "CheckpointDirError",
    "CheckpointError",
    "CheckpointStore",
    "DEFAULT_RUN",
    "LOCK_FILE",
    "MalformedSidecarError",
    "Restored",
    "SIDECAR_FORMAT",
    "SkippedCheckpoint",
    "TOOL",
    "TrainingPosition",
    "parse_sidecar",
    "read_sidecar",
    "restore_weights",
]
