"""A run that spans several trainings (a notebook cell's, a with block's): its scope.

A run may outlive one training: a ``%%interruptible_fit`` cell's spans
every ``fit`` and every `TrainLoop` in it, a ``with ControlCallback(...)``
block's every ``fit`` given the callback. `RunScope` is that run for the
trainings in it: which one drives now (one at a time), how the last one
ended (a ``stop`` or ``abort`` ends the run's training: no later one
trains), which one resumes (the first), and the settings a training in it
takes (``on_nan``, ``save_in_background``, ...). Outside any scope a
training opens and closes a run of its own: a scope of one.

A training asks for its thread's scope (`current_scope`): the notebook
layer puts the cell's thread in the cell's (`scoped`).

A driver is anything with ``ended_by`` (the command that ended it, or None),
``end_reason(state)`` and ``note_interrupt()``: a `ControlCallback`, a `TrainLoop`.
A stop or abort that comes while none drives (between two of a cell's fits)
ends the run's training there (`end_between`).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from ..protocol import Command, end_reason

__all__ = ["RunScope", "current_scope", "scoped"]

_lock = threading.Lock()
_scopes: dict[int, "RunScope"] = {}


class RunScope:
    """A run open for several trainings, one at a time.

    Args:
        lifecycle: The run (a `RunLifecycle`), open while trainings drive it.
        resume: The first training resumes from the latest checkpoint.
        on_nan: What a loss that is not finite does, for its loops.
        save_in_background: False: its loops write checkpoints on their thread.
        save_at_end: False: its loops write no checkpoint at their end.
        resume_from: Another run's checkpoints (for a fit: a loop says it
            does not take it), or None.
        autosave: Seconds between its loops' autosaves (None: off).
    """

    def __init__(self, lifecycle, *, resume: bool, on_nan: str = "stop", save_in_background: bool = True,
                 save_at_end: bool = True, resume_from: str | None = None, autosave: float | None = None):
        self.lifecycle = lifecycle
        self.on_nan = on_nan
        self.save_in_background = save_in_background
        self.save_at_end = save_at_end
        self.resume_from = resume_from
        self.autosave = autosave
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
    """What `RunScope.end_between` keeps in place of the last driver: how the run ended."""

    def __init__(self, request_id: str | None):
        self._request_id = request_id

    def end_reason(self, state) -> str | None:
        return end_reason(str(state), self._request_id)



def current_scope() -> RunScope | None:
    """The scope of the calling thread's trainings, or None (each is a run of its own)."""
    return _scopes.get(threading.get_ident())


@contextlib.contextmanager
def scoped(scope: RunScope) -> Iterator[None]:
    """While inside, trainings started on the calling thread drive `scope`'s run."""
    ident = threading.get_ident()
    with _lock:
        _scopes[ident] = scope
    try:
        yield
    finally:
        with _lock:
            _scopes.pop(ident, None)
