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

`ShutdownHook` wraps the kernel's ``do_shutdown``: active runs are sent
``stop`` (by ``shutdown``: they end ``kernel-restart``) and waited for,
SIGTERM held meanwhile; then the kernel shuts down as it would have.

Example:

>>> hook = ShutdownHook(kernel, grace=lambda: 4.5); hook.install()   # main thread  # doctest: +SKIP
>>> hook.uninstall()                                                 # main thread  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Callable, Iterator

from ..system.signals import ChainedHandler, on_main_thread
from .run import TrainingRun, active_runs

__all__ = ["SigtermHold", "ShutdownHook", "stop_runs"]


def stop_runs(runs: list[TrainingRun], timeout: float, sender: str = "notebook") -> list[TrainingRun]:
    """Sends ``stop`` to `runs` and waits until they end or `timeout` passes.

    Args:
        runs: The runs.
        timeout: Seconds to wait at most, for all of them.
        sender: Who stops them, for the request ids (``shutdown``: the
            kernel's; the runs then end ``kernel-restart``).

    Returns:
        The runs that had not ended in time.
    """
    for run in runs:
        if sender == "shutdown":
            run.note_shutdown()
        try:
            run.send("stop", sender=sender)
        except OSError:
            pass  # it ended meanwhile
    deadline = time.monotonic() + timeout
    for run in runs:
        run.wait(max(0.0, deadline - time.monotonic()))
    return [run for run in runs if run.active]


class SigtermHold(ChainedHandler):
    """Holds SIGTERM back while the kernel waits for runs to stop."""

    signum = signal.SIGTERM
    takes_ignored = True  # installed whatever the disposition; an ignored SIGTERM stays ignored
    governs_exit = True  # a fit on the kernel's main thread keeps the kernel's shutdown path

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


class ShutdownHook:
    """The kernel's ``do_shutdown``, wrapped: active runs stop first, SIGTERM held.

    Args:
        kernel: The ipykernel kernel.
        grace: Returns how many seconds to wait for the runs (read at each
            shutdown: a traitlet may change).
    """

    def __init__(self, kernel, grace: Callable[[], float]):
        self.kernel = kernel
        self.grace = grace
        self.sigterm = SigtermHold()
        self._original = None

    def install(self) -> None:
        """Installs the SIGTERM handler and the wrapper. Main thread only."""
        self.sigterm.install()
        self._original = self.kernel.__dict__.get("do_shutdown")
        original, hold = self.kernel.do_shutdown, self.sigterm

        def do_shutdown(restart):
            runs = active_runs()
            if runs:
                with hold.holding():
                    stop_runs(runs, self.grace(), sender="shutdown")
            return original(restart)

        self.kernel.do_shutdown = do_shutdown

    def uninstall(self) -> None:
        """Puts back the kernel's own ``do_shutdown`` and SIGTERM handler. Main thread only."""
        self.sigterm.uninstall()
        if self._original is None:
            self.kernel.__dict__.pop("do_shutdown", None)
        else:
            self.kernel.do_shutdown = self._original
