"""A snapshot's ``model.weights.h5``, written from memory: `weights_store` and its `SparseImage`.

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

`SparseImage` is the file object h5py writes into. h5py writes an HDF5
file into a Python file object by calling its ``write`` with the
interpreter lock held, and an ``io.BytesIO`` grows by copying itself:
writing a 50 MB weights file that way held the lock for up to 7-8 ms at a
time, long enough to stall a training thread between two steps. Instead:

- what h5py writes (the file's metadata and small arrays) is kept in
  pages of 4 KiB, so a write never copies what came before it;
- a large array gets a dataset whose space h5py allocates at once and
  never fills (`allocate`), and the image only remembers which array
  goes at that offset (`place`): no copy is made;
- `chunks` then yields the whole file in order, the array bytes straight
  from the arrays, so streaming it into the ``.keras`` zip reads every
  array once, in calls (CRC and file write) that release the lock.

The result is the same HDF5 file h5py would have written, byte for byte
in every dataset, with the datasets' storage allocated early.

Example:

>>> image = SparseImage()                                           # doctest: +SKIP
>>> with h5py.File(image, "w") as h5:                               # doctest: +SKIP
...     image.place(allocate(h5.create_group("vars"), "0", array), array)
>>> for chunk in image.chunks(4 << 20): archive_entry.write(chunk)  # doctest: +SKIP
"""

from __future__ import annotations

import io
import time
import zipfile
from typing import Iterator

from . import keras_internals

__all__ = ["weights_store", "SparseImage", "allocate", "placeable"]

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


# The image ------------------------------------------------------------------------------------------------

_PAGE = 4096


def placeable(array) -> bool:
    """True if `array`'s bytes are exactly what an HDF5 dataset of its
    shape and dtype stores: a C-ordered array of numbers, native or little
    endian (not ``bool``, whose HDF5 type is an enum, nor objects)."""
    dtype = array.dtype
    return (array.flags.c_contiguous and array.ndim > 0 and array.size > 0 and dtype.kind in "fiuc"
            and dtype.byteorder in "=<|" and not dtype.fields and not dtype.subdtype)


def allocate(group, key: str, array) -> int:
    """Creates dataset `key` in `group` for `array`'s shape and dtype,
    its storage allocated now and never filled, and returns its offset in
    the file (where `SparseImage.place` puts the array).

    Raises:
        ValueError: If HDF5 did not allocate the dataset in one piece of
            exactly the array's size.
    """
    from h5py import h5d, h5p

    plist = h5p.create(h5p.DATASET_CREATE)
    plist.set_alloc_time(h5d.ALLOC_TIME_EARLY)
    plist.set_fill_time(h5d.FILL_TIME_NEVER)
    dataset = group.create_dataset(key, shape=array.shape, dtype=array.dtype, dcpl=plist)
    offset, size = dataset.id.get_offset(), dataset.id.get_storage_size()
    if offset is None or size != array.nbytes:
        raise ValueError(f"HDF5 gave dataset {key!r} {size} bytes at offset {offset}; "
                         f"expected {array.nbytes} contiguous bytes.")
    return offset


class SparseImage(io.RawIOBase):
    """A seekable binary file in memory: written pages, and placed arrays.

    Attributes:
        size: The file's length (its end of file, as HDF5 set it).
    """

    def __init__(self):
        super().__init__()
        self._pages: dict[int, bytearray] = {}
        self._placed: dict[int, memoryview] = {}  # offset -> the array's bytes
        self._position = 0
        self.size = 0

    # The file object h5py's ``fileobj`` driver uses ---------------------------------

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"Cannot seek to {base + offset}: before the start of the image.")
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def truncate(self, size: int | None = None) -> int:
        self.size = self._position if size is None else size
        return self.size

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        position, written = self._position, 0
        while written < len(data):
            page, start = divmod(position + written, _PAGE)
            count = min(_PAGE - start, len(data) - written)
            buffer = self._pages.get(page)
            if buffer is None:
                buffer = self._pages[page] = bytearray(_PAGE)
            buffer[start:start + count] = data[written:written + count]
            written += count
        self._position = position + written
        self.size = max(self.size, self._position)
        return written

    def readinto(self, buffer) -> int:
        buffer = memoryview(buffer).cast("B")
        count = max(0, min(len(buffer), self.size - self._position))
        buffer[:count] = self._range(self._position, self._position + count)
        self._position += count
        return count

    # Placed arrays and the finished file ---------------------------------------------

    def place(self, offset: int, array) -> None:
        """Puts `array`'s bytes at `offset` (a dataset's storage, from
        `allocate`); the array is read, not copied, by `chunks`."""
        self._placed[offset] = memoryview(array).cast("B")

    def chunks(self, size: int) -> Iterator[memoryview]:
        """The whole file, in order, in pieces of at most `size` bytes (the
        placed arrays' pieces are views of the arrays)."""
        position = 0
        for offset in sorted(self._placed):
            placed = self._placed[offset]
            yield from _pieces(memoryview(self._range(position, offset)), size)
            yield from _pieces(placed, size)
            position = offset + len(placed)
        yield from _pieces(memoryview(self._range(position, max(position, self.size))), size)

    def _range(self, begin: int, end: int) -> bytearray:
        """The written bytes from `begin` to `end` (zeros where nothing was)."""
        out = bytearray(end - begin)
        for page in range(begin // _PAGE, (end + _PAGE - 1) // _PAGE):
            buffer = self._pages.get(page)
            if buffer is None:
                continue
            start = page * _PAGE
            low, high = max(begin, start), min(end, start + _PAGE)
            out[low - begin:high - begin] = buffer[low - start:high - start]
        return out

    def close(self) -> None:
        self._pages.clear()
        self._placed.clear()
        super().close()


def _pieces(view: memoryview, size: int) -> Iterator[memoryview]:
    for start in range(0, len(view), size):
        yield view[start:start + size]
