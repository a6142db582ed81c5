"""Notice a `fit` that left by an exception, when Keras skips ``on_train_end``.

When `fit` raises (a shape error, a failing callback, a ``KeyboardInterrupt``),
Keras calls no callback on the way out, so whatever ``on_train_begin`` set
up (the run's FIFO, record, folder lock, signal handler) would stay.
`FitWatchdog` remembers the frame of the `fit` call; the run's publisher
thread checks it twice a second, and a new run in this process checks it at
once, so a run whose `fit` is gone is ended (``failed``) without delay.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Callable

__all__ = ["FitWatchdog", "check_all"]

_watching: "weakref.WeakSet[FitWatchdog]" = weakref.WeakSet()


class FitWatchdog:
    """Notices a `fit` that left by an exception (Keras then skips
    ``on_train_end``).

    Args:
        model: The model whose `fit` called the callback's first hook.
        on_lost: Called once the `fit` frame is no longer on its thread's stack.
    """

    def __init__(self, model, on_lost: Callable[[], None]):
        self._thread_id = threading.get_ident()
        self._frame = _find_fit_frame(model)
        self._on_lost = on_lost
        _watching.add(self)

    def check(self) -> None:
        """Calls `on_lost` (once) if the `fit` call has left its thread's stack."""
        if self._frame is None:
            return
        frame = sys._current_frames().get(self._thread_id)
        while frame is not None:
            if frame is self._frame:
                return
            frame = frame.f_back
        self._frame = None
        self._on_lost()


def check_all() -> None:
    """Checks every watched `fit` of this process now (before a new run
    claims its name: an earlier run whose `fit` raised is ended first)."""
    for watchdog in list(_watching):
        watchdog.check()


def _find_fit_frame(model):
    """Returns the frame of the `fit` call that is training `model`, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            return frame
        frame = frame.f_back
    return None
