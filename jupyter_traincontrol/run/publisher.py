"""The run's ticker: publishes progress about twice a second, and runs tick hooks.

`Publisher` has no thread of its own: the run's thread
(``traincontrol-reader-NAME``, `run_thread.RunThread`) drives it between two
reads of the run's channel. About twice a second it
runs the run's tick hooks (a watchdog), asks the run to publish its record
if it changed (`RunLifecycle.publish`, which writes at most twice a second),
and tells the listeners (the panels) when it did. `publish_soon` has it
write the record within a few milliseconds, off the caller's thread (the
training thread answers commands that way: writing the record itself took
it 1-3 ms), and `run_soon` has it do other work the caller leaves to it
(freeing the records the training thread replaced).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

__all__ = ["Publisher", "PUBLISH_INTERVAL_SECONDS", "SOON_DELAY_SECONDS"]

logger = logging.getLogger("jupyter_traincontrol")

PUBLISH_INTERVAL_SECONDS = 0.5
#: How long `publish_soon` lets its caller go on before the record is written
#: (writing it takes the interpreter lock for a millisecond or two).
SOON_DELAY_SECONDS = 0.002


class Publisher:
    """Ticks for one run, on the thread that drives it (`due_in`, `tick`).

    Args:
        publish: Writes the record if it changed; returns True if it did.
        on_published: Called after each write from the driving thread.
    """

    def __init__(self, publish: Callable[[bool], bool], on_published: Callable[[], None] | None = None):
        self._publish = publish
        self._on_published = on_published or (lambda: None)
        self._tick_hooks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._wake: Callable[[], None] | None = None  # the driver's: makes its wait return at once
        self._next_tick = 0.0
        self._soon_at: float | None = None  # when a `publish_soon` is due
        self._chores: list[Callable[[], None]] = []  # left by `run_soon` for the driving thread
        self._chores_at: float | None = None  # when they are due

    def add_tick_hook(self, hook: Callable[[], None]) -> None:
        """Calls `hook()` from the driving thread about twice a second."""
        self._tick_hooks.append(hook)

    def remove_tick_hook(self, hook: Callable[[], None]) -> None:
        """Undoes `add_tick_hook`."""
        if hook in self._tick_hooks:
            self._tick_hooks.remove(hook)

    @property
    def running(self) -> bool:
        """True while a thread drives it (between `start` and `stop`)."""
        return self._wake is not None

    def start(self, wake: Callable[[], None]) -> None:
        """Starts ticking; the driver calls `due_in` and `tick` from now on.

        Args:
            wake: Makes the driver's wait end at once (so it asks `due_in`
                again); called by `publish_soon` from any thread.
        """
        with self._lock:
            self._next_tick = time.monotonic() + PUBLISH_INTERVAL_SECONDS
            self._soon_at = self._chores_at = None
            self._chores = []
            self._wake = wake

    def stop(self, then: Callable[[], None] | None = None) -> Callable[[], None]:
        """Stops ticking: a pending `publish_soon` is dropped (the run's
        closing writes the last record: a short `fit` waits for no other).
        Idempotent.

        Args:
            then: A last chore, done after those left.

        Returns:
            What does the chores `run_soon` left undone, then `then`: for
            the caller to have done (by the run's thread, as it ends).
        """
        with self._lock:
            self._wake = None
            self._soon_at = self._chores_at = None
            chores, self._chores = self._chores, []
        return lambda: _do(chores + ([then] if then is not None else []))

    def run_soon(self, chore: Callable[[], None]) -> None:
        """Has the driving thread call `chore()` within `SOON_DELAY_SECONDS` (work
        the caller leaves to it); if the publisher stops first, `stop` returns it. Any thread."""
        with self._lock:
            wake = self._wake
            if wake is None:
                return
            self._chores.append(chore)
            if self._chores_at is None:
                self._chores_at = time.monotonic() + SOON_DELAY_SECONDS
        wake()

    def publish_soon(self) -> None:
        """Has the driving thread write the record within `SOON_DELAY_SECONDS` (if
        it changed). Any thread; cheap."""
        with self._lock:
            wake = self._wake
            if wake is None or self._soon_at is not None:
                return
            self._soon_at = time.monotonic() + SOON_DELAY_SECONDS  # the caller finishes its boundary first
        wake()

    def due_in(self) -> float:
        """Seconds until `tick` has something to do (infinite once stopped)."""
        with self._lock:
            if self._wake is None:
                return float("inf")
            due = min(at for at in (self._next_tick, self._soon_at, self._chores_at) if at is not None)
        return max(0.0, due - time.monotonic())

    def tick(self) -> None:
        """Does what is due: the chores `run_soon` left, the tick hooks and a
        publish every half second, a `publish_soon`'s write when its delay
        has passed. Driving thread only."""
        now = time.monotonic()
        with self._lock:
            if self._wake is None:
                return
            chores: list[Callable[[], None]] = []
            if self._chores_at is not None and now >= self._chores_at:
                chores, self._chores, self._chores_at = self._chores, [], None
            ticking = now >= self._next_tick
            soon = self._soon_at is not None and now >= self._soon_at
            if soon:
                self._soon_at = None
            if ticking:
                self._next_tick = now + PUBLISH_INTERVAL_SECONDS
        _do(chores + (list(self._tick_hooks) if ticking else []))
        if not (ticking or soon):
            return
        try:
            if self.running and self._publish(soon):
                self._on_published()
        except Exception:  # the run's thread reads commands too: it must outlive a failed write
            logger.exception("Publishing the run's record failed")


def _do(chores: list[Callable[[], None]]) -> None:
    """Calls each of `chores`; one that fails is logged, and the next goes on."""
    for work in chores:
        try:
            work()
        except Exception:
            logger.exception("A run tick hook or chore failed")
