"""A model's state copied to host memory, written as a ``.keras`` file later.

`ModelSnapshot.take` runs on the training thread at a batch boundary: it
walks the model exactly as ``model.save`` does (Keras's own walk, so custom
layers, optimizers and their layout are those of a ``.keras`` file) with a
store that, instead of writing, keeps a host copy of every value it is
given. That is the whole cost to training: one copy of the weights and the
optimizer's variables (memcpy speed) and the model's config as JSON.

`ModelSnapshot.save(path)` then writes the ``.keras`` file from that copy,
on any thread, without touching the model: the zip holds the same
``metadata.json``, ``config.json``, ``model.weights.h5`` and ``assets/`` as
``model.save`` would have written at the moment of the snapshot, and
`keras.models.load_model` opens it. It has a ``save(path)`` method like a
model's, so `CheckpointStore.save` writes a snapshot exactly as it writes
a model (same staging, renames and intent record).

Memory: a snapshot holds one host copy of the model's variables and the
optimizer's (for Adam, three times the weights) until it is dropped.

Example:

>>> snapshot = ModelSnapshot.take(model)          # doctest: +SKIP
>>> snapshot.save("later.keras")                  # any thread  # doctest: +SKIP
"""

from __future__ import annotations

import shutil
import zipfile
from typing import Any

__all__ = ["ModelSnapshot", "sync_model_state"]


def sync_model_state(model) -> None:
    """Brings the model's variables up to date before they are read.

    On the JAX backend, `fit` keeps the state outside the model's variables
    in the middle of an epoch (``Callback.model`` syncs it, a model reference
    held elsewhere does not): a save from that reference would write the
    weights of the epoch's start. Does nothing on other backends.
    """
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()


class ModelSnapshot:
    """The state ``model.save`` would write, copied to host memory.

    Attributes:
        nbytes: Bytes of array data held.
    """

    def __init__(self, config_json: str, metadata_json: str, entries: list, assets_dir: str | None):
        self._config_json = config_json
        self._metadata_json = metadata_json
        self._entries = entries  # [(inner path, metadata, [(key, ndarray or value)])]
        self._assets_dir = assets_dir
        self.nbytes = sum(getattr(value, "nbytes", 0) for _p, _m, items in entries for _k, value in items)

    @classmethod
    def take(cls, model) -> "ModelSnapshot":
        """Copies the state of `model` (call it on the training thread).

        Raises:
            Exception: Whatever ``model.save`` would raise for a model that
                cannot be saved (an unserializable config, say).
        """
        from keras.src.saving import saving_lib

        sync_model_state(model)
        config_json, metadata_json = saving_lib._serialize_model_as_json(model)
        recorder = _RecordingStore()
        assets = saving_lib.DiskIOStore(saving_lib._ASSETS_DIRNAME, archive=None, mode="w")
        try:
            saving_lib._save_state(model, weights_store=recorder, assets_store=assets, inner_path="", visited_saveables=set())
        except BaseException:
            shutil.rmtree(assets.tmp_dir, ignore_errors=True)
            raise
        return cls(config_json, metadata_json, recorder.entries, assets.tmp_dir)

    def save(self, path) -> None:
        """Writes the ``.keras`` file at `path` (a new file), from the copy."""
        from keras.src.saving import saving_lib

        with open(path, "wb") as handle, zipfile.ZipFile(handle, "w") as archive:
            archive.writestr(saving_lib._METADATA_FILENAME, self._metadata_json)
            archive.writestr(saving_lib._CONFIG_FILENAME, self._config_json)
            store = saving_lib.H5IOStore(saving_lib._VARS_FNAME_H5, archive=archive, mode="w")
            try:
                for inner_path, metadata, items in self._entries:
                    store.make(inner_path, metadata=metadata)
                    for key, value in items:
                        store[key] = value
            except BaseException:
                store.archive = None  # do not add a half-made weights file
                raise
            finally:
                store.close()
            if self._assets_dir is not None:
                saving_lib._write_to_zip_recursively(
                    archive, f"{self._assets_dir}/{saving_lib._ASSETS_DIRNAME}", saving_lib._ASSETS_DIRNAME
                )

    def release(self) -> None:
        """Drops the copy (and any assets folder). Idempotent."""
        self._entries = []
        assets, self._assets_dir = self._assets_dir, None
        if assets is not None:
            shutil.rmtree(assets, ignore_errors=True)


def _host_copy(value: Any) -> Any:
    """A host copy of `value` that later training cannot change."""
    import keras
    import numpy as np

    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return value
    fresh = isinstance(value, np.ndarray) or np.isscalar(value)  # read by the saveable itself (``.numpy()``)
    array = value if fresh else keras.ops.convert_to_numpy(value)
    if keras.backend.backend() == "tensorflow":
        return array  # a read of a TF variable is a copy already (copy-on-write buffers)
    return np.array(array, copy=True)  # torch and JAX reads may share the variable's buffer


def _make_recording_store():
    from keras.src.saving import saving_lib

    class RecordingStore(saving_lib.H5IOStore):
        """Takes what Keras's save walk writes, keeping host copies (no file)."""

        def __init__(self):  # noqa: D401 - no file: H5IOStore's __init__ is not called
            self.mode = "w"
            self.entries: list = []

        def make(self, path, metadata=None):
            self.entries.append((path, metadata, []))
            return self

        def __setitem__(self, key, value):
            self.entries[-1][2].append((key, _host_copy(value)))

        def __bool__(self):
            return True

        def close(self):
            pass

    return RecordingStore


_RECORDING_STORE = None


def _RecordingStore():
    global _RECORDING_STORE
    if _RECORDING_STORE is None:
        _RECORDING_STORE = _make_recording_store()
    return _RECORDING_STORE()
