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

    Variable = keras_internals.variable_class()
    names = keras_internals.keras_file_names()
    archive.writestr(names.config, config_json)
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

__all__ = ["KerasFileNames", "add_assets_to_zip", "base_optimizer_class", "batch_end_dispatch",
           "defined_in_keras_optimizers", "epoch_iterator_class", "flush_pending_batch_ends", "global_seed_generator",
           "h5_io_store_class", "keras_file_names", "run_save_walk", "seed_generators", "serialize_compile_config",
           "serialize_model", "set_batch_end_dispatch", "start_fit_at_epoch", "temporary_assets_store",
           "trainer_class", "variable_class"]


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
    Subclassed by `weights_store` (a leaner writer) and `layout` (a
    recorder that writes nothing)."""
    from keras.src.saving import saving_lib

    return saving_lib.H5IOStore


def temporary_assets_store():
    """A new ``saving_lib.DiskIOStore`` for the assets of a save walk: the
    objects that write assets write them into a new temporary folder (the
    store's ``tmp_dir``), which the caller removes when done."""
    from keras.src.saving import saving_lib

    return saving_lib.DiskIOStore(saving_lib._ASSETS_DIRNAME, archive=None, mode="w")


def run_save_walk(model, *, weights_store, assets_store) -> None:
    """Runs ``model.save``'s walk (``saving_lib._save_state``) from the model:
    every layer, the optimizer and the metrics hand `weights_store` their
    values (``make``, then ``store[key] = value``) and `assets_store` their
    assets.

    Args:
        model: The model.
        weights_store: An `h5_io_store_class` instance (or one of its subclasses').
        assets_store: A `temporary_assets_store`.

    Raises:
        Exception: Whatever ``model.save`` would raise for an object that
            cannot be saved.
    """
    from keras.src.saving import saving_lib

    saving_lib._save_state(model, weights_store=weights_store, assets_store=assets_store, inner_path="",
                           visited_saveables=set())


def add_assets_to_zip(archive, assets_dir: str) -> None:
    """Writes the assets a walk wrote into `assets_dir` (a
    `temporary_assets_store`'s ``tmp_dir``) into `archive` (a zip open for
    writing) where ``model.save`` puts them (``assets/``)."""
    from keras.src.saving import saving_lib

    name = saving_lib._ASSETS_DIRNAME
    saving_lib._write_to_zip_recursively(archive, f"{assets_dir}/{name}", name)


def serialize_model(model) -> dict:
    """The model's config as ``model.save`` serializes it (shared objects
    serialized once: ``ObjectSharingScope``)."""
    from keras.src.saving import serialization_lib

    with serialization_lib.ObjectSharingScope():
        return serialization_lib.serialize_keras_object(model)


def serialize_compile_config(compile_config: dict) -> dict:
    """A model's ``get_compile_config()`` serialized as ``model.save`` does
    (``serialize_dict`` in an ``ObjectSharingScope``)."""
    from keras.src.saving import serialization_lib

    with serialization_lib.ObjectSharingScope():
        return serialization_lib.serialize_dict(compile_config)


# What a variable, an optimizer and a trainer are ---------------------------------------------------------------


def variable_class() -> type:
    """Keras's common ``Variable`` base class (``keras.Variable`` is the
    backend's subclass of it; a seed generator's state is one too)."""
    from keras.src.backend.common.variables import Variable

    return Variable


def trainer_class() -> type:
    """Keras's ``Trainer``, the base of every model's ``fit`` and of its
    ``get_compile_config``."""
    from keras.src.trainers.trainer import Trainer

    return Trainer


def base_optimizer_class() -> type:
    """Keras's ``BaseOptimizer``, the base of every Keras 3 optimizer
    (each backend's ``keras.optimizers.Optimizer`` subclasses it)."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    return BaseOptimizer


def defined_in_keras_optimizers(function: Any) -> bool:
    """True if `function` (a method, or None) is defined in Keras's own
    optimizers (``keras.src.optimizers``), not in a user's subclass."""
    return getattr(function, "__module__", "").startswith("keras.src.optimizers.")


# The random generators ----------------------------------------------------------------------------------------


def global_seed_generator(*, create: bool):
    """Keras's global ``SeedGenerator`` (the one `keras.random` ops without
    a seed draw from).

    Args:
        create: True: made now if no op has made it yet (as Keras makes it).
            False: None if none was made.
    """
    if create:
        from keras.src.random.seed_generator import global_seed_generator as made

        return made()
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute("global_seed_generator")


def seed_generators(model) -> list:
    """The ``SeedGenerator``s of `model` and of every layer in it (dropout,
    noise), each once, in the order of the model's layers."""
    found, seen = [], set()
    for layer in [model, *model._flatten_layers(include_self=False)]:
        for generator in getattr(layer, "_seed_generators", []) or []:
            if id(generator) not in seen:
                seen.add(id(generator))
                found.append(generator)
    return found


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
