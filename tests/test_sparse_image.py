"""`SparseImage`: the in-memory HDF5 image whose large arrays are placed, not copied."""

from __future__ import annotations

import io

import h5py
import numpy as np
import pytest

from jupyter_traincontrol.state.h5image import SparseImage, allocate, placeable


def test_written_bytes_read_back_and_the_gaps_read_as_zeros():
    image = SparseImage()
    image.seek(10_000)
    assert image.write(b"late") == 4
    image.seek(3)
    image.write(b"early" * 1000)  # crosses a page's end
    assert image.size == 10_004
    image.seek(0)
    assert image.read(3) == b"\0\0\0"
    assert image.read(5_000) == b"early" * 1000
    assert image.read(20_000) == bytes(10_000 - 5_003) + b"late"  # up to the end, no further
    image.seek(-4, io.SEEK_END)
    assert image.read() == b"late"
    assert image.tell() == image.size
    with pytest.raises(ValueError, match="before the start"):
        image.seek(-1)


def test_placed_arrays_are_streamed_in_place_and_h5py_reads_the_file():
    big = np.arange(300_000, dtype="float32").reshape(600, 500)
    ints = np.arange(20_000, dtype="int64")
    small = np.ones(7, dtype="float64")
    image = SparseImage()
    with h5py.File(image, "w") as h5:
        group = h5.create_group("layers/dense/vars")
        for key, array in (("0", big), ("1", ints)):
            image.place(allocate(group, key, array), array)
        group["2"] = small
        group.attrs["name"] = "dense"
    pieces = list(image.chunks(1 << 20))
    assert max(len(piece) for piece in pieces) <= 1 << 20
    written = sum(len(page) for page in image._pages.values())
    assert written < (big.nbytes + ints.nbytes) / 20  # the arrays were never copied into the image
    data = b"".join(bytes(piece) for piece in pieces)
    assert len(data) == image.size
    with h5py.File(io.BytesIO(data), "r") as h5:
        group = h5["layers/dense/vars"]
        assert np.array_equal(group["0"][()], big) and group["0"].dtype == big.dtype
        assert np.array_equal(group["1"][()], ints)
        assert np.array_equal(group["2"][()], small)
        assert group.attrs["name"] == "dense"


@pytest.mark.parametrize("array, expected", [
    (np.zeros((4, 4), "float32"), True),
    (np.zeros((4, 4), "float32").T, False),  # not C-ordered
    (np.zeros(4, ">f4"), False),  # big endian
    (np.zeros(4, bool), False),  # an HDF5 enum
    (np.zeros((), "float32"), False),  # a scalar
    (np.zeros(0, "float32"), False),  # empty
])
def test_only_arrays_stored_as_their_bytes_are_placeable(array, expected):
    assert placeable(array) is expected
