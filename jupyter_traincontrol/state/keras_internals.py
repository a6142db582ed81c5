"""Every private Keras 3 name the package relies on, behind small accessors.

Keras 3 offers no public way for a few things the package does: a
snapshot of what ``model.save`` writes without writing it, the common
base classes of its variables and optimizers, the random generators'
state, where `fit` starts and what data it iterates, and the switch
between running batch-end hooks on a thread pool or inline. This module
is the only one of the package that imports from ``keras.src`` or touches
those private names; the rest of the package calls the functions below.
docs/keras-internals.md says why each is needed and what happens if Keras
moves it; ``tests/test_keras_internals.py`` checks every name against the
Keras installed, and that no other module reaches into ``keras.src``.

Keras is imported lazily, inside the functions: importing this module
imports no Keras.

Example:

    from jupyter_traincontrol.state import keras_internals

    walk = keras_internals.record_save_walk(model, copy=numpy.array)
    names = keras_internals.keras_file_names()
    archive.writestr(names.config, config_json)
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from typing import Any, Callable, Iterator, NamedTuple

__all__ = ["COMPILE_CONFIG_KINDS", "KerasFileNames", "SaveWalk", "add_assets_to_zip", "batch_end_dispatch",
           "epoch_iterator_class", "flush_pending_batch_ends", "h5_io_store_class", "keras_file_names",
           "record_save_walk", "seed_generators", "serialize_compile_config", "set_batch_end_dispatch",
           "start_fit_at_epoch"]


# The `.keras` file: what `model.save` writes, and its walk -------------------------------------------------------


class KerasFileNames(NamedTuple):
    """The names of the entries of a ``.keras`` zip, as ``model.save`` writes them.

    Attributes:
        metadata: The metadata file (``metadata.json``).
        config: The serialized model (``config.json``).
        weights: The weights file (``model.weights.h5``).
    """

    metadata: str
    config: str
    weights: str


def keras_file_names() -> KerasFileNames:
    """The entry names of a ``.keras`` zip (``saving_lib``'s constants)."""
    from keras.src.saving import saving_lib

    return KerasFileNames(saving_lib._METADATA_FILENAME, saving_lib._CONFIG_FILENAME, saving_lib._VARS_FNAME_H5)


def h5_io_store_class() -> type:
    """Keras's ``saving_lib.H5IOStore``: the store ``model.save``'s walk
    hands each object's values to, and that writes ``model.weights.h5``.
    Subclassed by `h5image.weights_store` (a leaner writer) and by the
    recorder of `record_save_walk` (which writes nothing)."""
    from keras.src.saving import saving_lib

    return saving_lib.H5IOStore


class SaveWalk(NamedTuple):
    """What ``model.save`` would write of a model, recorded without a file (`record_save_walk`).

    Attributes:
        model_config: The model's config, serialized as ``model.save`` does
            (shared objects once: ``ObjectSharingScope``).
        entries: What the walk handed the weights file, in its order:
            ``[(inner path, metadata, [(key, value)])]``, each value a Keras
            variable itself or, for anything else, a copy of it taken then.
        variables: The Keras variables among the entries' values, in order.
        only_variables: True if every value the walk handed over is a Keras variable.
        assets_dir: A temporary folder holding the assets the walk wrote
            (the caller removes it), or None if it wrote none.
        compile_config_kind: How ``model.save`` serializes the model's
            compile config (`COMPILE_CONFIG_KINDS`); `model_config` holds it
            as of the walk, under ``"compile_config"`` (if compiled).
    """

    model_config: dict
    entries: list
    variables: list
    only_variables: bool
    assets_dir: str | None
    compile_config_kind: str


#: How ``model.save`` serializes a model's compile config, as `SaveWalk.compile_config_kind` says it:
#: ``"model"``: the model's own ``get_compile_config`` (or the model is not compiled);
#: ``"optimizer"``: Keras's, from the settings `compile` kept and the optimizer's ``get_config()``;
#: ``"hyperparameters"``: Keras's, with one of Keras's own optimizers (wrapping none) whose
#: learning rate is a variable: its ``get_config`` writes its plain attributes and that rate.
COMPILE_CONFIG_KINDS = ("model", "optimizer", "hyperparameters")


def record_save_walk(model, copy: Callable[[Any], Any]) -> SaveWalk:
    """Runs ``model.save``'s walk (``saving_lib._save_state``) from `model`
    on the calling thread and records what every layer, the optimizer and
    the metrics hand its stores, writing no file.

    Keras's own optimizers hand over their variables themselves (their
    ``save_own_variables`` would hand a ``numpy()`` copy of each, under the
    keys ``"0"``, ``"1"``, ...; the same keys are recorded).

    Args:
        model: The model.
        copy: Copies a value the walk hands over that is not a Keras
            variable (a layer's own host array, say), as it is now.

    Raises:
        Exception: Whatever ``model.save`` would raise for a model that
            cannot be saved (an unserializable config, say).
    """
    from keras.src.saving import saving_lib, serialization_lib

    with serialization_lib.ObjectSharingScope():
        model_config = serialization_lib.serialize_keras_object(model)
    recorder = _recorder_class()(copy)
    assets = saving_lib.DiskIOStore(saving_lib._ASSETS_DIRNAME, archive=None, mode="w")
    try:
        with _optimizers_hand_variables(model):
            saving_lib._save_state(model, weights_store=recorder, assets_store=assets, inner_path="",
                                   visited_saveables=set())
    except BaseException:
        shutil.rmtree(assets.tmp_dir, ignore_errors=True)
        raise
    assets_dir = assets.tmp_dir
    if not any(files for _root, _dirs, files in os.walk(assets_dir)):
        shutil.rmtree(assets_dir, ignore_errors=True)
        assets_dir = None
    return SaveWalk(model_config, recorder.entries, recorder.variables, recorder.only_variables, assets_dir,
                    _compile_config_kind(model))


def _compile_config_kind(model) -> str:
    from keras.src.backend.common.variables import Variable
    from keras.src.optimizers.base_optimizer import BaseOptimizer
    from keras.src.trainers.trainer import Trainer

    settings = getattr(model, "_compile_config", None)
    if type(model).get_compile_config is not Trainer.get_compile_config or settings is None or not model.compiled:
        return "model"
    optimizer = settings.config.get("optimizer")
    get_config = getattr(type(optimizer), "get_config", None)
    keras_own = isinstance(optimizer, BaseOptimizer) and not hasattr(optimizer, "inner_optimizer") \
        and getattr(get_config, "__module__", "").startswith("keras.src.optimizers.")
    if keras_own and isinstance(getattr(optimizer, "_learning_rate", None), Variable):
        return "hyperparameters"
    return "optimizer"


@contextlib.contextmanager
def _optimizers_hand_variables(model) -> Iterator[None]:
    """While the walk runs: optimizers that keep Keras's own
    ``save_own_variables`` hand the store their variables, under the same
    keys, rather than a ``numpy()`` copy of each. Restored after."""
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


@functools.lru_cache(maxsize=None)
def _recorder_class() -> type:
    from keras.src.backend.common.variables import Variable

    class Recorder(h5_io_store_class()):
        """Takes what the save walk hands the weights file (no file)."""

        def __init__(self, copy):  # noqa: D401 - no file: H5IOStore's __init__ is not called
            self.mode = "w"
            self.entries: list = []
            self.variables: list = []
            self.only_variables = True
            self._copy = copy

        def make(self, path, metadata=None):
            self.entries.append((path, metadata, []))
            return self

        def __setitem__(self, key, value):
            if isinstance(value, Variable):
                self.variables.append(value)
            else:
                self.only_variables = False
                value = self._copy(value)
            self.entries[-1][2].append((key, value))

        def __bool__(self):
            return True

        def close(self):
            pass

    return Recorder


def add_assets_to_zip(archive, assets_dir: str) -> None:
    """Writes the assets a walk wrote into `assets_dir` (a
    `SaveWalk`'s) into `archive` (a zip open for
    writing) where ``model.save`` puts them (``assets/``)."""
    from keras.src.saving import saving_lib

    name = saving_lib._ASSETS_DIRNAME
    saving_lib._write_to_zip_recursively(archive, f"{assets_dir}/{name}", name)


def serialize_compile_config(compile_config: dict) -> dict:
    """A model's ``get_compile_config()`` serialized as ``model.save`` does
    (``serialize_dict`` in an ``ObjectSharingScope``)."""
    from keras.src.saving import serialization_lib

    with serialization_lib.ObjectSharingScope():
        return serialization_lib.serialize_dict(compile_config)


# The random generators ----------------------------------------------------------------------------------------


def seed_generators(model, *, create_global: bool) -> tuple[list, Any]:
    """The Keras ``SeedGenerator``s whose state decides the random draws of
    training: those of `model` and of every layer in it (dropout, noise),
    and Keras's global one (the one `keras.random` ops without a seed draw
    from).

    Args:
        model: The model, or None (the global one only).
        create_global: True: the global one is made now if no op has made
            it yet (as Keras makes it). False: None if none was made.

    Returns:
        ``(the model's, each once, in the order of its layers; the global one or None)``.
    """
    found, seen = [], set()
    for layer in [model, *model._flatten_layers(include_self=False)] if model is not None else []:
        for generator in getattr(layer, "_seed_generators", []) or []:
            if id(generator) not in seen:
                seen.add(id(generator))
                found.append(generator)
    if create_global:
        from keras.src.random.seed_generator import global_seed_generator

        return found, global_seed_generator()
    from keras.src.backend.common import global_state

    return found, global_state.get_global_attribute("global_seed_generator")


# The running `fit` -------------------------------------------------------------------------------------------------


def start_fit_at_epoch(model, epoch: int) -> Callable[[], None]:
    """Makes the `fit` about to run start at `epoch`: Keras 3's ``fit`` reads
    ``model._initial_epoch`` after ``on_train_begin`` (as `BackupAndRestore`
    sets it). Call it in ``on_train_begin``.

    Returns:
        What puts the model's previous value back.
    """
    previous = getattr(model, "_initial_epoch", None)
    model._initial_epoch = epoch

    def put_back() -> None:
        model._initial_epoch = previous

    return put_back


def epoch_iterator_class() -> type | None:
    """Keras's ``EpochIterator`` (``fit`` keeps one, ``epoch_iterator``, in
    its frame), or None where this Keras has none there."""
    try:
        from keras.src.trainers.epoch_iterator import EpochIterator
    except ImportError:  # pragma: no cover - another Keras layout
        return None
    return EpochIterator


def batch_end_dispatch(callback_list) -> tuple[bool, bool]:
    """Whether a `CallbackList` runs the batch-end hooks of training and of
    evaluation on Keras's thread pool (its ``_async_train``, ``_async_test``,
    set when the list is made); ``(False, False)`` for None or a list
    without them (Keras 2's).

    Returns:
        ``(train_async, test_async)``.
    """
    return bool(getattr(callback_list, "_async_train", False)), bool(getattr(callback_list, "_async_test", False))


def set_batch_end_dispatch(callback_list, *, train_async: bool, test_async: bool) -> None:
    """Makes a `CallbackList` run the batch-end hooks of training and of
    evaluation on its thread pool (True) or on the thread calling them
    (False), from the next batch end on. Keras reads the two flags at every
    batch end; setting them is safe from any thread.
    """
    callback_list._async_train = train_async
    callback_list._async_test = test_async


def flush_pending_batch_ends(callback_list) -> None:
    """Waits for the batch-end hooks a `CallbackList` still runs on its
    thread pool (``_flush_futures``)."""
    callback_list._flush_futures()
