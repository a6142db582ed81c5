"""What keeps a training from being lost: Ctrl+C, SIGTERM and autosave, wired once for every driver.

`Safeguards` is opened by a training session (a `fit`'s, a loop's) on its
`contextlib.ExitStack`, and closed with it (a ``with ControlCallback(...)``
block's run opens one for SIGTERM alone, for the whole block):

- Ctrl+C (`system.sigint.SigintGuard`): the first stops with a checkpoint,
  the second raises `KeyboardInterrupt`;
- SIGTERM (`system.sigterm.SigtermStop`): a stop with a checkpoint (reason
  ``interrupt``; the run ends ``interrupt``, its log says SIGTERM), then
  the process ends as SIGTERM asks once the driver has returned
  (`deliver_sigterm`), unless a handler of the user's decides otherwise;
- autosave: the run's own thread ticks the saves' autosave clock
  (`saves.SaveScheduler.tick_autosave`) and the SIGTERM grace period.

Signal handlers go in only on the main thread of a process that is not a
job's (a job agrees its own stop) nor a kernel's (its shutdown path).
"""

from __future__ import annotations

import contextlib
from typing import Callable

from ..protocol import Command, RunState
from ..system.sigint import SigintGuard, graceful_stop
from ..system.signals import on_main_thread
from ..system.sigterm import DEFAULT_SIGTERM_GRACE, SigtermStop
from .port import RunPort
from .saves import SaveScheduler

__all__ = ["Safeguards", "DEFAULT_AUTOSAVE_SECONDS", "check_autosave"]

#: The default autosave interval: ten minutes of training (its cost, measured
#: in `docs/performance.md`, is well under 1 % of a fit at this interval).
DEFAULT_AUTOSAVE_SECONDS = 600.0


def check_autosave(seconds) -> float | None:
    """`seconds` as an autosave interval (None for 0 or None: off).

    Raises:
        ValueError: For anything but a number of seconds of at least 0.
    """
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
        raise ValueError(f"autosave must be a number of seconds (0 turns it off), got {seconds!r}.")
    return float(seconds) or None


class Safeguards:
    """Ctrl+C, SIGTERM and autosave for one training.

    Args:
        run: The run (its ``send``, ``state`` and ``publisher``).
        saves: The training's checkpoints (the autosave clock); None: no autosave.
        note_interrupt: Marks the next stop's checkpoint reason ``interrupt``.
        unit: What a stop comes after (``batch``, ``item``), for messages.
        sigint: Install the Ctrl+C guard (main thread only).
        sigterm: Install the SIGTERM stop (main thread only).
        sigterm_grace: Seconds a SIGTERM's stop may take.
        on_second_sigint: Called for a second Ctrl+C (see `SigintGuard`).
    """

    def __init__(self, run: RunPort, saves: SaveScheduler | None, note_interrupt: Callable[[], None], unit: str, *,
                 sigint: bool, sigterm: bool, sigterm_grace: float = DEFAULT_SIGTERM_GRACE,
                 on_second_sigint: Callable[[bool], None] | None = None):
        self._run = run
        self._saves = saves
        self._note_interrupt = note_interrupt
        self._unit = unit
        self._sigint = sigint
        self._sigterm: SigtermStop | None = (
            SigtermStop(self._stop_by("sigterm"), sigterm_grace, unit) if sigterm else None)
        self._on_second_sigint = on_second_sigint

    def open(self, stack: contextlib.ExitStack) -> None:
        """Installs what applies, each undone by `stack` (the session's)."""
        if self._sigint:
            guard = SigintGuard(self._stop_by("sigint"), self._on_second_sigint)
            if guard.install():
                stack.callback(guard.retire)
        sigterm = self._sigterm
        if sigterm is not None and sigterm.install():
            stack.callback(self._retire_sigterm)
        else:
            self._sigterm = None
        publisher = getattr(self._run, "publisher", None)
        autosaves = self._saves is not None and self._saves.autosave_every is not None
        if publisher is not None and (autosaves or self._sigterm is not None):
            publisher.add_tick_hook(self._tick)
            stack.callback(publisher.remove_tick_hook, self._tick)

    @property
    def sigterm_received(self) -> bool:
        """True once a SIGTERM asked this training to stop."""
        return self._sigterm is not None and self._sigterm.received

    def deliver_sigterm(self, after: Callable[[Callable[[], None]], bool] | None = None) -> None:
        """Once the training has ended (the session closed), on the main
        thread: hands a SIGTERM that stopped it on to the handler it replaced
        (with the default one, the process ends, killed by SIGTERM).

        Args:
            after: Arranges for its argument to be called later (when the
                driver has returned: `fit`'s frame) and returns True, or
                returns False to have it called now.
        """
        sigterm = self._sigterm
        if sigterm is None or not sigterm.received:
            return
        if after is None or not after(sigterm.deliver):
            sigterm.deliver()

    def _stop_by(self, sender: str) -> Callable[[], None]:
        return graceful_stop(self._note_interrupt, lambda: self._run.send(Command.STOP, sender=sender), self._unit,
                             say=sender == "sigint")

    def _tick(self) -> None:
        """The run's thread, twice a second."""
        if self._saves is not None:
            self._saves.tick_autosave(self._run.state is RunState.RUNNING)
        if self._sigterm is not None:
            self._sigterm.check_grace()

    def _retire_sigterm(self) -> None:
        # After a SIGTERM, on the main thread, it stays until `deliver_sigterm` hands the signal on; a
        # training that ends elsewhere (its fit raised) raises into the user's code, which decides.
        if not (self.sigterm_received and on_main_thread()):
            self._sigterm.retire()
