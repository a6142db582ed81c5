"""SIGTERM in a training process: stop with a checkpoint, then end as SIGTERM asks.

``docker stop``, Kubernetes, systemd, SLURM preemption, a spot instance's
notice and ``torchrun`` all end a process with SIGTERM, then SIGKILL a
while later (``torchrun``: 30 s). `SigtermStop` is installed by
`ControlCallback` and `TrainLoop` while they train on the main thread of a
plain process (a kernel keeps its shutdown path, a job its agreed stop):

- the first SIGTERM asks the run to stop (at the next boundary, with a
  checkpoint) and says so in one line on stderr. Training ends the usual
  way (`fit` returns, every callback's ``on_train_end`` runs); then
  `deliver` hands the signal on: to the handler the user had installed
  (chained: it decides what happens next), or, with the default
  disposition, the process ends killed by SIGTERM, as it was asked to;
- a second SIGTERM ends the process at once (handed on as without us);
- if the stop takes longer than ``grace`` seconds (a step that never ends,
  a disk that hangs), `check_grace` (called by the run's own thread) ends
  the process with exit status 143, saying so.

Handlers are installed and restored in pairs (`signals.ChainedHandler`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable

from .signals import ChainedHandler, write_stderr

__all__ = ["SigtermStop", "DEFAULT_SIGTERM_GRACE", "SIGTERM_EXIT_STATUS", "check_sigterm_grace"]

#: Seconds a stop asked for by SIGTERM may take before the process ends at
#: once: well inside ``torchrun``'s 30 s between SIGTERM and SIGKILL.
DEFAULT_SIGTERM_GRACE = 20.0
#: The exit status of a process that SIGTERM ended (128 + 15), as a shell shows it.
SIGTERM_EXIT_STATUS = 128 + signal.SIGTERM


def check_sigterm_grace(seconds) -> float:
    """`seconds` as a grace period.

    Raises:
        ValueError: For anything but a number of seconds above 0.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ValueError(f"sigterm_grace must be a number of seconds above 0, got {seconds!r}.")
    return float(seconds)


class SigtermStop(ChainedHandler):
    """A SIGTERM handler for the life of a training, chained to the previous one.

    Args:
        on_first: Called in the signal handler for the first SIGTERM: asks
            the run to stop (no locks, no blocking I/O).
        grace: Seconds the stop may take before the process ends at once.
        unit: What the stop comes after (``batch``, ``item``), for the message.
        exit_now: Ends the process (tests pass their own). Defaults to
            ``os._exit``.
    """

    signum = signal.SIGTERM
    restores_on_main = True  # a run that ends off the main thread (its fit raised) puts SIGTERM back at once

    def __init__(self, on_first: Callable[[], None], grace: float = DEFAULT_SIGTERM_GRACE, unit: str = "batch",
                 exit_now: Callable[[int], None] = os._exit):
        super().__init__()
        self._on_first = on_first
        self.grace = check_sigterm_grace(grace)
        self._unit = unit
        self._exit_now = exit_now
        self._deadline: float | None = None  # when the first SIGTERM's stop runs out of time
        self._delivered = threading.Event()

    def install(self) -> bool:
        """Installs the handler (main thread), unless SIGTERM is ignored, is
        handled from C (JAX's preemption service), or belongs to a kernel's
        shutdown or a job (`governed`).

        Returns:
            True if installed.
        """
        if self.governed():
            return False
        return super().install()

    @property
    def received(self) -> bool:
        """True once a SIGTERM asked this training to stop."""
        return self._deadline is not None

    def handle(self, signum, frame) -> None:
        if self._deadline is None:
            self._deadline = time.monotonic() + self.grace
            write_stderr(f"\n[traincontrol] SIGTERM: stopping after this {self._unit}, with a checkpoint; the "
                         f"process then ends as SIGTERM asks (a second SIGTERM, or {self.grace:g} s, ends it at once).\n")
            self._on_first()
            return
        write_stderr("\n[traincontrol] A second SIGTERM: ending the process now.\n")
        self._delivered.set()
        self.pass_on(signum, frame)

    def check_grace(self) -> None:
        """Ends the process if the stop a SIGTERM asked for outlived the
        grace period (any thread: the run's, twice a second)."""
        deadline = self._deadline
        if deadline is None or self._delivered.is_set() or time.monotonic() < deadline:
            return
        self._delivered.set()
        write_stderr(f"\n[traincontrol] SIGTERM: the stop took longer than {self.grace:g} s; ending the process now "
                     f"(exit status {SIGTERM_EXIT_STATUS}).\n")
        self._exit_now(SIGTERM_EXIT_STATUS)

    def deliver(self) -> None:
        """Training has ended after a SIGTERM: puts the previous handler back
        and raises SIGTERM again for it (main thread). With the default
        disposition the process ends here, killed by SIGTERM; a handler of
        the user's runs as the interpreter's next step."""
        if self._delivered.is_set():
            return
        self._delivered.set()
        self.uninstall()
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            write_stderr("[traincontrol] SIGTERM: the run has stopped; ending the process.\n")
        signal.raise_signal(signal.SIGTERM)
