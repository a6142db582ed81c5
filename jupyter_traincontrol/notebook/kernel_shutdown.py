"""Kernel shutdown and restart: SIGTERM waits while active runs write their last checkpoint.

jupyter_client ends a kernel it asked to shut down (a restart first
interrupts it) with SIGTERM after half of its ``shutdown_wait_time`` (5 s
by default) and SIGKILL at the end of it. A kernel that has trained a
TensorFlow model does not exit by itself within the first half: its
interpreter takes seconds to finalize, so SIGTERM, 2.5 s after the request,
is what ends it, and ends a checkpoint being written with it.

`SigtermHold` installs a SIGTERM handler (main thread, at load) that, while
`holding` (the extension's ``do_shutdown`` waits for active runs to stop),
only notes the signal; when the wait ends, a noted SIGTERM is delivered
again, and the kernel ends as it would have. Outside a hold the handler
does what the previous disposition did: with the default one, the process
ends at once, as without the extension. So a stop checkpoint gets until
SIGKILL instead of until SIGTERM.

Example:

>>> hold = SigtermHold(); hold.install()      # main thread  # doctest: +SKIP
>>> with hold.holding():                       # any thread   # doctest: +SKIP
...     stop_runs(active_runs(), 4.5)
>>> hold.uninstall()                           # main thread  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

__all__ = ["SigtermHold"]


class SigtermHold:
    """Holds SIGTERM back while the kernel waits for runs to stop."""

    def __init__(self):
        self._previous = None
        self._installed = False
        self._holding = False
        self._held = False

    @property
    def installed(self) -> bool:
        """True between `install` and `uninstall`."""
        return self._installed

    def install(self) -> None:
        """Installs the handler. Main thread only."""
        if self._installed:
            return
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("SigtermHold.install must run on the main thread.")
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True

    def uninstall(self) -> None:
        """Puts the previous SIGTERM disposition back. Main thread only. Idempotent."""
        if not self._installed:
            return
        self._installed = False
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """While inside, SIGTERM is noted, not acted on; on leaving, a
        SIGTERM noted meanwhile is delivered again. Any thread."""
        self._holding, self._held = True, False
        try:
            yield
        finally:
            self._holding = False
            if self._held and self._installed:
                os.kill(os.getpid(), signal.SIGTERM)  # handled as outside a hold: the kernel ends

    def _on_sigterm(self, signum, frame) -> None:
        if self._holding:
            self._held = True
            return
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:  # the default: end now, as without the extension
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
