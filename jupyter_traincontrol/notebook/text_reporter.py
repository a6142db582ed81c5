"""A run's view outside a notebook front end (a plain IPython terminal): one line per change.

`TextReporter` stands where the widgets panel would: it prints a line for
each state change, checkpoint, warning and error of the run.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the reporter reads the run; the run never imports it
    from .run import TrainingRun

__all__ = ["TextReporter"]


class TextReporter:
    """The panel's stand-in outside a notebook front end: prints a line for
    each state change and checkpoint.

    Args:
        run: The `TrainingRun`.
        stream: Where to print. Defaults to the real stdout.
    """

    def __init__(self, run: TrainingRun, stream=None):
        self.run = run
        self._stream = stream or sys.__stdout__
        run.lifecycle.add_listener(self._on_event)

    def start(self) -> "TextReporter":
        return self

    def join(self, timeout: float | None = None) -> None:
        """Nothing to wait for."""

    def _on_event(self, run, event) -> None:
        if event is None or event["kind"] not in ("state", "checkpoint", "error", "warning"):
            return
        print(f"[traincontrol] {self.run.name}: {event['message']}", file=self._stream, flush=True)
