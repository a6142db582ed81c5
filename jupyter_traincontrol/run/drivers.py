"""What drives a run that spans several trainings: each ``fit`` or `TrainLoop`, one at a time.

A run may outlive one training: a ``%%interruptible_fit`` cell's, or a
``with ControlCallback(...)`` block's, spans every ``fit`` (and, in a cell,
every `TrainLoop`) in it. `RunDrivers` keeps track of them: whether one
drives now, how the last one ended (a ``stop`` or ``abort`` ends the run's
training: no later one trains), and which one resumes (the first).

A driver is anything with ``ended_by`` (the command that ended it, or None),
``end_reason(state)`` and ``note_interrupt()``: a `ControlCallback`, a `TrainLoop`.
A stop or abort that comes while none drives (between two of a cell's fits)
ends the run's training there (`end_between`).
"""

from __future__ import annotations

from typing import Any

from ..protocol import Command, end_reason

__all__ = ["RunDrivers"]


class RunDrivers:
    """The drivers of one run, one at a time.

    Args:
        resume: The first driver resumes from the latest checkpoint.
    """

    def __init__(self, *, resume: bool):
        self.count = 0  # drivers that began
        self.ended_by: Command | None = None  # a stop or abort that ended one: the run trains no more
        self._resume = resume
        self._current: Any = None  # the driver driving now
        self._last: Any = None  # the last one that ended: it says how the run ended

    @property
    def driving(self) -> bool:
        """True while a driver drives the run."""
        return self._current is not None

    def take_resume(self) -> bool:
        """True for the first driver only: it resumes."""
        resume, self._resume = self._resume, False
        return resume

    def driver_began(self, driver: Any) -> None:
        """A driver (a fit's callback, a TrainLoop) began driving the run."""
        self.count += 1
        self._current = driver

    def driver_ended(self, driver: Any) -> None:
        """It ended: a stop or abort ends the run's training."""
        if self._current is driver:
            self._current = None
        if self.ended_by is None:
            self._last = driver
            if getattr(driver, "ended_by", None) is not None:
                self.ended_by = driver.ended_by

    def end_between(self, command: Command, request_id: str | None) -> None:
        """A ``stop`` or ``abort`` while no driver drives (between two fits of
        a cell): the run's training ends here, with no checkpoint (nothing
        trained since the last driver's), and later drivers train nothing.

        Args:
            command: ``stop`` or ``abort``.
            request_id: The request's id: how the run ended (`end_reason`).
        """
        self.ended_by = command
        self._last = _EndedBetween(request_id)

    def end_reason(self, state) -> str | None:
        """How the run came to end in final `state` (`protocol.END_REASONS`):
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


class _EndedBetween:
    """What `RunDrivers.end_between` keeps in place of the last driver: how the run ended."""

    def __init__(self, request_id: str | None):
        self._request_id = request_id

    def end_reason(self, state) -> str | None:
        return end_reason(str(state), self._request_id)

