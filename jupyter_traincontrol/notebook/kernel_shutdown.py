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
from typing import Iterator

from ..system.signals import ChainedHandler, on_main_thread

__all__ = ["SigtermHold"]


class SigtermHold(ChainedHandler):
    """Holds SIGTERM back while the kernel waits for runs to stop."""

    signum = signal.SIGTERM
    takes_ignored = True  # installed whatever the disposition; an ignored SIGTERM stays ignored

    def __init__(self):
        super().__init__()
        self._holding = False
        self._held = False

    def install(self) -> bool:
        """Installs the handler. Main thread only."""
        if not on_main_thread():
            raise RuntimeError("SigtermHold.install must run on the main thread.")
        return super().install()

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """While inside, SIGTERM is noted, not acted on; on leaving, a
        SIGTERM noted meanwhile is delivered again. Any thread."""
        self._holding, self._held = True, False
        try:
            yield
        finally:
            self._holding = False
            if self._held and self.installed:
                os.kill(os.getpid(), signal.SIGTERM)  # handled as outside a hold: the kernel ends

    def handle(self, signum, frame) -> None:
        if self._holding:
            self._held = True
            return
        previous = self.previous
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:  # the default: end now, as without the extension
            self.default_action(signum, frame)
