"""The checkpoint stores of a job's processes: process 0 writes, the others wait for it.

Weights are replicated across a data-parallel job, so one checkpoint is the
whole job's: `LeaderStore` (process 0) saves as usual, then says in the
coordination service's key-value store what it wrote (or why it could not);
`FollowerStore` (every other process) runs the same ``model.save`` into a
scratch file (serializing global arrays takes collectives, in step with
process 0), then waits for process 0's word and returns its checkpoint.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import TYPE_CHECKING

from .checkpoint import CheckpointError

if TYPE_CHECKING:
    from .distributed import Job

__all__ = ["LeaderStore", "FollowerStore"]


class LeaderStore:
    """Process 0's checkpoint store: saves as usual, then tells the others
    what it wrote (or why it could not)."""

    def __init__(self, store, job: Job):
        self._store = store
        self._job = job

    def __getattr__(self, name):
        return getattr(self._store, name)

    def save(self, *args, **kwargs):
        job = self._job
        job._saves += 1
        key = job._key("saved", job._saves)
        try:
            checkpoint = self._store.save(*args, **kwargs)
        except CheckpointError as error:
            job.client.key_value_set(key, json.dumps({"error": str(error)}))
            raise
        job.client.key_value_set(key, json.dumps({"path": str(checkpoint.path)}))
        return checkpoint


class FollowerStore:
    """The store of a process other than 0: reads the job's checkpoints
    (resume), never writes or locks them; a save waits for process 0's."""

    def __init__(self, store, job: Job):
        self._store = store
        self._job = job

    def __getattr__(self, name):
        return getattr(self._store, name)

    def acquire(self):
        return self

    def release(self) -> None:
        pass

    @property
    def held(self) -> bool:
        return False

    def save(self, model, *args, **kwargs):
        job = self._job
        job._saves += 1
        # Serializing the model's global arrays takes collectives: run the
        # same `model.save` as process 0 (into a scratch file), in step with it.
        with tempfile.TemporaryDirectory(prefix="traincontrol-follower-") as scratch:
            model.save(os.path.join(scratch, "model.keras"))
        try:
            said = json.loads(job.wait_for(job._key("saved", job._saves), job.save_timeout, "process 0's checkpoint"))
        except Exception as error:
            raise CheckpointError(f"Process 0 did not write the job's checkpoint: {_first_line(error)}") from None
        if "error" in said:
            raise CheckpointError(f"Process 0 could not write the job's checkpoint: {said['error']}")
        for checkpoint in self._store.list():
            if str(checkpoint.path) == said["path"]:
                return checkpoint
        raise CheckpointError(f"Process 0 wrote {said['path']}, but it is not readable here (is the folder shared?).")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
