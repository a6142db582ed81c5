"""Any other state, through the user's own callables: ``save(folder)`` and ``load(folder)``.

For what the tool cannot copy itself (JAX pytrees, an Orbax checkpointer,
a ``tf.train.Checkpoint``), ``TrainLoop(save=..., load=...)`` gives two
functions: ``save(folder)`` writes the state's files into a new, empty
folder; ``load(folder)`` reads them back. The folder is the checkpoint's
model part (``ckpt-...-stepNNNNNN.ckpt``), written inside the store's
staging folder and renamed into place with the same crash-safe protocol as
any checkpoint. The callables run on the training thread, at a boundary
(the state cannot be copied by the tool, so there is no background write).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from ..checkpoint import Checkpoint, CheckpointError

__all__ = ["CallableState"]


class CallableState:
    """A custom loop's state, saved and loaded by the user's functions.

    Args:
        save: Writes the state's files into the folder it is given (a `Path`).
        load: Reads the state back from such a folder; raises if it cannot.
        step: Returns the loop's step count.
    """

    suffix = ".ckpt"
    #: The tool cannot copy this state: it is written on the training thread.
    snapshots = False

    def __init__(self, save: Callable[[Path], Any], load: Callable[[Path], Any], step: Callable[[], int | None]):
        for name, function in (("save", save), ("load", load)):
            if not callable(function):
                raise ValueError(f"{name}= must be a function of the checkpoint's folder, got {type(function).__name__}.")
        self._save = save
        self._load = load
        self._step = step

    def sync(self) -> None:
        """Nothing to sync: the user's functions read the state."""

    def step(self) -> int | None:
        return self._step()

    def save(self, path) -> None:
        """Creates the folder `path` and has the user's ``save`` fill it."""
        os.mkdir(path, 0o700)
        self._save(Path(path))
        if not any(Path(path).iterdir()):
            raise CheckpointError(f"save= wrote nothing into {path}; expected the state's files there.")

    def snapshot(self, buffers: Any = None) -> "CallableState":
        return self

    def views(self) -> "CallableState":
        return self

    def live(self) -> "CallableState":
        return self

    def all_finite(self) -> bool:
        """Unknown for a state only the user's functions read: after a
        non-finite loss, no checkpoint until a rollback."""
        return False

    def restore(self, checkpoint: Checkpoint) -> None:
        """Has the user's ``load`` read `checkpoint`'s folder.

        Raises:
            CheckpointError: If ``load`` raised (what it changed is its own).
        """
        try:
            self._load(Path(checkpoint.path))
        except Exception as error:
            raise CheckpointError(f"load= could not read {checkpoint.path.name}: {type(error).__name__}: {error}") from error
