"""A model's state as of a batch boundary, written as a ``.keras`` file later: `ModelSnapshot`.

`ModelSnapshot.take` runs on the training thread at a batch boundary. It
takes what ``model.save`` would write, without writing: the entries of
Keras's own save walk (so custom layers, optimizers and their layout are
those of a ``.keras`` file) and the model's config. The walk and the
serialized model are done once per `fit` (`layout.SnapshotLayout`, reused
while the model keeps its variables); each snapshot takes the variables'
values and the compile config (the optimizer's hyperparameters as now).

How a value is kept (`frozen`) is each backend's cheapest way that later
training cannot change: on TensorFlow a read of the variable (its buffers
are copy-on-write, so the step that next updates it copies it, on the
device), on JAX a host view of the trainer's array on CPU (its buffer is
then kept rather than donated to the next step) or a queued device-side
copy on an accelerator, and on torch (updated in place) a queued copy on
a CUDA device, else a host copy. So, but for torch on the CPU, a snapshot
costs the training thread microseconds per variable and keeps no host
copy of its own; the writer thread brings device values to the host.

A host copy (torch on the CPU, or a variable with no such value) goes into
the arrays of `SnapshotBuffers` when one is given: the arrays of the previous
snapshot, kept by the run and reused, so a snapshot writes into memory
that is already mapped. Allocating hundreds of MB afresh for every
snapshot costs more than the copy itself: the first touch of each page is
a page fault, and after a save had filled the page cache those took
0.5-1.8 s for 500 MB on the benchmark machine, against 0.07-0.14 s to copy
into mapped arrays.

With ``copy=False`` it keeps views of the variables' buffers instead (no
memory, no time), for a checkpoint written while the training thread waits.

`ModelSnapshot.save(path)` then writes the ``.keras`` file, on any thread,
without touching the model (`weights_store`: large host arrays are placed
in the HDF5 image rather than copied into it, and streamed into the zip in
slices of a few MB, so the writer never holds the interpreter lock for
long: two copies fewer than ``model.save``): the zip holds the same ``metadata.json``,
``config.json``, ``model.weights.h5`` and ``assets/`` as ``model.save``
would have written at the moment of the snapshot, and
`keras.models.load_model` opens it; a snapshot holding a NaN or an
infinity is not written (`NonFiniteStateError`). It has a ``save(path)``
method like a model's, so `CheckpointStore.save` writes a snapshot exactly
as it writes a model (same staging, renames and intent record).

Memory: until it is dropped, a snapshot holds what its values hold: on
TensorFlow and JAX the buffers of its boundary (which training would
otherwise have reused: one more copy of the state, in device memory,
while its file is written, and on an accelerator their host copy once the
writer has brought them over), and so on torch on a CUDA device; on torch on
the CPU one host copy of the variables and the optimizer's (for Adam,
three times the weights), kept by the run from
its first snapshot until it calls `SnapshotBuffers.clear`
(`SaveScheduler.close`, at the end of `fit`).

Example:

>>> snapshot = ModelSnapshot.take(model)          # doctest: +SKIP
>>> snapshot.save("later.keras")                  # any thread  # doctest: +SKIP
"""

from __future__ import annotations

import datetime
import json
import shutil
import threading
import time
import zipfile
from typing import Any, Callable

