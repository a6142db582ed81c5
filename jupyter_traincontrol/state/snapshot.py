"""A model's state copied to host memory, written as a ``.keras`` file later.

`ModelSnapshot.take` runs on the training thread at a batch boundary: it
walks the model exactly as ``model.save`` does (Keras's own walk, so custom
layers, optimizers and their layout are those of a ``.keras`` file) with a
store that, instead of writing, keeps a host copy of every value it is
given. That is the whole cost to training: one copy of the weights and the
optimizer's variables (memcpy speed) and the model's config as JSON.

Each variable is read through a view of its buffer (no copy on CPU) and
copied once, into a host array of `SnapshotBuffers` when one is given:
the arrays of the previous snapshot, kept by the run and reused, so a
snapshot writes into memory that is already mapped. Allocating hundreds of
MB afresh for every snapshot (what ``variable.numpy()`` does) costs more
than the copy itself: the first touch of each page is a page fault, and
after a save has filled the page cache those took 0.5-1.8 s for 500 MB on
the benchmark machine, against 0.07-0.14 s to copy into mapped arrays. The
optimizer's variables are taken the same way: while the snapshot walks the
model, an optimizer that keeps Keras's own ``save_own_variables`` (the
variables in order, keys ``"0"``, ``"1"``...) hands the store its variables
instead of their ``numpy()`` copies; the file's layout is the same.

With ``copy=False`` it keeps views of the variables' buffers instead (no
memory, no time), for a checkpoint written while the training thread waits.

`ModelSnapshot.save(path)` then writes the ``.keras`` file from that copy,
on any thread, without touching the model (host arrays go to h5py as they
are, and the HDF5 image is streamed into the zip from its buffer: two
copies fewer than ``model.save``): the zip holds the same
``metadata.json``, ``config.json``, ``model.weights.h5`` and ``assets/`` as
``model.save`` would have written at the moment of the snapshot, and
`keras.models.load_model` opens it; a snapshot holding a NaN or an
infinity is not written (`NonFiniteStateError`). `CheckpointStore.save`
writes a snapshot exactly as it writes a model (``save(path)``).

Memory: a snapshot holds one host copy of the model's variables and the
optimizer's (for Adam, three times the weights) until it is dropped; with
`SnapshotBuffers`, the run keeps that copy from its first snapshot until it
calls `SnapshotBuffers.clear` (`SaveScheduler.close`, at `fit`'s end).

Example:

>>> snapshot = ModelSnapshot.take(model)          # doctest: +SKIP
>>> snapshot.save("later.keras")                  # any thread  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import zipfile
from typing import Any, Iterator

from ..checkpoint import NonFiniteStateError
from .arrays import is_finite

__all__ = ["ModelSnapshot", "SnapshotBuffers"]

class SnapshotBuffers:
    """Host arrays kept between the snapshots of one run, reused by the next.

    `ModelSnapshot.take` copies the n-th variable it meets into the n-th
    array kept here when its shape and dtype match (they do, unless the
    model changed shape), and allocates otherwise; `ModelSnapshot.release`
    hands its arrays back. A snapshot takes the arrays only while no other
    holds them: the run takes a snapshot only while no write is in flight.

    Attributes:
        nbytes: Bytes of the arrays kept now (0 while a snapshot holds them).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._arrays: list = []

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(array.nbytes for array in self._arrays)

    def borrow(self) -> list:
        """The arrays kept, now held by the caller (empty if none)."""
        with self._lock:
            arrays, self._arrays = self._arrays, []
        return arrays

    def give_back(self, arrays: list) -> None:
        """Keeps `arrays` for the next snapshot."""
        with self._lock:
            self._arrays = list(arrays)

    def clear(self) -> None:
        """Drops the arrays kept (the memory goes back at once)."""
        self.give_back([])


