"""The private Keras names the package relies on: listed whole, and checked against the Keras installed.

Keras 3 offers no public way to do what each of them does
(docs/keras-internals.md says why, group by group). They are all behind
one adapter, ``state/keras_internals.py``, the only module of the package
that imports from ``keras.src`` or switches a `CallbackList`'s dispatch
(`test_only_the_adapter_reaches_into_keras`). The main test pass
checks them against the newest Keras it installs, the Colab pass against
Colab's, the lowest the package declares (``keras>=3.13``; Colab ships
3.13.2): a Keras release that moves one fails here, by name, before a
user meets it. `test_every_keras_src_name_the_package_uses_is_listed` keeps
the list whole: a new private name in the package fails until it is
listed here (and so checked on both versions).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_traincontrol"
#: The one module that may import from ``keras.src`` and touch the dispatch flags.
ADAPTER = PACKAGE / "state" / "keras_internals.py"
#: The private `CallbackList` names `fit.dispatch` switches, through the adapter only.
DISPATCH_PRIVATES = ("_async_train", "_async_test", "_flush_futures")

#: The ``keras.src`` modules the package imports, and the names it takes
#: from each (imported, or read as an attribute of the module).
KERAS_SRC = {
    "keras.src.saving.saving_lib": ("_save_state", "DiskIOStore", "H5IOStore", "_ASSETS_DIRNAME",
                                    "_CONFIG_FILENAME", "_METADATA_FILENAME", "_VARS_FNAME_H5",
                                    "_write_to_zip_recursively"),
    "keras.src.saving.serialization_lib": ("ObjectSharingScope", "serialize_keras_object", "serialize_dict"),
    "keras.src.backend.common.variables": ("Variable",),
    "keras.src.backend.common.global_state": ("get_global_attribute",),
    "keras.src.trainers.trainer": ("Trainer",),
    "keras.src.trainers.epoch_iterator": ("EpochIterator",),
    "keras.src.optimizers.base_optimizer": ("BaseOptimizer",),
    "keras.src.random.seed_generator": ("global_seed_generator",),
}

#: Private methods of Keras classes the package calls or overrides.
CLASS_PRIVATES = {
    ("keras.src.saving.saving_lib", "H5IOStore"): ("_create_h5_group", "_get_h5_file"),
    ("keras.src.callbacks.callback_list", "CallbackList"): ("_flush_futures",),
    ("keras.src.trainers.epoch_iterator", "EpochIterator"): ("_get_iterator",),
    ("keras.src.layers.layer", "Layer"): ("_flatten_layers",),
}

#: Names `fit`'s own code uses, which the package reads or sets on its
#: objects or in its frame (checked in the source of `Model.fit`).
FIT_READS = ("self._initial_epoch", "epoch_iterator", "callbacks.on_train_begin(")


def _package_modules() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py")) if "labextension" not in path.parts]


def _keras_src_names() -> set[tuple[str, str]]:
    """Every (``keras.src`` module, name) the package's source uses (the
    adapter's, once `test_only_the_adapter_reaches_into_keras` passes)."""
    used = set()
    for path in _package_modules():
        tree = ast.parse(path.read_text())
        aliases = {}  # a name bound to a keras.src module in this file -> the module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras.src"):
                for alias in node.names:
                    module = f"{node.module}.{alias.name}"
                    if module in KERAS_SRC or _is_module(module):
                        aliases[alias.asname or alias.name] = module
                    else:
                        used.add((node.module, alias.name))
            elif isinstance(node, ast.Import):
                assert not any(alias.name.startswith("keras.src") for alias in node.names), path
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                used.add((aliases[node.value.id], node.attr))
    return used


