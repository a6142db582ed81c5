"""Keras's ``model.weights.h5`` writer, made fit for a background thread: `weights_store`.

`weights_store(archive, name)` returns a subclass of Keras's ``H5IOStore``
that writes the same HDF5 file into the ``.keras`` zip, with less of the
interpreter lock and two copies fewer:

- host arrays go to HDF5 as they are (Keras converts every value with
  ``convert_to_numpy``, a copy of an array already on the host);
- the file is built in a `SparseImage`, not an ``io.BytesIO``: a large
  array's dataset is allocated and the array placed there, so neither
  h5py nor a growing buffer copies it with the lock held;
- the finished image is streamed into the zip in slices, straight from
  the arrays (Keras copies it out with ``getvalue()`` first); the CRC and
  the file write of each slice release the lock, and ``pace`` (the
  writer's) is called with the seconds each slice took.

The lean path leans on ``H5IOStore``'s internals (Keras 3.x up to at least
3.15; the class comes from `keras_internals.h5_io_store_class`); where they
differ, the store is Keras's own, unchanged.
"""

from __future__ import annotations

import time
import zipfile

from . import keras_internals
from .sparse_image import SparseImage, allocate, placeable

__all__ = ["weights_store"]

#: Bytes handed on at a time (to h5py, or to the zip) when an array is written.
_SLICE_BYTES = 4 << 20
#: Arrays this large or larger are placed in the image rather than copied into it.
_PLACED_BYTES = 64 << 10

_STORE_CLASS = None


def weights_store(archive, name: str):
    """A store writing the weights file `name` (``model.weights.h5``: the
    caller's `keras_internals.keras_file_names`) into `archive` (a zip open
    for writing): Keras's ``H5IOStore`` interface (``make``, ``store[key] =
    value``, ``close``), and a ``pace`` attribute (None: no pauses)."""
    global _STORE_CLASS
    if _STORE_CLASS is None:
        _STORE_CLASS = _make_store_class()
    return _STORE_CLASS(name, archive=archive, mode="w")


def _make_store_class():
    import h5py
    import numpy as np
    from keras import backend

    H5IOStore = keras_internals.h5_io_store_class()

    store_init = H5IOStore.__init__.__code__.co_names
    lean = all(hasattr(H5IOStore, name) for name in ("_create_h5_group", "_get_h5_file")) and all(
        name in store_init for name in ("h5_file", "io_file", "archive", "path_or_io", "_h5_entry_initialized"))

    class WeightsStore(H5IOStore):
        pace = None

        def _get_h5_file(self, path_or_io, mode=None):
            if not lean or (mode or self.mode) != "w" or not self.archive:
                return super()._get_h5_file(path_or_io, mode)
            self.io_file = SparseImage()
            return h5py.File(self.io_file, mode="w")

        def __setitem__(self, key, value):
            if not lean or not isinstance(value, np.ndarray) or backend.standardize_dtype(value.dtype) == "bfloat16":
                return super().__setitem__(key, value)
            if not self._h5_entry_initialized:
                self._create_h5_group(self._h5_entry_path)
            group = self._h5_entry_group
            if value.nbytes >= _PLACED_BYTES and placeable(value):
                self.io_file.place(allocate(group, key, value), value)
            elif value.nbytes <= _SLICE_BYTES or value.ndim == 0 or value.shape[0] < 2:
                group[key] = value
            else:  # an array the image cannot place (booleans, say): the same dataset, in slices
                dataset = group.create_dataset(key, shape=value.shape, dtype=value.dtype)
                rows = max(1, _SLICE_BYTES // max(1, value.nbytes // value.shape[0]))
                for start in range(0, value.shape[0], rows):
                    begin = time.perf_counter()
                    dataset[start:start + rows] = value[start:start + rows]
                    self._paced(time.perf_counter() - begin)

        def _paced(self, seconds):
            if self.pace is not None:
                self.pace(seconds)

        def close(self):
            if not lean:
                return super().close()
            self.h5_file.close()
            image, self.io_file = self.io_file, None
            try:
                if self.mode == "w" and self.archive:
                    info = zipfile.ZipInfo(str(self.path_or_io), date_time=time.localtime(time.time())[:6])
                    info.compress_type = self.archive.compression
                    info.external_attr = 0o600 << 16  # as ZipFile.writestr
                    info.file_size = image.size
                    with self.archive.open(info, "w") as entry:
                        for chunk in image.chunks(_SLICE_BYTES):
                            begin = time.perf_counter()
                            entry.write(chunk)
                            self._paced(time.perf_counter() - begin)
            finally:
                if image is not None:
                    image.close()

    return WeightsStore