class ModelSnapshot:
    """The state ``model.save`` would write, copied to host memory.

    Attributes:
        nbytes: Bytes of array data held.
    """

    def __init__(self, config_json: str, metadata_json: str, entries: list, assets_dir: str | None,
                 arrays: list | None = None, buffers: SnapshotBuffers | None = None):
        self._config_json = config_json
        self._metadata_json = metadata_json
        self._entries = entries  # [(inner path, metadata, [(key, ndarray or value)])]
        self._assets_dir = assets_dir
        self._arrays = arrays or []  # the reusable arrays among the values, in order
        self._buffers = buffers
        self.nbytes = sum(getattr(value, "nbytes", 0) for _p, _m, items in entries for _k, value in items)

    @classmethod
    def take(cls, model, buffers: SnapshotBuffers | None = None, copy: bool = True) -> "ModelSnapshot":
        """Copies the state of `model` (call it on the training thread).

        Args:
            model: The model, its state up to date (`keras_state.sync_model_state`).
            buffers: Arrays to copy into, kept from the previous snapshot
                (and given back when this one is released). None: new
                arrays, dropped with the snapshot.
            copy: False: keep views of the variables' buffers instead of
                copies (no memory, no time), for a snapshot written while
                the training thread waits: the model must not change
                until the snapshot is saved and released.

        Raises:
            Exception: Whatever ``model.save`` would raise for a model that
                cannot be saved (an unserializable config, say).
        """
        from keras.src.saving import saving_lib

        config_json, metadata_json = saving_lib._serialize_model_as_json(model)
        recorder = _RecordingStore(buffers.borrow() if buffers is not None and copy else [], copy)
        assets = saving_lib.DiskIOStore(saving_lib._ASSETS_DIRNAME, archive=None, mode="w")
        try:
            with _optimizers_hand_variables(model):
                saving_lib._save_state(model, weights_store=recorder, assets_store=assets, inner_path="",
                                       visited_saveables=set())
        except BaseException:
            shutil.rmtree(assets.tmp_dir, ignore_errors=True)
            if buffers is not None and copy:
                buffers.give_back(recorder.arrays)
            raise
        return cls(config_json, metadata_json, recorder.entries, assets.tmp_dir, recorder.arrays,
                   buffers if copy else None)

    def non_finite(self) -> list[str]:
        """The variables holding a NaN or an infinity (``layers/dense/vars/0``);
        one vectorised pass over the copy's floating-point arrays."""
        return [f"{inner_path}/{key}".strip("/") for inner_path, _metadata, items in self._entries
                for key, value in items if not is_finite(value)]

    def save(self, path) -> None:
        """Writes the ``.keras`` file at `path` (a new file), from the copy.

        Raises:
            NonFiniteStateError: Before writing anything, if a variable
                holds a NaN or an infinity: no checkpoint of bad weights.
        """
        from keras.src.saving import saving_lib

        bad = self.non_finite()
        if bad:
            raise NonFiniteStateError(bad)

        with open(path, "wb") as handle, zipfile.ZipFile(handle, "w") as archive:
            archive.writestr(saving_lib._METADATA_FILENAME, self._metadata_json)
            archive.writestr(saving_lib._CONFIG_FILENAME, self._config_json)
            store = _WeightsStore(saving_lib._VARS_FNAME_H5, archive=archive, mode="w")
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
        """Drops the copy (and any assets folder), handing its arrays back
        to its `SnapshotBuffers` if it has one. Idempotent."""
        self._entries = []
        arrays, self._arrays = self._arrays, []
        if self._buffers is not None and arrays:
            self._buffers.give_back(arrays)
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


def _variable_view(variable) -> Any:
    """The value of a Keras variable as a numpy array, without a copy where
    the backend allows (CPU); None where there is no such view (another
    dtype than numpy's, a tensor on no host, an unknown backend)."""
    import keras
    import numpy as np

    backend = keras.backend.backend()
    value = variable.value
    try:
        if backend == "torch":
            view = value.detach().cpu().numpy()  # shares the CPU tensor's memory
        elif backend == "tensorflow":
            from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable

            if isinstance(value, BaseResourceVariable):  # not a distributed one: those read through their own path
                value = value.read_value()  # shares the variable's buffer (copy-on-write)
            view = np.asarray(value)  # a view of the tensor read on CPU
        elif backend in ("jax", "numpy"):
            view = np.asarray(value)  # a view of the buffer on CPU
        else:
            return None
    except (TypeError, ValueError, RuntimeError):  # bfloat16 and others numpy lacks
        return None
    if not isinstance(view, np.ndarray) or view.dtype == object or tuple(view.shape) != tuple(variable.shape):
        return None
    return view


