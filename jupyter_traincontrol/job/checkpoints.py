"""The checkpoint stores of a job's processes: process 0 writes, the others wait for it.

Weights are replicated across a data-parallel job, so one checkpoint is the
whole job's: `LeaderStore` (process 0) saves as usual, then says in the
key-value store what it wrote (or why it could not); `FollowerStore`
(every other process) runs the same ``model.save`` into a scratch file
(serializing global arrays takes collectives, in step with process 0),
then waits for process 0's word and returns its checkpoint. Each counts
its own saves: the n-th save of every process is the same checkpoint.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable

from ..checkpoint import Checkpoint, CheckpointError, CheckpointStore, Restored, SkippedCheckpoint
from .coordination import Coordination, first_line

__all__ = ["LeaderStore", "FollowerStore"]


class _JobStore:
    """What the boundary layer uses of a store, for a process of a job."""

    def __init__(self, store: CheckpointStore, coordination: Coordination):
        self.store = store
        self._kv = coordination
        self._saves = 0

    @property
    def directory(self) -> Path:
        return self.store.directory

    @property
    def run(self) -> str:
        return self.store.run

    def list(self) -> list[Checkpoint]:
        return self.store.list()

    def latest(self) -> Checkpoint | None:
        return self.store.latest()

    def phase(self, name: str) -> None:
        self.store.phase(name)

    def restore_latest(self, load: Callable[[Checkpoint], None],
                       on_skip: Callable[[SkippedCheckpoint], None] | None = None) -> Restored:
        return self.store.restore_latest(load, on_skip=on_skip)

    def _next_key(self) -> str:
        self._saves += 1
        return self._kv.key("saved", self._saves)


class LeaderStore(_JobStore):
    """Process 0's checkpoint store: saves as usual, then tells the others
    what it wrote (or why it could not)."""

    @property
    def held(self) -> bool:
        return self.store.held

    def acquire(self) -> "LeaderStore":
        self.store.acquire()
        return self

    def release(self) -> None:
        self.store.release()

    def save(self, source, *args, **kwargs) -> Checkpoint:
        key = self._next_key()
        try:
            checkpoint = self.store.save(source, *args, **kwargs)
        except CheckpointError as error:
            self._kv.set(key, json.dumps({"error": str(error)}))
            raise
        self._kv.set(key, json.dumps({"path": str(checkpoint.path)}))
        return checkpoint


class FollowerStore(_JobStore):
    """The store of a process other than 0: reads the job's checkpoints
    (resume), never writes or locks them; a save waits for process 0's.

    Args:
        store: The run's store (on the job's shared folder).
        coordination: The job's key-value store.
        model: A Keras model (its save takes part in the collectives), or
            None (a torch loop's state: process 0 reads it alone).
        save_timeout: Seconds to wait for process 0's checkpoint.
    """

    def __init__(self, store: CheckpointStore, coordination: Coordination, model, save_timeout: float):
        super().__init__(store, coordination)
        self._model = model
        self._save_timeout = save_timeout

    @property
    def held(self) -> bool:
        return False

    def acquire(self) -> "FollowerStore":
        return self

    def release(self) -> None:
        pass

    def save(self, source, *args, **kwargs) -> Checkpoint:
        key = self._next_key()
        if self._model is not None:
            # Serializing a Keras model's global arrays takes collectives: run the
            # same `model.save` as process 0 (into a scratch file), in step with it.
            with tempfile.TemporaryDirectory(prefix="traincontrol-follower-") as scratch:
                self._model.save(os.path.join(scratch, "model.keras"))
        try:
            said = json.loads(self._kv.wait_for(key, self._save_timeout, "process 0's checkpoint"))
        except Exception as error:
            raise CheckpointError(f"Process 0 did not write the job's checkpoint: {first_line(error)}") from None
        if "error" in said:
            raise CheckpointError(f"Process 0 could not write the job's checkpoint: {said['error']}")
        for checkpoint in self.store.list():
            if str(checkpoint.path) == said["path"]:
                return checkpoint
        raise CheckpointError(f"Process 0 wrote {said['path']}, but it is not readable here (is the folder shared?).")
