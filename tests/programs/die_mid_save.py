"""Saves one checkpoint and SIGKILLs itself just after a phase of the save.

Usage: python die_mid_save.py FOLDER SOURCE_KERAS_FILE PHASE [RUN]

The run resumes first (it loads nothing), so it continues the line of the
folder's newest checkpoint of its name, and its save prunes that line.

The model is a stand-in that writes the bytes of SOURCE_KERAS_FILE (no
TensorFlow needed).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from jupyter_traincontrol.checkpoint import CheckpointStore, TrainingPosition


class FileCopyModel:
    """A stand-in model whose `save` writes the bytes of a real .keras file."""

    def __init__(self, source: str):
        self.data = Path(source).read_bytes()

    def save(self, path):
        Path(path).write_bytes(self.data)


def die_after(target: str):
    def on_phase(phase: str) -> None:
        if phase == target:
            os.kill(os.getpid(), signal.SIGKILL)

    return on_phase


if __name__ == "__main__":
    folder, source, phase = sys.argv[1:4]
    run = sys.argv[4] if len(sys.argv) > 4 else None
    store = CheckpointStore(folder, keep=1, run=run, on_phase=die_after(phase))
    store.restore_latest(lambda checkpoint: None)  # a resumed run: its save prunes the line it continues
    store.save(FileCopyModel(source), TrainingPosition(epoch=0, step_in_epoch=1), reason="save")
    sys.exit(f"phase {phase!r} was never reached")