@contextlib.contextmanager
def _optimizers_hand_variables(model) -> Iterator[None]:
    """While a snapshot walks `model`: its optimizers that keep Keras's own
    ``save_own_variables`` give the store their variables, in the same
    order under the same keys, rather than a fresh ``numpy()`` copy of each
    (which the store copies into its reused arrays instead). Restored after."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    patched = []
    seen = set()
    optimizer = getattr(model, "optimizer", None)
    while isinstance(optimizer, BaseOptimizer) and id(optimizer) not in seen:
        seen.add(id(optimizer))
        if type(optimizer).save_own_variables is BaseOptimizer.save_own_variables \
                and "save_own_variables" not in vars(optimizer):
            object.__setattr__(optimizer, "save_own_variables", _handing_variables(optimizer))
            patched.append(optimizer)
        optimizer = getattr(optimizer, "inner_optimizer", None)  # a LossScaleOptimizer's
    try:
        yield
    finally:
        for optimizer in patched:
            object.__delattr__(optimizer, "save_own_variables")


def _handing_variables(optimizer):
    def save_own_variables(store):
        for i, variable in enumerate(optimizer.variables):  # BaseOptimizer.save_own_variables, without numpy()
            store[str(i)] = variable
    return save_own_variables


def _make_recording_store():
    import numpy as np
    from keras.src.backend.common.variables import Variable as KerasVariable
    from keras.src.saving import saving_lib

    class RecordingStore(saving_lib.H5IOStore):
        """Takes what Keras's save walk writes, keeping host copies (no file).

        A Keras variable is copied once, through a view of its buffer, into
        the next of `kept` (arrays of an earlier snapshot) when its shape and
        dtype match, else into a new array; those arrays are `arrays`.
        """

        def __init__(self, kept: list, copy: bool = True):  # noqa: D401 - no file: H5IOStore's __init__ is not called
            self.mode = "w"
            self.entries: list = []
            self.arrays: list = []
            self._kept = kept
            self._copy = copy

        def make(self, path, metadata=None):
            self.entries.append((path, metadata, []))
            return self

        def __setitem__(self, key, value):
            view = _variable_view(value) if isinstance(value, KerasVariable) else None
            if view is None:
                copy = _host_copy(value)
            elif not self._copy:
                copy = view  # the model waits until this snapshot is written
            else:
                index = len(self.arrays)
                kept = self._kept[index] if index < len(self._kept) else None
                if kept is not None and kept.shape == view.shape and kept.dtype == view.dtype:
                    copy = kept
                else:
                    copy = np.empty(view.shape, view.dtype)
                np.copyto(copy, view)
                self.arrays.append(copy)
            self.entries[-1][2].append((key, copy))

        def __bool__(self):
            return True

        def close(self):
            pass

    return RecordingStore


_RECORDING_STORE = None


def _RecordingStore(kept: list, copy: bool = True):
    global _RECORDING_STORE
    if _RECORDING_STORE is None:
        _RECORDING_STORE = _make_recording_store()
    return _RECORDING_STORE(kept, copy)


def _make_weights_store():
    import time

    import numpy as np
    from keras.src import backend
    from keras.src.saving import saving_lib

    # The lean path leans on H5IOStore's internals (Keras 3.x up to at least
    # 3.15); where they differ, the store is Keras's own, unchanged.
    store_init = saving_lib.H5IOStore.__init__.__code__.co_names
    _LEAN_WRITE = hasattr(saving_lib.H5IOStore, "_create_h5_group") and all(
        name in store_init for name in ("h5_file", "io_file", "archive", "path_or_io", "_h5_entry_initialized"))

    class WeightsStore(saving_lib.H5IOStore):
        """Keras's ``.weights.h5`` writer, without its two extra copies.

        Host arrays go to h5py as they are (Keras converts every value with
        ``convert_to_numpy``, a copy of an array already on the host), and
        the finished HDF5 image is streamed into the zip from its buffer
        (Keras copies it out with ``getvalue()`` first). Same file.
        """

        def __setitem__(self, key, value):
            if not isinstance(value, np.ndarray) or backend.standardize_dtype(value.dtype) == "bfloat16" \
                    or not _LEAN_WRITE:
                return super().__setitem__(key, value)
            if not self._h5_entry_initialized:
                self._create_h5_group(self._h5_entry_path)
            self._h5_entry_group[key] = value

        def close(self):
            if not _LEAN_WRITE:
                return super().close()
            self.h5_file.close()
            if self.mode == "w" and self.archive:
                buffer = self.io_file.getbuffer()
                try:
                    info = zipfile.ZipInfo(str(self.path_or_io), date_time=time.localtime(time.time())[:6])
                    info.compress_type = self.archive.compression
                    info.external_attr = 0o600 << 16  # as ZipFile.writestr
                    info.file_size = len(buffer)
                    with self.archive.open(info, "w") as entry:
                        for start in range(0, len(buffer), 1 << 24):
                            entry.write(buffer[start:start + (1 << 24)])
                finally:
                    buffer.release()
            if self.io_file:
                self.io_file.close()

    return WeightsStore


_WEIGHTS_STORE = None


def _WeightsStore(*args, **kwargs):
    global _WEIGHTS_STORE
    if _WEIGHTS_STORE is None:
        _WEIGHTS_STORE = _make_weights_store()
    return _WEIGHTS_STORE(*args, **kwargs)
