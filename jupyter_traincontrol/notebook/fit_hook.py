"""Add a run's control callback to every `fit` called on its training thread.

The cell of ``%%interruptible_fit`` may call ``fit`` directly or through the
user's own functions, so the magic cannot guess from the cell's text.
Instead, while any run is active, ``keras.Model.fit`` is wrapped: a call made
on a thread that belongs to a run gets that run's callback added (and, unless
the user passed ``verbose``, Keras's text progress bar is turned off: the
panel shows progress). Calls from other threads are untouched. The wrapper is
installed on first use and removed when the last run ends.

Keras 2 (``tf_keras``) has a `fit` of its own, wrapped the same way. Each is
wrapped at once if it is imported already, else as soon as something
imports it (the cell's ``import keras``, an ``import tf_keras``, or
``tf.keras``), by a finder watching for them on ``sys.meta_path`` while runs
are active. Nothing here imports Keras, ``tf_keras`` or TensorFlow: a cell
that trains a PyTorch or JAX `TrainLoop` loads none of them.
"""

from __future__ import annotations

import functools
import importlib.abc
import sys
import threading
from typing import Any, Callable

__all__ = ["FitInterceptor", "intercept_fit"]

_lock = threading.Lock()
_by_thread: dict[int, "FitInterceptor"] = {}
_wrapped: list[tuple[type, Callable, bool]] = []  # (class, its original fit, whether the class defined fit itself)
#: The modules whose ``Model.fit`` is wrapped: Keras 3 and Keras 2.
_KERAS_MODULES = ("keras", "tf_keras")


class FitInterceptor:
    """What a run does around each `fit` on its thread.

    Subclasses (the run) implement `around_fit`.
    """

    def around_fit(self, fit: Callable, model, args: tuple, kwargs: dict) -> Any:
        """Calls ``fit(model, *args, **kwargs)`` with whatever the run adds."""
        raise NotImplementedError


def _wrapper(original: Callable) -> Callable:
    @functools.wraps(original)
    def fit(model, *args, **kwargs):
        interceptor = _by_thread.get(threading.get_ident())
        if interceptor is None:
            return original(model, *args, **kwargs)
        return interceptor.around_fit(original, model, args, kwargs)

    return fit


def _wrap(model_class: type) -> None:
    """Wraps `model_class.fit` (under `_lock`), once."""
    if any(cls is model_class for cls, _fit, _own in _wrapped):
        return
    original = model_class.fit
    _wrapped.append((model_class, original, "fit" in vars(model_class)))
    model_class.fit = _wrapper(original)


def _unwrap_all() -> None:
    """Puts every wrapped `fit` back (under `_lock`), newest first."""
    while _wrapped:
        model_class, original, had_own_fit = _wrapped.pop()
        if had_own_fit:
            model_class.fit = original
        else:
            del model_class.fit  # back to the inherited trainer's fit


def _model_class(module) -> type | None:
    model_class = getattr(module, "Model", None)
    return model_class if isinstance(model_class, type) else None


def _wrap_imported(module) -> None:
    """Wraps ``Model.fit`` of `module` (``keras``, ``tf_keras``) as it is imported, if runs are still active."""
    model_class = _model_class(module)
    with _lock:
        if _by_thread and model_class is not None:
            _wrap(model_class)


class _KerasWatch(importlib.abc.MetaPathFinder):
    """On ``sys.meta_path`` while runs are active and Keras or ``tf_keras``
    is not imported: lets its import run as usual, then wraps its `fit`."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _KERAS_MODULES:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None and spec.loader is not None:
                spec.loader = _WrappingLoader(spec.loader)
                return spec
        return None


class _WrappingLoader(importlib.abc.Loader):
    """The module's own loader, then `_wrap_imported` on the loaded module."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self._loader  # the module keeps its own loader
        self._loader.exec_module(module)
        _wrap_imported(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


_watch = _KerasWatch()


class intercept_fit:
    """Context manager: the calling thread's `fit` calls go through `interceptor`.

    Args:
        interceptor: The run.
    """

    def __init__(self, interceptor: FitInterceptor):
        self._interceptor = interceptor

    def __enter__(self):
        with _lock:
            if not _by_thread:
                imported = [_model_class(sys.modules.get(name)) for name in _KERAS_MODULES]
                for model_class in imported:
                    if model_class is not None:
                        _wrap(model_class)
                if None in imported:
                    sys.meta_path.insert(0, _watch)
            _by_thread[threading.get_ident()] = self._interceptor
        return self

    def __exit__(self, *exc_info):
        with _lock:
            _by_thread.pop(threading.get_ident(), None)
            if not _by_thread:
                if _watch in sys.meta_path:
                    sys.meta_path.remove(_watch)
                _unwrap_all()
        return False