def _is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def _reaches_into_keras(source: str) -> list[str]:
    """What in `source` (a module's text) reaches into Keras's internals: an
    import from ``keras.src``, a ``keras.src`` name in a string (a module
    name compared or imported by name; docstrings aside), or one of the
    `DISPATCH_PRIVATES` named anywhere."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("keras.src"):
            found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {alias.name}" for alias in node.names
                      if alias.name.startswith("keras.src")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "keras.src" in node.value \
                and id(node) not in docstrings:
            found.append(f"line {node.lineno}: {node.value!r}")
    found += [f"line {number}: {name}" for number, line in enumerate(source.splitlines(), 1)
              for name in DISPATCH_PRIVATES if name in line]
    return found


def test_only_the_adapter_reaches_into_keras():
    """Every private Keras name is behind ``state/keras_internals.py``: no
    other module imports from ``keras.src`` or touches the `CallbackList`
    flags `fit.dispatch` switches."""
    problems = [f"{path.relative_to(PACKAGE.parent)} {where}" for path in _package_modules() if path != ADAPTER
                for where in _reaches_into_keras(path.read_text())]
    assert not problems, f"only state/keras_internals.py may reach into Keras's internals: {problems}"
    assert _reaches_into_keras(ADAPTER.read_text()), "the adapter reaches into nothing: is ADAPTER the right file?"


@pytest.mark.parametrize("source", [
    "from keras.src.saving import saving_lib\n",
    "def f():\n    from keras.src.trainers.trainer import Trainer\n",
    "import keras.src.saving.saving_lib as saving_lib\n",
    "x = importlib.import_module('keras.src.saving.saving_lib')\n",
    "callbacks._async_train = False\n",
    "flags = getattr(callbacks, '_async_test', False)\n",
    "callbacks._flush_futures()\n",
])
def test_reaching_into_keras_is_found(source):
    assert _reaches_into_keras(source)


def test_naming_keras_src_in_a_docstring_or_using_public_keras_is_not_reaching_in():
    source = '"""Walks as ``keras.src.saving.saving_lib`` does."""\nimport keras\nfrom keras import ops\n'
    assert _reaches_into_keras(source) == []


def test_every_keras_src_name_the_package_uses_is_listed():
    listed = {(module, name) for module, names in KERAS_SRC.items() for name in names}
    used = _keras_src_names()
    unlisted = sorted(used - listed)
    assert not unlisted, f"keras.src names the package uses but this test does not check: {unlisted}"
    stale = sorted(listed - used)
    assert not stale, f"keras.src names this test checks but the package no longer uses: {stale}"


@pytest.mark.parametrize("module", sorted(KERAS_SRC))
def test_each_keras_src_name_is_where_the_package_takes_it(module):
    import keras

    found = importlib.import_module(module)
    missing = [name for name in KERAS_SRC[module] if not hasattr(found, name)]
    assert not missing, f"Keras {keras.__version__}: {module} has no {missing}"


@pytest.mark.parametrize(("where", "names"), sorted(CLASS_PRIVATES.items()))
def test_each_private_method_is_on_its_keras_class(where, names):
    import keras

    module, cls = where
    found = getattr(importlib.import_module(module), cls)
    missing = [name for name in names if not callable(getattr(found, name, None))]
    assert not missing, f"Keras {keras.__version__}: {module}.{cls} has no {missing}"


def test_fit_reads_what_the_package_sets_and_finds():
    """`fit` starts at ``model._initial_epoch`` (a resume sets it), keeps its
    ``epoch_iterator`` in a local (the data order's counts find it there)
    and calls ``on_train_begin`` on its `CallbackList` (the dispatch finds
    the list in that frame), on the backend of this pass."""
    import keras

    source = inspect.getsource(keras.Model.fit)
    missing = [text for text in FIT_READS if text not in source]
    assert not missing, f"Keras {keras.__version__} ({keras.backend.backend()}): Model.fit has no {missing}"


def test_a_callback_list_has_the_dispatch_flags_the_package_switches():
    """``CallbackList._async_train`` and ``_async_test`` are set when the
    list is made; `fit.dispatch.BatchDispatch` switches them while a
    command waits (`keras_internals.set_batch_end_dispatch`)."""
    import keras

    callbacks = keras.callbacks.CallbackList([keras.callbacks.Callback()], model=keras.Sequential())
    missing = [name for name in ("_async_train", "_async_test") if not isinstance(getattr(callbacks, name, None), bool)]
    assert not missing, f"Keras {keras.__version__}: CallbackList has no boolean {missing}"


def test_the_adapter_reads_and_switches_a_callback_lists_dispatch():
    """The accessors `fit.dispatch` uses, on a real `CallbackList`."""
    import keras

    from jupyter_traincontrol.state import keras_internals

    callbacks = keras.callbacks.CallbackList([keras.callbacks.Callback()], model=keras.Sequential())
    assert keras_internals.batch_end_dispatch(callbacks) == (callbacks._async_train, callbacks._async_test)
    keras_internals.set_batch_end_dispatch(callbacks, train_async=True, test_async=False)
    assert keras_internals.batch_end_dispatch(callbacks) == (True, False)
    keras_internals.flush_pending_batch_ends(callbacks)  # nothing pending: returns at once
    assert keras_internals.batch_end_dispatch(None) == (False, False)
