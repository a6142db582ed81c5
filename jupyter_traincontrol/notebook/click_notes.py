"""What the notebook panel says of its clicks: each for a few seconds, and every one the run never took.

A click on the panel reaches the run as a comm message that the kernel
reads only between cells. Where the front end sends it through the kernel
(VS Code, Colab, classic Notebook, JupyterLab without the server
extension), a click made while another cell runs waits until that cell
ends, and by then the run may have ended: the interrupt that ended the
cell stopped it, say. Or the run takes the command too late, ending first.
Neither is dropped without a word: the ended panel says, under how the run
ended, which clicks were not applied and why, and so does the run's log.

`ClickNotes` keeps the notices of clicks (``Save: sent 'save'.``, shown
for a few seconds, the last two at most), the requests the panel sent (to
find, once the run has ended, those it never answered), and the clicks
that came after its end. Any thread adds; the panel's monitor reads.
"""

from __future__ import annotations

import collections
import html
import queue
import threading
import time
from typing import Callable

from ..protocol import Request

__all__ = ["ClickNotes"]

#: The requests followed until answered, and the lines of clicks not applied shown.
_SENT_KEPT = 50
_NOT_APPLIED_SHOWN = 5


class ClickNotes:
    """The notices of one panel's clicks, and the clicks its run did not apply.

    Args:
        log: Writes a line to the run's log (``log(kind, message)``).
        seconds: How long a notice shows.
        shown: How many notices show at once (the newest).
    """

    def __init__(self, log: Callable[[str, str], None], seconds: float = 10.0, shown: int = 2):
        self._log = log
        self._seconds = seconds
        self._lock = threading.Lock()
        self._new: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._shown: collections.deque[tuple[float, str]] = collections.deque(maxlen=shown)
        self._sent: collections.deque[tuple[str, Request]] = collections.deque(maxlen=_SENT_KEPT)
        self._not_applied: list[str] = []
        self._checked = False

    def add(self, note: str) -> None:
        """A notice of a click, shown for a few seconds (any thread)."""
        self._new.put(note)

    def sent(self, label: str, request: Request) -> None:
        """The panel's `label` (``Save``) sent `request`: followed until the run answers it."""
        with self._lock:
            self._sent.append((label, request))

    def forget_answered(self, answered: Callable[[Request], bool]) -> None:
        """Stops following the requests the run has answered (the panel's
        monitor, each redraw: the run keeps its newest answers only).

        Args:
            answered: Whether the run answered a request (`TrainingRun.ack`).
        """
        with self._lock:
            if not self._sent:
                return
            waiting = [(label, request) for label, request in self._sent if not answered(request)]
            self._sent.clear()
            self._sent.extend(waiting)

    def too_late(self, label: str, command: str, how: str) -> str:
        """A click the kernel took once the run had ended: said in the panel and the log.

        Args:
            label: What was clicked (``Save``, ``Learning rate``).
            command: What it would have sent.
            how: How the run ended (``Stopped by a kernel interrupt``).

        Returns:
            The line said.
        """
        line = (f"{label}: '{command}' not applied: the run had ended ({how}) when the kernel took the click "
                "(a click made while another cell runs waits until that cell ends).")
        self._say_not_applied(line)
        return line

    def check_unanswered(self, answered: Callable[[Request], bool], how: str) -> None:
        """Once the run has ended: says each request the panel sent that the
        run never answered (it ended first). Only the first call acts.

        Args:
            answered: Whether the run answered a request (`TrainingRun.ack`).
            how: How the run ended.
        """
        self.forget_answered(answered)
        with self._lock:
            if self._checked:
                return
            self._checked = True
            unanswered, self._sent = list(self._sent), collections.deque(maxlen=_SENT_KEPT)
        for label, request in unanswered:
            self._say_not_applied(f"{label}: '{request}' not applied: the run ended ({how}) before it took "
                                  "the command.")

    def notices(self, ended: bool) -> list[str]:
        """The notices to show now, as HTML lines: none once the run has `ended`."""
        now = time.monotonic()
        while True:
            try:
                self._shown.append((now, self._new.get_nowait()))
            except queue.Empty:
                break
        return [html.escape(note) for shown, note in self._shown if now - shown < self._seconds and not ended]

    def not_applied_html(self) -> str:
        """The clicks not applied, for the ended panel (the newest `_NOT_APPLIED_SHOWN`), or ''."""
        with self._lock:
            lines = self._not_applied[-_NOT_APPLIED_SHOWN:]
        return "".join(f'<div class="traincontrol-not-applied" style="font-size:12px;line-height:1.5;color:#d93025">'
                       f"{html.escape(line)}</div>" for line in lines)

    def _say_not_applied(self, line: str) -> None:
        with self._lock:
            self._not_applied.append(line)
        self._log("warning", line)
