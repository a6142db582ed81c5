"""How any sender reaches a run: find it, send it a command, wait for the effect.

The CLI, the Jupyter server and the notebook all send through here; none of
them writes to a FIFO by itself. `public_record` is the shape of a run
record that the outside world sees (``list --json``, ``GET runs``). Like the
registry and the channel, this module never imports Keras.

Example:

>>> send("mnist", "stop")                        # doctest: +SKIP
<Command.STOP: 'stop'>
>>> wait_for_effect("mnist", Command.STOP, since, timeout=60)   # doctest: +SKIP
'state stopped'
"""

from __future__ import annotations

import time
from typing import Any

from .channel import NotListeningError, send_command
from .commands import FINAL_STATES, Command, RunState, parse_command
from .registry import RunNotFoundError, find_run, list_runs

__all__ = ["send", "wait_for_effect", "public_record", "public_records", "find_run", "RunNotFoundError"]

_WAIT_POLL_SECONDS = 0.1
_PRIVATE_FIELDS = ("pid_start",)


def send(name: str, command: str | Command) -> Command:
    """Sends `command` to the listed run called `name`.

    Args:
        name: The run's name, as `jupyter-traincontrol list` shows it.
        command: One of ``stop``, ``save``, ``abort``, ``pause``, ``resume``.

    Returns:
        The command delivered.

    Raises:
        UnknownCommandError: If `command` is not a command.
        RunNotFoundError: If no live process lists a run of that name.
        NotListeningError: If the run has ended or its channel is gone.
        ChannelError: If the command could not be written.
        UnsafePathError: If the run's channel is not a private one of ours.
    """
    command = parse_command(command)
    record = find_run(name)
    address = record.get("address")
    if record.get("state") in FINAL_STATES or not address:
        raise NotListeningError(f"Run {name!r} has ended ({record.get('state')}); it takes no more commands.")
    try:
        send_command(address, command)
    except NotListeningError:
        raise NotListeningError(f"Run {name!r} is not listening any more (its channel {address} has no reader).") from None
    return command


def wait_for_effect(name: str, command: Command, since: float, timeout: float) -> str:
    """Polls the run's record until it shows `command` acted on.

    Args:
        name: The run's name.
        command: The command sent.
        since: When it was sent (``time.time()``); earlier events do not count.
        timeout: Seconds to wait at most.

    Returns:
        What was seen, in a few words (``"state stopped"``, ``"the run is gone"``).

    Raises:
        TimeoutError: If no effect was seen within `timeout`.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            record = find_run(name)
        except RunNotFoundError:
            return "the run is gone"
        seen = any(
            event.get("kind") == "command" and event.get("message") == f"{command} received" and event.get("time", 0) >= since
            for event in record.get("events", [])
        )
        state = record.get("state")
        if state in FINAL_STATES or (seen and state != RunState.STOPPING):
            return f"state {state}"
        time.sleep(_WAIT_POLL_SECONDS)
    raise TimeoutError(f"Sent {command!r} to run {name!r}, but saw no effect within {timeout:g} s.")


def public_record(record: dict[str, Any]) -> dict[str, Any]:
    """A run record as ``list --json`` and the server show it (internal fields dropped)."""
    return {key: value for key, value in record.items() if key not in _PRIVATE_FIELDS}


def public_records() -> list[dict[str, Any]]:
    """The public records of all listed runs, oldest first."""
    return [public_record(record) for record in list_runs()]
