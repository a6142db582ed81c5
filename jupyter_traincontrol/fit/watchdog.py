"""Notice a `fit` that left by an exception, when Keras skips ``on_train_end``.

When `fit` raises (a shape error, a failing callback, a ``KeyboardInterrupt``),
Keras calls no callback on the way out, so whatever ``on_train_begin`` set
up (the run's FIFO, record, folder lock, signal handler) would stay.
`FitWatchdog` remembers the frame of the `fit` call; the run's thread (its
channel's reader, ticking the publisher) checks it twice a second, and a new
run in this process checks it at once, so a run whose `fit` is gone is ended
(``failed``) without delay.
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable

from ..system.frames import fit_frame, on_stack

__all__ = ["FitWatchdog", "check_all"]

_watching: "weakref.WeakSet[FitWatchdog]" = weakref.WeakSet()


class FitWatchdog:
    """Notices a `fit` that left by an exception (Keras then skips
    ``on_train_end``).

    Attributes:
        thread_id: The thread of the `fit` call.
        frame: Its frame, while on that thread's stack (None once gone, or
            if it was not found).

    Args:
        model: The model whose `fit` called the callback's first hook.
        on_lost: Called once the `fit` frame is no longer on its thread's stack.
    """

    def __init__(self, model, on_lost: Callable[[], None]):
        self.thread_id = threading.get_ident()
        self.frame = fit_frame(model)
        self._on_lost = on_lost
        _watching.add(self)

    def check(self) -> None:
        """Calls `on_lost` (once) if the `fit` call has left its thread's stack."""
        if self.frame is None or on_stack(self.thread_id, self.frame):
            return
        self.frame = None
        _watching.discard(self)
        self._on_lost()

    def stop(self) -> None:
        """The `fit` ended the Keras way: nothing more to watch. Idempotent."""
        self.frame = None
        _watching.discard(self)


def check_all() -> None:
    """Checks every watched `fit` of this process now (before a new run
    claims its name: an earlier run whose `fit` raised is ended first)."""
    for watchdog in list(_watching):
        watchdog.check()
