"""The run's ticker thread: publishes progress about twice a second, and runs tick hooks.

`Publisher` is the run's own named thread, ``traincontrol-publisher-NAME``:
about twice a second it runs the run's tick hooks (a watchdog), asks the
run to publish its record if it changed (`RunLifecycle.publish`, which
writes at most twice a second), and tells the listeners (the panels) when
it did.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

__all__ = ["Publisher", "PUBLISH_INTERVAL_SECONDS"]

logger = logging.getLogger("jupyter_traincontrol")

PUBLISH_INTERVAL_SECONDS = 0.5


class Publisher:
    """Ticks for one run.

    Args:
        name: The run's name (for the thread).
        publish: Writes the record if it changed; returns True if it did.
        on_published: Called after each write from this thread.
    """

    def __init__(self, name: str, publish: Callable[[], bool], on_published: Callable[[], None] | None = None):
        self.name = name
        self._publish = publish
        self._on_published = on_published or (lambda: None)
        self._tick_hooks: list[Callable[[], None]] = []
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def add_tick_hook(self, hook: Callable[[], None]) -> None:
        """Calls `hook()` from the publisher thread about twice a second."""
        self._tick_hooks.append(hook)

    def remove_tick_hook(self, hook: Callable[[], None]) -> None:
        """Undoes `add_tick_hook`."""
        if hook in self._tick_hooks:
            self._tick_hooks.remove(hook)

    def start(self) -> None:
        """Starts the publisher thread."""
        self._closing.clear()
        self._thread = threading.Thread(target=self._run, name=f"traincontrol-publisher-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread and waits for it (unless called from it). Idempotent."""
        self._closing.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while not self._closing.wait(PUBLISH_INTERVAL_SECONDS):
            for hook in list(self._tick_hooks):
                try:
                    hook()
                except Exception:
                    logger.exception("A run tick hook failed")
            if self._publish():
                self._on_published()
