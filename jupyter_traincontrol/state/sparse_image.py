"""An HDF5 file image in memory whose large arrays are placed, not copied: `SparseImage`.

h5py writes an HDF5 file into a Python file object by calling its
``write`` with the interpreter lock held, and an ``io.BytesIO`` grows by
copying itself: writing a 50 MB weights file that way held the lock for
up to 7-8 ms at a time, long enough to stall a training thread between
two steps. `SparseImage` is the file object h5py writes into instead:

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
from typing import Iterator

__all__ = ["SparseImage", "allocate", "placeable"]

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
