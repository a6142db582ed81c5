"""The run's ticker thread: publishes progress about twice a second, and runs tick hooks.

`Publisher` is the run's own named thread, ``traincontrol-publisher-NAME``:
about twice a second it runs the run's tick hooks (a watchdog), asks the
run to publish its record if it changed (`RunLifecycle.publish`, which
writes at most twice a second), and tells the listeners (the panels) when
it did. `publish_soon` has it write the record at once, off the caller's
thread (the training thread answers commands that way: writing the record
itself took it 1-3 ms).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

__all__ = ["Publisher", "PUBLISH_INTERVAL_SECONDS"]

logger = logging.getLogger("jupyter_traincontrol")

PUBLISH_INTERVAL_SECONDS = 0.5
#: How long `publish_soon` lets its caller go on before the record is written
#: (writing it takes the interpreter lock for a millisecond or two).
_SOON_DELAY = 0.002


class Publisher:
    """Ticks for one run.

    Args:
        name: The run's name (for the thread).
        publish: Writes the record if it changed; returns True if it did.
        on_published: Called after each write from this thread.
    """

    def __init__(self, name: str, publish: Callable[[bool], bool], on_published: Callable[[], None] | None = None):
        self.name = name
        self._publish = publish
        self._on_published = on_published or (lambda: None)
        self._tick_hooks: list[Callable[[], None]] = []
        self._closing = threading.Event()
        self._wake = threading.Event()  # set by stop and publish_soon
        self._soon = False
        self._thread: threading.Thread | None = None

    def add_tick_hook(self, hook: Callable[[], None]) -> None:
        """Calls `hook()` from the publisher thread about twice a second."""
        self._tick_hooks.append(hook)

    def remove_tick_hook(self, hook: Callable[[], None]) -> None:
        """Undoes `add_tick_hook`."""
        if hook in self._tick_hooks:
            self._tick_hooks.remove(hook)

    def publish_soon(self) -> None:
        """Has the thread write the record now (if it changed). Any thread; cheap."""
        self._soon = True
        self._wake.set()

    @property
    def running(self) -> bool:
        """True while the thread runs."""
        return self._thread is not None

    def start(self) -> None:
        """Starts the publisher thread."""
        self._closing.clear()
        self._thread = threading.Thread(target=self._run, name=f"traincontrol-publisher-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread and waits for it (unless called from it). Idempotent."""
        self._closing.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        next_tick = time.monotonic() + PUBLISH_INTERVAL_SECONDS
        while True:
            self._wake.wait(max(0.0, next_tick - time.monotonic()))
            self._wake.clear()
            if self._closing.is_set():
                return
            soon, self._soon = self._soon, False
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + PUBLISH_INTERVAL_SECONDS
                for hook in list(self._tick_hooks):
                    try:
                        hook()
                    except Exception:
                        logger.exception("A run tick hook failed")
            elif not soon:
                continue
            elif self._closing.wait(_SOON_DELAY):  # the caller (the training thread) finishes its boundary first
                return  # the run ends meanwhile: its closing writes the last record (a short `fit` waits for no other)
            if self._publish(soon):
                self._on_published()
