"""What drives a notebook cell's run: its ``fit`` calls and its `TrainLoop`s, one at a time.

One run spans a ``%%interruptible_fit`` cell. Whatever trains in it drives
that run: a ``fit`` (the control callback added to it) or a `TrainLoop`
created on the cell's thread (the cell hosts it: `loop.host.LoopHost`).
`CellDrivers` keeps track of them: whether one drives now, how the last
one ended (a ``stop`` or ``abort`` ends the cell's training), and where a
kernel interrupt goes.

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

from ..protocol import Command, end_reason

__all__ = ["CellDrivers", "NOTHING_TO_CONTROL"]

#: The answer to a command while nothing drives the run.
NOTHING_TO_CONTROL = ("this cell has no fit or TrainLoop running, so nothing can act on it: train with "
                      "model.fit(...) or in `with TrainLoop(...) as loop:` to control it")
#: How long a command may wait for a driver before it is answered.
_IDLE_ANSWER_SECONDS = 1.0


class CellDrivers:
    """The drivers of one cell's run.

    Args:
        lifecycle: The cell's run.
        resume: The first driver resumes from the latest checkpoint.
        on_nan: The magic's ``--on-nan``, for loops.
        save_in_background: False for ``--sync-saves``, for loops.
        save_at_end: False for ``--no-save-at-end``, for loops.
        resume_from: The magic's ``--resume-from`` (for a fit; a loop says it does not take it).
    """

    def __init__(self, lifecycle, *, resume: bool, on_nan: str, save_in_background: bool, save_at_end: bool = True,
                 resume_from: str | None = None):
        self.lifecycle = lifecycle
        self.on_nan = on_nan
        self.save_in_background = save_in_background
        self.save_at_end = save_at_end
        self.resume_from = resume_from
        self.count = 0  # drivers that began
        self.ended_by: Command | None = None  # a stop or abort that ended one: the cell trains no more
        self._resume = resume
        self._current: Any = None  # the TrainLoop or the fit's callback driving now
        self._last: Any = None  # the last one that ended: it says how the run ended
        self.interrupted_cell = False  # a kernel interrupt raised KeyboardInterrupt in the cell's code
        self._idle_since: float | None = None
        self.cell_thread: threading.Thread | None = None

    @property
    def driving(self) -> bool:
        """True while a fit or a TrainLoop drives the run."""
        return self._current is not None

    def take_resume(self) -> bool:
        """True for the first driver only: it resumes."""
        resume, self._resume = self._resume, False
        return resume

    def driver_began(self, driver: Any) -> None:
        """A fit (its callback) or a TrainLoop began driving the run."""
        self.count += 1
        self._current = driver
        self._idle_since = None

    def driver_ended(self, driver: Any) -> None:
        """It ended: a stop or abort ends the cell's training."""
        if self._current is driver:
            self._current = None
        if self.ended_by is None:
            self._last = driver
            if getattr(driver, "ended_by", None) is not None:
                self.ended_by = driver.ended_by

    def end_reason(self, state) -> str | None:
        """How the cell's run came to end in final `state` (`protocol.END_REASONS`):
        as its last driver says (the one a stop or abort ended, if one did)."""
        if self._last is not None:
            return self._last.end_reason(state)
        return end_reason(str(state))

    def note_interrupt(self) -> bool:
        """The next stop is an interrupt's. False when nothing drives the run."""
        current = self._current
        if current is None:
            return False
        current.note_interrupt()
        return True

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
