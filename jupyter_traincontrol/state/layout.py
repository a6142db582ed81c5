"""What ``model.save`` writes of a model, walked once: `SnapshotLayout`.

Keras's save walk (`keras_internals.record_save_walk`) visits every layer,
the optimizer and the metrics, and each hands a store its values under their
keys; the model's config is serialized to JSON beside them. For a model of
one layer that is 7-11 ms on the benchmark machine (the walk inspects every
attribute of every object), against microseconds for taking the values.
So a run walks its model once per `fit` and keeps what it found: the
entries of the weights file (inner path, metadata, and under each key the
Keras variable itself) and the serialized model. Each snapshot then only
takes the variables' values and the compile config (the optimizer's
hyperparameters as they are now: ``set`` and `ReduceLROnPlateau` change
them); the writer dates its metadata with the time it was taken. The compile config is serialized anew only
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

import numbers
from typing import Any

from . import keras_internals
from .frozen import Late, MakeLate, host_copy

__all__ = ["SnapshotLayout"]


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
