"""What ``model.save`` writes of a model, walked once: `SnapshotLayout`.

Keras's save walk (`keras_internals.run_save_walk`) visits every layer, the
optimizer and the metrics, and each hands a store its values under their
keys; the model's config is serialized to JSON beside them. For a model of
one layer that is 7-11 ms on the benchmark machine (the walk inspects every
attribute of every object), against microseconds for taking the values.
So a run walks its model once per `fit` and keeps what it found: the
entries of the weights file (inner path, metadata, and under each key the
Keras variable itself) and the serialized model. Each snapshot then only
takes the variables' values and the compile config (the optimizer's
hyperparameters as they are now: ``set`` and `ReduceLROnPlateau` change
them); the writer dates its metadata (`metadata`) with the time it was
taken. The compile config is serialized anew only
when the optimizer's hyperparameters changed or the model was compiled
again: its loss and metrics are taken as fixed while a layout lives, as
the model's own config is (serializing it is 0.1-0.4 ms of a save's hold
on TensorFlow). For Keras's own optimizers the key is their plain
attributes, read without their learning rate, which the config then
holds as a `frozen.Late` value, brought to the host by the writer (the
optimizer's ``get_config``, which reads it to the host and is the key of
any other optimizer, was 0.2 ms of the hold on TensorFlow).

A layout is reused only where that is exact: every value the walk met is a
Keras variable (a layer whose ``save_own_variables`` stores something else,
or that writes assets, is walked at every snapshot), and the model and its
optimizer still have as many variables as when it was walked (an optimizer
built later, a model that grew).

Keras is imported lazily.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import numbers
import shutil
from typing import Any, Iterator

from . import keras_internals
from .frozen import Late, MakeLate, host_copy

__all__ = ["SnapshotLayout"]


class SnapshotLayout:
    """A model's save walk and serialized config, kept for later snapshots.

    Attributes:
        entries: ``[(inner path, metadata, [(key, Keras variable or host value)])]``.
        assets_dir: The folder the walk's assets were written into, or None.
        reusable: True when later snapshots may reuse it (see the module's docstring).
    """

    def __init__(self, model_config: dict, entries: list, assets_dir: str | None, reusable: bool, count: int):
        self._model_config = model_config
        self.entries = entries
        self.assets_dir = assets_dir
        self.reusable = reusable
        self._count = count
        self._compile_key: tuple | None = None  # `_compile_key` of the compile config kept
        self._compile_config: dict | None = None

    @classmethod
    def walk(cls, model) -> "SnapshotLayout":
        """Walks `model` as ``model.save`` does (on the training thread).

        Raises:
            Exception: Whatever ``model.save`` would raise for a model that
                cannot be saved (an unserializable config, say).
        """
        model_config = keras_internals.serialize_model(model)
        recorder = _Recorder()
        assets = keras_internals.temporary_assets_store()
        try:
            with _optimizers_hand_variables(model):
                keras_internals.run_save_walk(model, weights_store=recorder, assets_store=assets)
        except BaseException:
            shutil.rmtree(assets.tmp_dir, ignore_errors=True)
            raise
        assets_dir = assets.tmp_dir
        if not any(_files_under(assets_dir)):
            shutil.rmtree(assets_dir, ignore_errors=True)
            assets_dir = None
        reusable = recorder.only_variables and assets_dir is None
        return cls(model_config, recorder.entries, assets_dir, reusable, _variable_count(model))

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

    @staticmethod
    def metadata(saved_at: float) -> str:
        """The ``metadata.json`` of a ``.keras`` file, as ``model.save``
        writes it, dated `saved_at` (``time.time()``; local time, as Keras
        dates it): made by the writer, not at the boundary (formatting it
        there was about 50 µs of a save's hold on TensorFlow, run cold
        right after a step)."""
        from keras import version

        date = datetime.datetime.fromtimestamp(saved_at).strftime("%Y-%m-%d@%H:%M:%S")
        return json.dumps({"keras_version": version(), "date_saved": date})

    def _serialized_compile_config(self, model, late: MakeLate) -> dict | None:
        """The model's compile config, serialized as ``model.save`` does;
        the one serialized last while its key (`_compile_key`) is the same."""
        if not hasattr(model, "get_compile_config"):
            return None
        key = _compile_key(model)
        if key is None or self._compile_key is None or not _same_key(key, self._compile_key):
            compile_config = model.get_compile_config()
            if compile_config is None:
                return None
            self._compile_config = keras_internals.serialize_compile_config(compile_config)
            self._compile_key = key
        if key is not None and key[2] is not None:
            return _with_learning_rate(self._compile_config, key[2], late)
        return self._compile_config


def _compile_key(model) -> tuple | None:
    """What decides a Keras 3 model's compile config while it trains: the
    settings `compile` kept (the object itself), and its optimizer's
    hyperparameters now with its learning-rate variable (Keras's own
    optimizers: `_hyperparameters`) or else its whole config and None. None
    where the model serializes its compile config its own way."""
    KerasVariable = keras_internals.variable_class()
    Trainer = keras_internals.trainer_class()

    settings = getattr(model, "_compile_config", None)
    if type(model).get_compile_config is not Trainer.get_compile_config or settings is None or not model.compiled:
        return None
    optimizer = settings.config.get("optimizer")
    plain = _hyperparameters(optimizer)
    learning_rate = getattr(optimizer, "_learning_rate", None)
    if plain is not None and isinstance(learning_rate, KerasVariable):
        return settings, plain, learning_rate
    try:
        return settings, optimizer.get_config() if hasattr(optimizer, "get_config") else optimizer, None
    except Exception:  # serializing says what is wrong, if anything is
        return None


def _same_key(key: tuple, other: tuple) -> bool:
    try:
        return key[0] is other[0] and key[2] is other[2] and bool(key[1] == other[1])
    except Exception:  # a config holding arrays, say: serialize it anew
        return False


def _hyperparameters(optimizer) -> tuple | None:
    """The plain attributes (numbers, text, None, and lists of them) of one
    of Keras's own optimizers: what its ``get_config`` writes but the
    learning rate. None for an optimizer with a ``get_config`` of its
    own, or one wrapping another (a loss-scale optimizer)."""
    BaseOptimizer = keras_internals.base_optimizer_class()

    get_config = getattr(type(optimizer), "get_config", None)
    if not isinstance(optimizer, BaseOptimizer) or hasattr(optimizer, "inner_optimizer") \
            or not keras_internals.defined_in_keras_optimizers(get_config):
        return None
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


def _files_under(folder: str) -> Iterator[str]:
    import os

    for _root, _dirs, files in os.walk(folder):
        yield from files


@contextlib.contextmanager
def _optimizers_hand_variables(model) -> Iterator[None]:
    """While the walk runs: optimizers that keep Keras's own
    ``save_own_variables`` (the variables in order, keys ``"0"``, ``"1"``...)
    hand the store their variables, under the same keys, rather than a
    ``numpy()`` copy of each. Restored after."""
    BaseOptimizer = keras_internals.base_optimizer_class()

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


def _recorder_class():
    KerasVariable = keras_internals.variable_class()

    class Recorder(keras_internals.h5_io_store_class()):
        """Takes what Keras's save walk writes (no file): Keras variables
        themselves, anything else as a host copy of it now."""

        def __init__(self):  # noqa: D401 - no file: H5IOStore's __init__ is not called
            self.mode = "w"
            self.entries: list = []
            self.only_variables = True

        def make(self, path, metadata=None):
            self.entries.append((path, metadata, []))
            return self

        def __setitem__(self, key, value):
            if not isinstance(value, KerasVariable):
                self.only_variables = False
                value = host_copy(value)
            self.entries[-1][2].append((key, value))

        def __bool__(self):
            return True

        def close(self):
            pass

    return Recorder


_RECORDER = None


def _Recorder():
    global _RECORDER
    if _RECORDER is None:
        _RECORDER = _recorder_class()
    return _RECORDER()
