"""The states of a run, which commands make sense in each, and how it may move between them.

A run starts ``starting``, trains ``running`` (or ``paused``), winds down
``stopping``, and ends in one of ``stopped``, ``aborted``, ``finished`` or
``failed``. `TRANSITIONS` is the table of the moves a run may make;
`final_state` the one mapping from how a ``fit`` (or a loop) ended to its
final state. Pure: no I/O.

`END_REASONS` are the values of a record's ``end_reason``: how a run that
has ended came to end. `end_reason` says it from the final state and the
request that ended the run, if one did. `resume_hint` says how to go on
from a run whose process died (the CLI, and the side panel's
``resumeHint``, word for word).

Example:

>>> end_reason("stopped", "interrupt-0a1b2c3d4e5f")
'interrupt'
"""

from __future__ import annotations

import enum

from .commands import Command, is_interrupt, sender_of

__all__ = [
    "RunState",
    "ACTIVE_STATES",
    "FINAL_STATES",
    "TRANSITIONS",
    "allowed_commands",
    "as_state",
    "final_state",
    "InvalidTransitionError",
    "END_REASONS",
    "end_reason",
    "resume_hint",
]


#: How a run ended, as a record's ``end_reason`` says it.
END_REASONS = {
    "finished": "fit (or a TrainLoop) ran to its end",
    "callback": "a callback of the user's ended fit early (EarlyStopping, TerminateOnNaN: its stop_training)",
    "command": "a stop or abort command (which one: the state)",
    "interrupt": "a kernel interrupt, Ctrl+C, or SIGTERM (a script's or a job process's)",
    "kernel-restart": "a kernel shutdown or restart stopped it",
    "error": "it failed (the record's error says why)",
    "nan": "a loss that was not finite stopped it (on_nan)",
    "process-gone": "its process died without ending the run",
}


class RunState(str, enum.Enum):
    """The states of a training run, in lifecycle order."""

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPING = "stopping"
    STOPPED = "stopped"
    """Ended by ``stop`` (or an interrupt), with a checkpoint."""
    ABORTED = "aborted"
    """Ended by ``abort``, without a checkpoint."""
    FINISHED = "finished"
    """``fit`` ran to its end."""
    FAILED = "failed"
    """An exception ended the run; its record holds the traceback."""

    def __str__(self) -> str:
        return self.value


#: States of a run that still trains (or is about to, or is winding down).
ACTIVE_STATES = frozenset({RunState.STARTING, RunState.RUNNING, RunState.PAUSED, RunState.STOPPING})
#: States after `fit` has returned or raised.
FINAL_STATES = frozenset(RunState) - ACTIVE_STATES

_ALLOWED: dict[RunState, tuple[Command, ...]] = {
    RunState.STARTING: (Command.STOP, Command.ABORT),
    RunState.RUNNING: (Command.SAVE, Command.STOP, Command.ABORT, Command.PAUSE, Command.SET, Command.ROLLBACK),
    RunState.PAUSED: (Command.SAVE, Command.STOP, Command.ABORT, Command.RESUME, Command.SET, Command.ROLLBACK),
    RunState.STOPPING: (Command.ABORT,),
}


def allowed_commands(state: str | RunState) -> tuple[Command, ...]:
    """The commands that make sense for a run in `state` (the buttons a UI
    enables). A run still takes any command; the others are answered with
    a note in its log.

    Args:
        state: A run state (a `RunState` or its value).

    Returns:
        The commands, in `Command` order; none for an ended run or an
        unknown state.
    """
    try:
        return _ALLOWED.get(RunState(state), ())
    except ValueError:
        return ()



#: The moves a run may make: from each active state, the states it may go
#: to. An ended run moves no more (a new run of the same object starts over).
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.STARTING: frozenset({RunState.RUNNING, RunState.STOPPING}) | FINAL_STATES,
    RunState.RUNNING: frozenset({RunState.PAUSED, RunState.STOPPING}) | FINAL_STATES,
    RunState.PAUSED: frozenset({RunState.RUNNING, RunState.STOPPING}) | FINAL_STATES,
    RunState.STOPPING: FINAL_STATES,
}


class InvalidTransitionError(ValueError):
    """A move `TRANSITIONS` does not allow."""


def as_state(state: RunState | str) -> RunState:
    """A `RunState` from itself or its value.

    Raises:
        ValueError: For a word that is not a state, naming the states.
    """
    try:
        return RunState(state)
    except ValueError:
        raise ValueError(
            f"Unknown state {state!r}. Expected one of: {', '.join(str(s) for s in RunState)}."
        ) from None


def final_state(ended_by: Command | None) -> RunState:
    """How a run ended, as its final state: ``stop`` gives ``stopped``,
    ``abort`` ``aborted``, and a run that ended by itself ``finished``."""
    return {Command.ABORT: RunState.ABORTED, Command.STOP: RunState.STOPPED}.get(ended_by, RunState.FINISHED)


def end_reason(state: str, request_id: str | None = None, *, nan: bool = False) -> str | None:
    """How a run in final `state` ended (one of `END_REASONS`), or None for
    a state that is not final.

    Args:
        state: The run's final state.
        request_id: The id of the request that ended it (a ``stop`` or
            ``abort``), if any.
        nan: True if the NaN policy stopped it.
    """
    if state == "finished":
        return "finished"
    if state == "failed":
        return "error"
    if state not in ("stopped", "aborted"):
        return None
    if nan:
        return "nan"
    if is_interrupt(request_id):
        return "interrupt"
    word = sender_of(request_id)
    if word == "shutdown":
        return "kernel-restart"
    return "command"


def resume_hint(record: dict) -> str:
    """How to continue a run whose process died (``end_reason``
    ``process-gone``: killed for memory, a crash) from its newest
    checkpoint; '' for any other run, or one that left no checkpoint.

    Args:
        record: The run's record (``name``, ``origin``, ``end_reason``,
            ``checkpoints``).
    """
    checkpoints = record.get("checkpoints") or []
    if record.get("end_reason") != "process-gone" or not checkpoints:
        return ""
    newest = str(checkpoints[-1]).replace("\\", "/").rsplit("/", 1)[-1]
    name = record.get("name")
    how = (f"%%interruptible_fit --name {name} --resume" if record.get("origin") == "notebook"
           else f"resume=True (run {name})")
    return f"Its newest checkpoint is {newest}: continue from it with {how}."
