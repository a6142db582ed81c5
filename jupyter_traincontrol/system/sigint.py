"""Ctrl+C in a plain script: the first press stops gracefully, the second raises.

`SigintGuard` is installed by `ControlCallback` and `TrainLoop` when
training runs on the main thread, and retired when it ends. The first
SIGINT only calls a function that asks the run to stop (safe in a signal
handler: no locks, no I/O that can block); a second SIGINT hands the
signal to the previous handler, which for Python's default handler raises
`KeyboardInterrupt` as usual. Python may swallow that exception (where the
handler ran inside a garbage-collector callback, as JAX's are), so the run
is told too (``on_second``), and its next boundary raises it again.

A run that ends off the main thread (its `fit` raised, and the run's own
thread noticed) retires its guard (`system.signals.ChainedHandler`, which
`restores_on_main`): the guard turns inert at once and asks the main
thread to put the previous handler back. A real Ctrl+C that comes first is
handed on to the previous handler, as without us.
"""

from __future__ import annotations

import signal
from typing import Callable

from .signals import ChainedHandler, write_stderr

__all__ = ["SigintGuard", "graceful_stop"]


def graceful_stop(note_interrupt: Callable[[], None], send_stop: Callable[[], object], unit: str,
                  say: bool = True) -> Callable[[], None]:
    """The first Ctrl+C of a training, as `SigintGuard`'s ``on_first``: marks
    the next stop as an interrupt's, asks for it, and says so on stderr
    (written directly: ``sys.stdout`` is not reentrant in a signal handler).

    Args:
        note_interrupt: Marks the next stop's checkpoint reason ``interrupt``.
        send_stop: Sends the run ``stop`` (an error means the run has ended: nothing to stop).
        unit: What the stop comes after (``batch``, ``item``), for the message.
        say: Write the Ctrl+C message (False: the caller says its own).
    """

    def on_first() -> None:
        note_interrupt()
        try:
            send_stop()
        except Exception:  # the run ended meanwhile: nothing to stop
            pass
        if say:
            write_stderr(f"\n[traincontrol] Ctrl+C: stopping after this {unit}, with a checkpoint. "
                         "Press Ctrl+C again to interrupt at once.\n")

    return on_first


class SigintGuard(ChainedHandler):
    """Swaps in a SIGINT handler for the life of a run, and restores it.

    Args:
        on_first: Called (on the main thread) for the first SIGINT.
        on_second: Called just before the second SIGINT is handed to the
            previous handler, with True when that handler raises
            `KeyboardInterrupt` (Python's own, or the default disposition).
    """

    signum = signal.SIGINT
    restores_on_main = True

    def __init__(self, on_first: Callable[[], None], on_second: Callable[[bool], None] | None = None):
        super().__init__()
        self._on_first = on_first
        self._on_second = on_second or (lambda raises: None)
        self.count = 0

    def _installing(self) -> None:
        self.count = 0

    def handle(self, signum, frame) -> None:
        self.count += 1
        if self.count == 1:
            self._on_first()
            return
        previous = self.previous
        try:
            self._on_second(previous is signal.default_int_handler or not callable(previous))
        finally:
            self.pass_on(signum, frame)

    def default_action(self, signum, frame) -> None:
        raise KeyboardInterrupt  # what Python's own handler would do
