"""Which callback of the user's ended a `fit` early, by setting ``model.stop_training``.

Keras ends `fit` after the step (or epoch) where a callback sets
``stop_training``, and says nothing of who did. `stopping_callback` names
it from the callbacks' own state: Keras's `EarlyStopping` records the epoch
it stopped at (``stopped_epoch``), as does any callback that keeps the
same attribute; `TerminateOnNaN` keeps none, so it is named when it is
the only other candidate in the list.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["stopping_callback"]

#: Callbacks that stop `fit` and keep no record of it.
_STOPPERS_WITHOUT_STATE = ("TerminateOnNaN",)


def stopping_callback(callbacks: Iterable[Any], exclude: Any = None) -> str | None:
    """The class name of the callback that set ``stop_training``, or None if
    that cannot be told.

    Args:
        callbacks: The `fit`'s callbacks.
        exclude: One to leave out (this package's own).
    """
    candidates = [callback for callback in callbacks if callback is not exclude]
    for callback in candidates:
        stopped = getattr(callback, "stopped_epoch", 0)
        if isinstance(stopped, int) and not isinstance(stopped, bool) and stopped > 0:
            return type(callback).__name__
    stateless = [callback for callback in candidates if type(callback).__name__ in _STOPPERS_WITHOUT_STATE]
    return type(stateless[0]).__name__ if len(stateless) == 1 else None
