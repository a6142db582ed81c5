"""Checkpoints that are never half-written: the crash-safe file protocol, without Keras.

- `records`: what a checkpoint is in memory (`Checkpoint`, `TrainingPosition`)
  and the store's errors.
- `sidecar`: the sidecar's format (its writer and its strict reader), and
  the model part it describes (a file or a folder, measured and removed).
- `folder`: holding the folder (its OS lock, the intent record, recovery),
  and which of its files are whose complete checkpoints (`scan`).
- `store`: `CheckpointStore`, the checkpoints of one run in one folder:
  written by the commit protocol (`Committer`: staging, renames with the
  sidecar last, flushing and pruning), listed and resumed.
- `writer`: `CheckpointWriter`, one background write at a time.
- `attachments`: files a checkpoint carries inside its model part (`Attached`).

What a checkpoint holds (a Keras model, a host copy of one) is written
through its ``save(path)``; `jupyter_traincontrol.state` has those.
"""

from .attachments import Attached, read_attachment
from .folder import LOCK_FILE
from .records import (
    Checkpoint,
    CheckpointDirBusyError,
    CheckpointDirChangedError,
    CheckpointDirError,
    CheckpointError,
    MalformedSidecarError,
    NonFiniteStateError,
    Restored,
    SkippedCheckpoint,
    TrainingPosition,
    skipping_words,
)
from .sidecar import DEFAULT_RUN, SIDECAR_FORMAT, TOOL, build_sidecar, parse_sidecar, read_sidecar
from .store import AUTOSAVE_REASON, AUTOSAVES_KEPT, CheckpointStore
from .writer import CheckpointWriter, WriterBusyError

__all__ = [
    "AUTOSAVE_REASON",
    "AUTOSAVES_KEPT",
    "Attached",
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
    "NonFiniteStateError",
    "Restored",
    "SIDECAR_FORMAT",
    "SkippedCheckpoint",
    "TOOL",
    "TrainingPosition",
    "WriterBusyError",
    "build_sidecar",
    "parse_sidecar",
    "read_attachment",
    "read_sidecar",
    "skipping_words",
]
