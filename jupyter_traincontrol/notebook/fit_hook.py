"""Add a run's control callback to every `fit` called on its training thread.

The cell of ``%%interruptible_fit`` may call ``fit`` directly or through the
user's own functions, so the magic cannot guess from the cell's text.
Instead, while any run is active, ``keras.Model.fit`` is wrapped: a call made
on a thread that belongs to a run gets that run's callback added (and, unless
the user passed ``verbose``, Keras's text progress bar is turned off: the
panel shows progress). Calls from other threads are untouched. The wrapper is
installed on first use and removed when the last run ends.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

__all__ = ["FitInterceptor", "intercept_fit"]

_lock = threading.Lock()
_by_thread: dict[int, "FitInterceptor"] = {}
_original_fit: Callable | None = None
_had_own_fit = False


class FitInterceptor:
    """What a run does around each `fit` on its thread.

    Subclasses (the run) implement `around_fit`.
    """

    def around_fit(self, fit: Callable, model, args: tuple, kwargs: dict) -> Any:
        """Calls ``fit(model, *args, **kwargs)`` with whatever the run adds."""
        raise NotImplementedError


def _wrapped_fit(model, *args, **kwargs):
    interceptor = _by_thread.get(threading.get_ident())
    if interceptor is None:
        return _original_fit(model, *args, **kwargs)
    return interceptor.around_fit(_original_fit, model, args, kwargs)


class intercept_fit:
    """Context manager: the calling thread's `fit` calls go through `interceptor`.

    Args:
        interceptor: The run.
    """

    def __init__(self, interceptor: FitInterceptor):
        self._interceptor = interceptor

    def __enter__(self):
        import keras

        global _original_fit, _had_own_fit
        with _lock:
            if not _by_thread:
                _had_own_fit = "fit" in vars(keras.Model)
                _original_fit = keras.Model.fit
                keras.Model.fit = functools.wraps(_original_fit)(_wrapped_fit)
            _by_thread[threading.get_ident()] = self._interceptor
        return self

    def __exit__(self, *exc_info):
        import keras

        global _original_fit
        with _lock:
            _by_thread.pop(threading.get_ident(), None)
            if not _by_thread and _original_fit is not None:
                if _had_own_fit:
                    keras.Model.fit = _original_fit
                else:
                    del keras.Model.fit  # back to the inherited trainer's fit
                _original_fit = None
        return False
