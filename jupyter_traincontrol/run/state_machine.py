"""A run's state, moved only along `protocol.states.TRANSITIONS`.

`StateMachine.move_to` is the one way a run changes state: from the
training thread (running, paused, stopping), from whichever thread ends the
run (its final state). A move the table does not allow raises; a move to
the state the run is in changes nothing. Each move is logged and published
at once (`on_move`).

Example:

>>> machine = StateMachine()
>>> machine.move_to("running")
True
>>> machine.move_to("running")
False
"""

from __future__ import annotations

import threading
from typing import Callable

from ..protocol import FINAL_STATES, TRANSITIONS, InvalidTransitionError, RunState, as_state

__all__ = ["StateMachine"]


class StateMachine:
    """The state of one run.

    Args:
        on_move: Called with the new state after each move (outside the lock).
    """

    def __init__(self, on_move: Callable[[RunState], None] | None = None):
        self._state = RunState.STARTING
        self._lock = threading.RLock()
        self._on_move = on_move or (lambda state: None)

    @property
    def state(self) -> RunState:
        """The current `RunState`."""
        return self._state

    @property
    def ended(self) -> bool:
        """True once the run is in a final state."""
        return self._state in FINAL_STATES

    def reset(self) -> None:
        """Back to ``starting`` (a new run of the same object); not a move."""
        with self._lock:
            self._state = RunState.STARTING

    def move_to(self, state: RunState | str) -> bool:
        """Moves the run to `state`.

        Returns:
            True if it moved; False if it was in `state` already.

        Raises:
            InvalidTransitionError: If `TRANSITIONS` has no such move (an
                ended run, say); the state is unchanged.
            ValueError: If `state` is not a state.
        """
        if not isinstance(state, RunState):
            state = as_state(state)
        with self._lock:
            current = self._state
            if state == current:
                return False
            if state not in TRANSITIONS.get(current, ()):
                raise InvalidTransitionError(f"A run that is {current} cannot become {state}.")
            self._state = state
        self._on_move(state)
        return True
