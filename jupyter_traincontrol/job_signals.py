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
import threading
from typing import Callable

__all__ = ["SigtermRelay", "PreemptionNotice", "PREEMPTION_NOTICE_KEY"]

#: The key JAX's preemption sync manager sets when any process got SIGTERM.
PREEMPTION_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"


class PreemptionNotice:
    """Notices a new preemption notice in the key-value store (one seen
    before the run began does not count)."""

    def __init__(self, client):
        self.client = client
        self._before = self._read()

    def _read(self) -> str | None:
        try:
            return self.client.key_value_try_get(PREEMPTION_NOTICE_KEY)
        except Exception:  # NOT_FOUND: no notice yet
            return None

    def check(self) -> bool:
        """True once, the first time a new notice is seen."""
        value = self._read()
        if value is None or value == self._before:
            return False
        self._before = value
        return True


class SigtermRelay:
    """A SIGTERM handler for the life of a run, chained to the previous one.

    Args:
        on_sigterm: Called in the signal handler (no locks, no blocking I/O).
    """

    def __init__(self, on_sigterm: Callable[[], None]):
        self._on_sigterm = on_sigterm
        self._previous = None
        self._installed = False
        self._retired = False

    def install(self) -> bool:
        """Installs the handler if this is the main thread and SIGTERM is
        neither ignored nor handled from C. Returns True if installed."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            return False
        _restore_retired()
        previous = signal.getsignal(signal.SIGTERM)
        if previous in (signal.SIG_IGN, None):
            return False
        self._previous, self._retired = previous, False
        signal.signal(signal.SIGTERM, self._handle)
        self._installed = True
        return True

    def retire(self) -> None:
        """Ends the relay's work, from any thread: on the main thread the
        previous handler is put back now; elsewhere the relay turns inert
        and the next SIGTERM (or the next relay installed) puts it back."""
        if not self._installed:
            return
        if threading.current_thread() is threading.main_thread():
            self._uninstall()
        else:
            self._retired = True
            _retired.add(self)

    def _uninstall(self) -> None:
        self._installed = False
        _retired.discard(self)
        if signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, self._previous)

    def _handle(self, signum, frame):
        previous = self._previous
        if self._retired:  # the run is over: as if we had never been here
            self._uninstall()
            if callable(previous):
                previous(signum, frame)
            else:
                signal.raise_signal(signum)
            return
        self._on_sigterm()
        if callable(previous):
            previous(signum, frame)


_retired: set[SigtermRelay] = set()


def _restore_retired() -> None:
    for relay in list(_retired):
        relay._uninstall()
