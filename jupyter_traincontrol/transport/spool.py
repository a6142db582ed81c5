"""A run's channel without FIFOs (Windows): one small file per command in a private inbox.

Writers create ``<time>-<random>.tmp`` and rename it to ``.cmd``
(`send.deliver`); the reader polls the folder every 10 ms and handles files
in name order, with the same behaviour as a FIFO.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from ..protocol import LineDecoder
from .receiver import CommandChannel

__all__ = ["SpoolChannel", "INBOX_NAME"]

#: The inbox folder's name in a run folder.
INBOX_NAME = "inbox"
_SPOOL_POLL_SECONDS = 0.01


class SpoolChannel(CommandChannel):
    """One file per command in a private inbox folder (no FIFOs needed).

    Writers create ``<time>-<random>.tmp`` and rename it to ``.cmd``; the
    reader polls the folder every 10 ms and handles files in name order.
    """

    kind = "spool"

    def __init__(self, folder: Path, **kwargs):
        super().__init__(folder, **kwargs)
        self.path = self.folder / INBOX_NAME
        os.mkdir(self.path, 0o700)
        self._woken = threading.Event()

    @property
    def address(self) -> str:
        return str(self.path)

    def _read_some(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._closed.is_set():
            try:
                names = sorted(n for n in os.listdir(self.path) if n.endswith(".cmd"))
            except FileNotFoundError:
                return  # `_check_health` re-creates the inbox
            for name in names:
                file = self.path / name
                try:
                    data = file.read_bytes()
                    file.unlink()
                except OSError:
                    continue
                decoder = LineDecoder()
                self._deliver(decoder.feed(data) + decoder.flush())
            if names or time.monotonic() >= deadline or self._woken.is_set():
                self._woken.clear()
                return
            self._woken.wait(min(_SPOOL_POLL_SECONDS, max(0.0, deadline - time.monotonic())))

    def _wake_reader(self) -> None:
        self._woken.set()

    def _check_health(self) -> None:
        if not self.path.is_dir():
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            self.on_notice(f"The inbox {self.path} was deleted; re-created it.")

    def _remove(self) -> None:
        for leftover in self.path.glob("*"):
            leftover.unlink(missing_ok=True)
        try:
            self.path.rmdir()
        except OSError:
            pass
