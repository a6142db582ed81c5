"""How a sender in another process reaches a run: find it by name, send, wait for the effect.

A send writes to the run's FIFO first, found by the run's name alone: a
reader there is the run, listening (a run removes its FIFO before its final
record). Only when nothing listens there (a run that ended, died, or listens
on a spool) is the run's record read, to say why or to find its channel.

The CLI and the Jupyter server send through here (and `transport.channels.deliver`,
the one function every sender writes with); `public_record` is the shape
of a run record that the outside world sees (``list --json``, ``GET
runs``). Like the registry and the transport, this module never imports
Keras.

Example:

>>> request = send("mnist", "stop", waited=True)     # doctest: +SKIP
>>> wait_for_ack("mnist", request, timeout=60)["outcome"]   # doctest: +SKIP
'applied'
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ..protocol import FINAL_STATES, Command, Request, shorten
from ..registry import RunNotFoundError, find_run, list_runs, read_tombstone, registry_root, validate_name
from ..system.private_fs import UnsafePathError, check_private
from ..transport.channels import CHANNEL_KINDS, NotListeningError, deliver, with_id

__all__ = [
    "send",
    "wait_for_ack",
    "channel_address",
    "public_record",
    "public_records",
    "find_run",
    "CommandFailedError",
    "RunNotFoundError",
]

_WAIT_POLL_SECONDS = 0.05
#: Why a run in state ``starting`` answers nothing yet: commands act at batch boundaries of a fit.
_STARTING = ": the run is starting: its code has not called fit yet (commands act once fit runs)"
_PRIVATE_FIELDS = ("folder",)


class CommandFailedError(RuntimeError):
    """The run took the command but could not carry it out (a save that
    could not be written, say)."""


def send(name: str, command: str | Command | Request, sender: str | None = None, *, waited: bool = False) -> Request:
    """Sends `command` to the listed run called `name`, with a fresh request id.

    Args:
        name: The run's name, as `jupyter-traincontrol list` shows it.
        command: A command line (``stop``, ``save``, ``set lr=1e-4``,
            ``rollback 2``, ...), a `Command` or a `Request`.
        sender: A short word saying who sends (``cli``, ``rest``): the
            fresh id starts with it, so the run's change log says who.
        waited: The caller will `wait_for_ack`: the id says so, and the
            run's record keeps it however many requests are merged with it.

    Returns:
        The request delivered; `wait_for_ack` follows it by its id.

    Raises:
        UnknownCommandError: If `command` is not a command.
        RunNotFoundError: If no run of that name is listed.
        NotListeningError: If the run has ended, or its process is gone.
        ChannelError: If the command could not be written.
        UnsafePathError: If the run's channel is not a private one of ours.
    """
    request = with_id(command, sender or "client", waited=waited)
    fifo = _fifo_of(name)
    if fifo is not None:
        try:
            return deliver(fifo, request, kind="fifo")  # a reader there is the run itself, listening
        except (NotListeningError, UnsafePathError):
            pass  # nothing written: its record says why, below
    record = find_run(name)
    address = channel_address(record)
    if not record.get("live", True):
        raise NotListeningError(f"Run {shorten(name, 80)!r} is no longer listening: its process is gone.")
    if record.get("state") in FINAL_STATES or address is None:
        raise NotListeningError(f"Run {shorten(name, 80)!r} has ended ({record.get('state')}); it takes no more commands.")
    try:
        deliver(address, request, kind=record.get("channel"))
    except NotListeningError:
        raise NotListeningError(f"Run {shorten(name, 80)!r} is not listening any more (its channel {address} has no reader).") from None
    return request


def _fifo_of(name: str) -> Path | None:
    """Where the run called `name` listens if its channel is a FIFO (None: not a run name,
    or its folder is not a private one of ours). A send tries it first, without reading the
    record: a live run's FIFO has a reader (its own), and a run removes it before it ends."""
    try:
        folder = registry_root() / validate_name(name)
        check_private(folder, os.lstat(folder), kind="dir")
    except (ValueError, OSError):  # not a run name, no such run, not a folder of ours: `find_run` says which
        return None
    return folder / CHANNEL_KINDS["fifo"]


def channel_address(record: dict[str, Any]) -> Path | None:
    """Where to write to the run of `record`: always inside its own run
    folder, whatever path the record names (a record is outside data)."""
    kind = record.get("channel")
    folder = record.get("folder")
    if kind not in CHANNEL_KINDS or not isinstance(folder, str):
        return None
    return Path(folder) / CHANNEL_KINDS[kind]


def wait_for_ack(name: str, request: Request, timeout: float) -> dict[str, Any]:
    """Waits until the run acknowledges `request` (by its id) in its record.

    Args:
        name: The run's name.
        request: The request as `send` returned it (with ``waited=True``:
            the run's record then keeps its id whatever the traffic;
            another id may be dropped from a long burst of merged answers).
        timeout: Seconds to wait at most.

    Returns:
        The acknowledgement: ``{"ids", "command", "outcome", "message",
        "time"}`` with outcome ``applied`` or ``ignored``.

    Raises:
        CommandFailedError: If the run could not carry it out.
        NotListeningError: If the run ended or died before applying it.
        TimeoutError: If no acknowledgement came within `timeout`.
    """
    deadline = time.monotonic() + timeout
    shown = repr(shorten(name, 80))
    while True:
        try:
            record = find_run(name)
        except RunNotFoundError:  # its process let it go: its last record says, and it is never live
            record = read_tombstone(name)
            if record is None:
                raise NotListeningError(f"Run {shown} is gone (its process exited) before acknowledging {request}.") from None
            record = {**record, "live": False, "tombstone": True}
        ack = next((a for a in record.get("acks") or [] if request.request_id in a["ids"]), None)
        if ack is not None:
            if ack.get("outcome") == "failed":
                raise CommandFailedError(f"Run {shown} could not carry out {request}: {ack.get('message')}")
            return ack
        if record.get("state") in FINAL_STATES:
            raise NotListeningError(f"Run {shown} ended ({record.get('state')}) before applying {request}.")
        if record.get("tombstone"):
            raise NotListeningError(
                f"Run {shown}'s process let it go, but its last record says {record.get('state')}: it could not write "
                f"its final record (a full disk?); what became of {request} is unknown."
            )
        if not record.get("live", True):
            raise NotListeningError(f"Run {shown} died before applying {request}.")
        if time.monotonic() >= deadline:
            why = _STARTING if record.get("state") == "starting" else ""
            raise TimeoutError(
                f"Sent {request} to run {shorten(name, 80)!r}, but it did not acknowledge it within {timeout:g} s{why}."
            )
        time.sleep(_WAIT_POLL_SECONDS)


def public_record(record: dict[str, Any]) -> dict[str, Any]:
    """A run record as ``list --json`` and the server show it (internal fields dropped)."""
    return {key: value for key, value in record.items() if key not in _PRIVATE_FIELDS}


def public_records(ended: bool = False) -> list[dict[str, Any]]:
    """The public records of all listed runs, oldest first.

    Args:
        ended: Also the ended runs of the history (``live: False``, with
            their ``end_reason``), as ``list --all`` shows them.
    """
    return [public_record(record) for record in list_runs(ended=ended)]
