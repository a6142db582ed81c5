"""What drives a notebook cell's run: its ``fit`` calls and its `TrainLoop`s, one at a time.

One run spans a ``%%interruptible_fit`` cell: the cell's scope
(`run.scope.RunScope`, the cell's thread put in it). Whatever trains in
it drives that run: a ``fit`` (the control callback added to it) or a
`TrainLoop` created on the cell's thread. `CellDrivers` is that scope
(whether one drives now, how the last one ended, which one resumes, the
magic's settings a loop takes) with what is the cell's own: where a kernel
interrupt goes, and commands nothing can act on.

When nothing has driven the run (a cell that trains with its own loop, not
in a ``fit`` or a `TrainLoop`), nothing can act on a command: a command that
waits a second unanswered is answered ``failed`` with the fix in one line,
so ``send --wait`` says so at once, and a kernel interrupt interrupts the
cell's code (a ``KeyboardInterrupt`` raised in its thread, as a plain
kernel would).
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

from ..run.scope import RunScope

__all__ = ["CellDrivers", "NOTHING_TO_CONTROL"]

#: The answer to a command while nothing drives the run.
NOTHING_TO_CONTROL = ("this cell has no fit or TrainLoop running, so nothing can act on it: train with "
                      "model.fit(...) or in `with TrainLoop(...) as loop:` to control it")
#: How long a command may wait for a driver before it is answered.
_IDLE_ANSWER_SECONDS = 1.0


class CellDrivers(RunScope):
    """The drivers of one cell's run.

    Args:
        lifecycle: The cell's run.
        resume: The first driver resumes from the latest checkpoint.
        on_nan: The magic's ``--on-nan``, for loops.
        save_in_background: False for ``--sync-saves``, for loops.
        save_at_end: False for ``--no-save-at-end``, for loops.
        resume_from: The magic's ``--resume-from`` (for a fit; a loop says it does not take it).
        autosave: The magic's ``--autosave``, for loops (None: off).
    """

    def __init__(self, lifecycle, *, resume: bool, on_nan: str, save_in_background: bool, save_at_end: bool = True,
                 resume_from: str | None = None, autosave: float | None = None):
        super().__init__(lifecycle, resume=resume, on_nan=on_nan, save_in_background=save_in_background,
                         save_at_end=save_at_end, resume_from=resume_from, autosave=autosave)
        self.interrupted_cell = False  # a kernel interrupt raised KeyboardInterrupt in the cell's code
        self._idle_since: float | None = None
        self.cell_thread: threading.Thread | None = None

    def driver_began(self, driver: Any) -> None:
        """A fit (its callback) or a TrainLoop began driving the run."""
        super().driver_began(driver)
        self._idle_since = None

    def interrupt_cell(self) -> None:
        """Raises ``KeyboardInterrupt`` in the cell's thread, as a plain kernel would."""
        thread = self.cell_thread
        if thread is not None and thread.is_alive():
            self.interrupted_cell = True
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt))

    def answer_idle_commands(self) -> None:
        """A tick (the run's thread): while no fit or TrainLoop has
        begun in the cell, commands that waited a second are answered
        ``failed``, with the fix. Once one has, a command waits for the next."""
        channel = self.lifecycle.channel
        if self.count or channel is None or not channel.pending:  # between two fits, commands wait for the next
            self._idle_since = None
            return
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
            return
        if now - self._idle_since < _IDLE_ANSWER_SECONDS:
            return
        journal = self.lifecycle.journal
        while not self.driving and (request := channel.pop()) is not None:
            journal.log("warning", f"'{request}' not applied: {NOTHING_TO_CONTROL}.")
            journal.acknowledge(request, "failed", NOTHING_TO_CONTROL)
        self._idle_since = None
        self.lifecycle.publish(force=True)
