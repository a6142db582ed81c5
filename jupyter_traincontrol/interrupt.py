"""Ctrl+C in a plain script: the first press stops gracefully, the second raises.

`SigintGuard` is installed by `ControlCallback` when `fit` runs on the main
thread, and restored when `fit` ends. The first SIGINT only calls a function
that asks the run to stop (safe in a signal handler: no locks, no I/O that
can block); a second SIGINT restores the previous handler and hands the
signal to it, which for Python's default handler raises `KeyboardInterrupt`
as usual.

Signal handlers can only be changed on the main thread. A run that ends
elsewhere (its `fit` raised, and the run's own thread noticed) retires its
guard: the guard turns inert at once and asks the main thread to run it
(``_thread.interrupt_main``: no signal is sent to the process, no system
call is interrupted, and it is asked only while the guard is still the
installed handler); run there, it puts the previous handler back and does
nothing else. A real Ctrl+C that comes first is handed on to the previous
handler, as without us.
"""

from __future__ import annotations

import _thread
import signal
import threading
from typing import Callable

__all__ = ["SigintGuard"]


class SigintGuard:
    """Swaps in a SIGINT handler for the life of a run, and restores it.

    Args:
        on_first: Called (on the main thread) for the first SIGINT.
        on_second: Called just before the second SIGINT is handed to the
            previous handler, for cleanup.
    """

    def __init__(self, on_first: Callable[[], None], on_second: Callable[[], None] | None = None):
        self._on_first = on_first
        self._on_second = on_second or (lambda: None)
        self._previous = None
        self._installed = False
        self._retired = False
        self._restore_asked = False
        self.count = 0

    @property
    def installed(self) -> bool:
        """True while our handler is the process's SIGINT handler."""
        return self._installed

    def install(self) -> bool:
        """Installs the handler if this is the main thread and SIGINT is not
        ignored.

        Returns:
            True if installed.
        """
        if self._installed or threading.current_thread() is not threading.main_thread():
            return False
        _restore_retired()
        previous = signal.getsignal(signal.SIGINT)
        if previous in (signal.SIG_IGN, None):
            return False  # someone wants Ctrl+C ignored (or set it from C)
        self._previous = previous
        self.count = 0
        self._retired = False
        signal.signal(signal.SIGINT, self._handle)
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Restores the previous handler. Idempotent; main thread only.

        If someone replaced our handler meanwhile, theirs is left in place.
        """
        if not self._installed:
            return
        if threading.current_thread() is not threading.main_thread():
            return  # cannot touch signals here: see `retire`
        self._installed = False
        _retired.discard(self)
        if signal.getsignal(signal.SIGINT) == self._handle:
            signal.signal(signal.SIGINT, self._previous)

    def retire(self) -> None:
        """Ends the guard's work, from any thread.

        On the main thread this is `uninstall`. Elsewhere the guard turns
        inert: the next SIGINT (handed on to the previous handler), or the
        next guard installed, restores the previous handler.
        """
        if not self._installed:
            return
        self._retired = True
        if threading.current_thread() is threading.main_thread():
            self.uninstall()
            return
        _retired.add(self)
        if signal.getsignal(signal.SIGINT) == self._handle:
            self._restore_asked = True
            _thread.interrupt_main(signal.SIGINT)

    def _handle(self, signum, frame):
        if self._retired:
            if self._restore_asked:  # our own request (`retire`): only restore
                self._restore_asked = False
                self.uninstall()
            else:  # the run is over: this SIGINT is the user's, as without us
                self._pass_on(signum, frame)
            return
        self.count += 1
        if self.count == 1:
            self._on_first()
            return
        try:
            self._on_second()
        finally:
            self._pass_on(signum, frame)

    def _pass_on(self, signum, frame):
        previous = self._previous
        self.uninstall()
        if callable(previous):
            previous(signum, frame)
        else:  # SIG_DFL: what Python's own handler would do
            raise KeyboardInterrupt


_retired: set[SigintGuard] = set()


def _restore_retired() -> None:
    """Main thread: puts back the handlers of guards retired off the main thread."""
    for guard in list(_retired):
        guard.uninstall()