from ..checkpoint import NonFiniteStateError
from . import keras_internals
from .frozen import Late, MakeLate, as_host_array, is_finite, late_json, nbytes_of, values_for_snapshot
from .layout import SnapshotLayout
from .h5image import weights_store

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
    """The state ``model.save`` would write, as of a batch boundary.

    Attributes:
        layout: The save walk it was taken with (reusable by the next
            snapshot of the same model if `SnapshotLayout.fits` it).
    """

    def __init__(self, config, saved_at: float, entries: list, assets_dir: str | None,
                 arrays: list | None = None, buffers: SnapshotBuffers | None = None,
                 layout: SnapshotLayout | None = None):
        self._config = config  # the serialized model (a dict), or its JSON
        self._saved_at = saved_at  # time.time() when taken: the file's metadata is dated then
        self._entries = entries  # [(inner path, metadata, [(key, frozen value)])]
        self._on_host = False  # True once `_to_host` has brought the values over
        self._assets_dir = assets_dir
        self._arrays = arrays or []  # the reusable host arrays among the values, in order
        self._buffers = buffers
        self.layout = layout
        #: Called with the seconds each slice of the write took (a writer
        #: thread sets it to pace itself); None: no pause.
        self.pace = None
        self._nbytes: int | None = None
        #: ``late(variable, convert)``: the `frozen.Late` value of one of
        #: the model's variables as of the snapshot (the value it took, or
        #: a read now of a variable it did not take: ``optimizer.iterations``
        #: of a model without a layout that saves it, say).
        self.late: MakeLate = Late

    @property
    def nbytes(self) -> int:
        """Bytes of array data held when taken (counted when first asked,
        not on the training thread)."""
        if self._nbytes is None:
            self._nbytes = sum(nbytes_of(value) for _p, _m, items in self._entries for _k, value in items)
        return self._nbytes

    @classmethod
    def take(cls, model, buffers: SnapshotBuffers | None = None, copy: bool = True,
             layout: SnapshotLayout | None = None) -> "ModelSnapshot":
        """Takes the state of `model` (call it on the training thread).

        Args:
            model: The model, its state up to date (`keras_state.sync_model_state`).
            buffers: Host arrays to copy every variable into, kept from the
                previous snapshot (and given back when this one is
                released). None: each value is kept the backend's cheapest
                way (`frozen.freeze`), else copied into new arrays.
            copy: False: keep views of the variables' buffers instead (no
                memory, no time), for a snapshot written while the training
                thread waits: the model must not change until the snapshot
                is saved and released.
            layout: The walk of an earlier snapshot of `model`, reused if it
                still fits (`SnapshotLayout.fits`); otherwise the model is
                walked now.

        Raises:
            Exception: Whatever ``model.save`` would raise for a model that
                cannot be saved (an unserializable config, say).
        """
        if layout is None or not layout.fits(model):
            layout = SnapshotLayout.walk(model)
        into_buffers = buffers is not None and copy
        kept = buffers.borrow() if into_buffers else []
        arrays: list = []
        try:
            variables, is_variable = layout.variables, layout.variable_ids  # the others: host copies of the walk's own
            values, arrays = values_for_snapshot(variables, copy=copy, kept=kept if into_buffers else None)
            taken = {id(variable): value for variable, value in zip(variables, values)} if copy else {}
            taken_in_order = iter(values)
            entries = [(inner_path, metadata_of,
                        [(key, next(taken_in_order) if id(value) in is_variable else value) for key, value in items])
                       for inner_path, metadata_of, items in layout.entries]
            late = _late_of(taken, now=into_buffers)
            config = layout.config(model, late)
        except BaseException:
            if into_buffers:
                buffers.give_back(arrays + kept[len(arrays):])
            if not layout.reusable and layout.assets_dir is not None:
                shutil.rmtree(layout.assets_dir, ignore_errors=True)
            raise
        assets = None if layout.reusable else layout.assets_dir  # a walk of this snapshot's own
        snapshot = cls(config, time.time(), entries, assets, arrays,
                       buffers if copy and buffers is not None else None, layout)
        snapshot.late = late
        return snapshot

    def non_finite(self) -> list[str]:
        """The variables holding a NaN or an infinity (``layers/dense/vars/0``);
        one vectorised pass over each floating-point value on the host (a
        device value comes to the host for it, on the writer thread)."""
        self._to_host()
        return [f"{inner_path}/{key}".strip("/") for inner_path, _metadata, items in self._entries
                for key, value in items if not is_finite(value)]

    def _to_host(self) -> None:
        """Brings every value to the host, once (a device value is copied: the
        check and the file read the same copy, and the device's is dropped;
        the host copies are then held until the snapshot is released)."""
        if not self._on_host:
            self._entries = [(inner_path, metadata, [(key, as_host_array(value)) for key, value in items])
                             for inner_path, metadata, items in self._entries]
            self._on_host = True

    def save(self, path) -> None:
        """Writes the ``.keras`` file at `path` (a new file), from the snapshot.

        Raises:
            NonFiniteStateError: Before writing anything, if a variable
                holds a NaN or an infinity: no checkpoint of bad weights.
        """
        metadata = _metadata_json(self._saved_at)
        bad = self.non_finite()  # the values on the host
        if bad:
            raise NonFiniteStateError(bad)
        config = self._config if isinstance(self._config, str) else json.dumps(self._config, default=late_json)
        with open(path, "wb") as handle, zipfile.ZipFile(handle, "w") as archive:
            names = keras_internals.keras_file_names()
            archive.writestr(names.metadata, metadata)
            archive.writestr(names.config, config)
            store = weights_store(archive, names.weights)
            store.pace = self.pace
            try:
                for inner_path, metadata, items in self._entries:
                    store.make(inner_path, metadata=metadata)
                    for key, value in items:
                        store[key] = value  # a host array (`_to_host`)
            except BaseException:
                store.archive = None  # do not add a half-made weights file
                raise
            finally:
                store.close()
            if self._assets_dir is not None:
                keras_internals.add_assets_to_zip(archive, self._assets_dir)

    def release(self) -> None:
        """Drops the values (and any assets folder), handing its host arrays
        back to its `SnapshotBuffers` if it has one. Idempotent."""
        self.nbytes  # counted while the values are here
        self._entries = []
        arrays, self._arrays = self._arrays, []
        if self._buffers is not None and arrays:
            self._buffers.give_back(arrays)
        assets, self._assets_dir = self._assets_dir, None
        if assets is not None:
            shutil.rmtree(assets, ignore_errors=True)


def _late_of(taken: dict[int, Any], now: bool) -> MakeLate:
    """`ModelSnapshot.late` for the values `taken` (by id of their variable):
    a variable the snapshot took is not read a second time. `now`: the
    host arrays among them are copies in arrays a later snapshot reuses,
    converted at once (a few microseconds; a value still on a device is
    brought to the host by the writer, as on the other backends)."""
    import numpy as np

    def late(variable, convert: Callable[[Any], Any]) -> Late:
        found = taken.get(id(variable))
        if found is None:
            return Late(variable, convert)
        made = Late.of_frozen(found, convert)
        if now and isinstance(found, np.ndarray):
            made.value()
        return made

    return late


def _metadata_json(saved_at: float) -> str:
    """The ``metadata.json`` of a ``.keras`` file, as ``model.save`` writes
    it, dated `saved_at` (``time.time()``; local time, as Keras dates it):
    made by the writer, not at the boundary (formatting it there was about
    50 µs of a save's hold on TensorFlow, run cold right after a step)."""
    from keras import version

    date = datetime.datetime.fromtimestamp(saved_at).strftime("%Y-%m-%d@%H:%M:%S")
    return json.dumps({"keras_version": version(), "date_saved": date})
