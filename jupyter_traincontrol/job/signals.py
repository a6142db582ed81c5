"""SIGTERM on any process of a job: a graceful stop that every process applies.

A scheduler that preempts a job sends SIGTERM. Two cases:

- JAX's preemption service is on (the default after
  ``jax.distributed.initialize``): its own SIGTERM handler (installed from
  C++, so Python's ``signal.getsignal`` does not show it) propagates a
  notice through the coordination service's key-value store, under
  `PREEMPTION_NOTICE_KEY`, for ``multihost_utils.reached_preemption_sync_point``.
  We leave that handler alone and watch the key: process 0 proposes
  ``stop`` when it appears (`PreemptionNotice`).
- Otherwise `SigtermRelay` installs a Python handler for the life of the
  run (main thread only), which sends ``stop`` and then calls the handler
  it replaced, if that was a Python function; the previous handler is put
  back when the run ends.
"""

from __future__ import annotations

import signal
from typing import Callable

from ..system.signals import ChainedHandler

__all__ = ["SigtermRelay", "PreemptionNotice", "PREEMPTION_NOTICE_KEY"]

#: The key JAX's preemption sync manager sets when any process got SIGTERM.
PREEMPTION_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"


class PreemptionNotice:
    """Notices a new preemption notice in the key-value store (one seen
    before the run began does not count).

    Args:
        try_get: Reads a key now (None if it is not set).
    """

    def __init__(self, try_get: Callable[[str], str | None]):
        self._try_get = try_get
        self._before = try_get(PREEMPTION_NOTICE_KEY)

    def check(self) -> bool:
        """True once, the first time a new notice is seen."""
        value = self._try_get(PREEMPTION_NOTICE_KEY)
        if value is None or value == self._before:
            return False
        self._before = value
        return True


class SigtermRelay(ChainedHandler):
    """A SIGTERM handler for the life of a run, chained to the previous one.

    Args:
        on_sigterm: Called in the signal handler (no locks, no blocking I/O).
    """

    signum = signal.SIGTERM
    governs_exit = True  # the job's agreed stop: a training's own SIGTERM stop stays out

    def __init__(self, on_sigterm: Callable[[], None]):
        super().__init__()
        self._on_sigterm = on_sigterm

    def handle(self, signum, frame) -> None:
        self._on_sigterm()
        previous = self.previous
        if callable(previous):
            previous(signum, frame)
