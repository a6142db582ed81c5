"""A model's state as of a batch boundary, written as a ``.keras`` file later: `ModelSnapshot`.

`ModelSnapshot.take` runs on the training thread at a batch boundary. It
takes what ``model.save`` would write, without writing: the entries of
Keras's own save walk (so custom layers, optimizers and their layout are
those of a ``.keras`` file) and the model's config.

The walk (`keras_internals.record_save_walk`) visits every layer, the
optimizer and the metrics, and each hands a store its values under their
keys; the model's config is serialized beside them. For a model of one
layer that is 7-11 ms on the benchmark machine (the walk inspects every
attribute of every object), against microseconds for taking the values.
So a run walks its model once per `fit` and keeps what it found
(`SnapshotLayout`): the entries of the weights file (inner path, metadata,
and under each key the Keras variable itself) and the serialized model.
Each snapshot then only takes the variables' values and the compile
config (the optimizer's hyperparameters as they are now: ``set`` and
`ReduceLROnPlateau` change them); the writer dates its metadata with the
time it was taken. The compile config is serialized anew only when the
optimizer's hyperparameters changed or the model was compiled again: its
loss and metrics are taken as fixed while a layout lives, as the model's
own config is (serializing it is 0.1-0.4 ms of a save's hold on
TensorFlow). For Keras's own optimizers the key is their plain
attributes, read without their learning rate, which the config then holds
as a `frozen.Late` value, brought to the host by the writer (the
optimizer's ``get_config``, which reads it to the host and is the key of
any other optimizer, was 0.2 ms of the hold on TensorFlow). A layout is
reused only where that is exact: every value the walk met is a Keras
variable (a layer whose ``save_own_variables`` stores something else, or
that writes assets, is walked at every snapshot), and the model and its
optimizer still have as many variables as when it was walked (an
optimizer built later, a model that grew).

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
import numbers
import shutil
import threading
import time
import zipfile
from typing import Any, Callable

from ..checkpoint import NonFiniteStateError
from . import keras_internals
from .frozen import Late, MakeLate, as_host_array, host_copy, is_finite, late_json, nbytes_of, values_for_snapshot
from .h5image import weights_store

__all__ = ["ModelSnapshot", "SnapshotBuffers", "SnapshotLayout"]

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


class SnapshotLayout:
    """A model's save walk and serialized config, kept for later snapshots.

    Attributes:
        entries: ``[(inner path, metadata, [(key, Keras variable or host value)])]``.
        variables: The Keras variables among the entries' values, in order.
        variable_ids: Their ``id``s (which of the entries' values are variables).
        assets_dir: The folder the walk's assets were written into, or None.
        reusable: True when later snapshots may reuse it (see the module's docstring).
    """

    def __init__(self, walk: keras_internals.SaveWalk, count: int):
        self._model_config = walk.model_config
        self.entries = walk.entries
        self.variables = walk.variables
        self.variable_ids = frozenset(map(id, walk.variables))
        self.assets_dir = walk.assets_dir
        self.reusable = walk.only_variables and walk.assets_dir is None
        self._count = count
        self._compile_config_kind = walk.compile_config_kind  # `keras_internals.COMPILE_CONFIG_KINDS`
        # The compile config kept: the walk's, serialized with the model; and its `_compile_key`,
        # taken as the first snapshot takes the config (of the same moment).
        self._compile_config: dict | None = walk.model_config.get("compile_config")
        self._compile_key: tuple | None = _WALKS_OWN if self._compile_config is not None else None

    @classmethod
    def walk(cls, model) -> "SnapshotLayout":
        """Walks `model` as ``model.save`` does (on the training thread).

        Raises:
            Exception: Whatever ``model.save`` would raise for a model that
                cannot be saved (an unserializable config, say).
        """
        count = _variable_count(model)
        return cls(keras_internals.record_save_walk(model, copy=host_copy), count)

    def fits(self, model) -> bool:
        """True if a snapshot of `model` may reuse this layout now (cheap)."""
        return self.reusable and _variable_count(model) == self._count

    def config(self, model, late: MakeLate = Late) -> dict:
        """The model's serialized config with its compile config as of now.
        JSON it later, on any thread: the config is a fresh dict, and
        nothing in it is ever changed.

        Args:
            model: The model.
            late: Makes the `frozen.Late` value of a variable the config
                holds (the learning rate) from the variable and a converter:
                a snapshot gives the value it took of it. Defaults to `Late`
                (a read of the variable now).
        """
        config = dict(self._model_config)
        compile_config = self._serialized_compile_config(model, late)
        if compile_config is not None:
            config["compile_config"] = compile_config
        return config

    def _serialized_compile_config(self, model, late: MakeLate) -> dict | None:
        """The model's compile config, serialized as ``model.save`` does;
        the one serialized last while its key (`_compile_key`) is the same."""
        if not hasattr(model, "get_compile_config"):
            return None
        key = _compile_key(model, self._compile_config_kind)
        if self._compile_key is _WALKS_OWN:
            self._compile_key = key
        elif key is None or self._compile_key is None or not _same_key(key, self._compile_key):
            compile_config = model.get_compile_config()
            if compile_config is None:
                return None
            self._compile_config = keras_internals.serialize_compile_config(compile_config)
            self._compile_key = key
        if key is not None and key[2] is not None:
            return _with_learning_rate(self._compile_config, key[2], late)
        return self._compile_config


_WALKS_OWN = ("the compile config the walk serialized, whose key is not taken yet",)


def _compile_key(model, kind: str) -> tuple | None:
    """What decides a Keras 3 model's compile config while it trains, for a
    model whose compile config ``model.save`` serializes the `kind` way
    (`keras_internals.COMPILE_CONFIG_KINDS`): the settings `compile` kept
    (the object itself), and its optimizer's hyperparameters now with its
    learning-rate variable (one of Keras's own optimizers) or else its
    whole config and None. None where the model serializes its compile
    config its own way."""
    if kind == "model":
        return None
    settings = model._compile_config
    optimizer = settings.config.get("optimizer")
    if kind == "hyperparameters":
        return settings, _hyperparameters(optimizer), optimizer._learning_rate
    try:
        return settings, optimizer.get_config() if hasattr(optimizer, "get_config") else optimizer, None
    except Exception:  # serializing says what is wrong, if anything is
        return None


def _same_key(key: tuple, other: tuple) -> bool:
    try:
        return key[0] is other[0] and key[2] is other[2] and bool(key[1] == other[1])
    except Exception:  # a config holding arrays, say: serialize it anew
        return False


def _hyperparameters(optimizer) -> tuple:
    """The plain attributes (numbers, text, None, and lists of them) of one
    of Keras's own optimizers: what its ``get_config`` writes but the
    learning rate."""
    return tuple((name, tuple(value) if type(value) is list else value)
                 for name, value in vars(optimizer).items() if _plain(value))


def _plain(value: Any) -> bool:
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is list or kind is tuple:
        return all(type(item) in _SCALARS for item in value)
    return isinstance(value, numbers.Number)  # numpy's numbers


_SCALARS = frozenset({type(None), bool, int, float, str})


def _with_learning_rate(serialized: dict, variable, late: MakeLate) -> dict:
    """`serialized` (a compile config) with the optimizer's learning rate
    as `variable` holds it now (`late` of it: read by whoever writes the
    config); not changed."""
    entry = serialized.get("optimizer")
    config = entry.get("config") if isinstance(entry, dict) else None
    if not isinstance(config, dict) or "learning_rate" not in config:
        return serialized
    return {**serialized, "optimizer": {**entry, "config": {**config, "learning_rate": late(variable, float)}}}


def _variable_count(model) -> int:
    optimizer = getattr(model, "optimizer", None)
    return len(model.weights) + (len(optimizer.variables) if optimizer is not None else 0)


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
