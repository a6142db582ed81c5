"""A run's channel from the outside: where it is, opening it, and `deliver`, the one way a line reaches it.

A run listens on one channel in its private folder: a FIFO where the
platform has them, else a spool folder (`CHANNEL_KINDS` names each kind's
place, so a sender finds it; `open_channel` makes the run's).

Every sender (the CLI, the Jupyter server, the notebook panel, the
`TrainingRun` methods, a kernel interrupt, Ctrl+C, a job's relay) writes a
request with `deliver`: it parses the command once, gives it a request id
(``SENDER-<12 hex digits>``) that the run acknowledges in its record, and
writes the line in one atomic write. It never blocks: a FIFO with nobody
reading fails at once with `NotListeningError`, and a path that is not a
private FIFO or inbox of ours is refused without being opened. Writers may
be any process of the same user, as ``echo stop > FIFO`` is.

Example:

>>> deliver("/run/user/1000/jupyter/traincontrol/mnist/control", "stop", sender="cli")   # doctest: +SKIP
Request(command=<Command.STOP: 'stop'>, args=(), request_id='cli-4f1c0e...')
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
import time
import uuid
from pathlib import Path

from ..protocol import WAITED_ID_MARK, Command, Request, parse_request
from ..system.private_fs import UnsafePathError, check_private
from .fifo import FIFO_NAME, FifoChannel
from .receiver import CommandChannel
from .spool import INBOX_NAME, SpoolChannel

__all__ = ["ChannelError", "NotListeningError", "deliver", "with_id", "open_channel", "CHANNEL_KINDS"]


class ChannelError(OSError):
    """A command could not be delivered."""


class NotListeningError(ChannelError):
    """Nobody reads the channel: the run has ended or its process is gone."""


def with_id(request: str | Command | Request, sender: str | None, waited: bool = False) -> Request:
    """`request` parsed (once), with a fresh id ``SENDER-<hex>`` unless it has one.

    Args:
        request: A command line (``"stop"``, ``"set lr=1e-4"``), a `Command`
            or a `Request`.
        sender: A short word saying who sends (``cli``, ``rest``, ``panel``):
            the id starts with it, so the run's change log says who. None:
            the request keeps the id it has, or none.

    Raises:
        UnknownCommandError: If `request` is not a valid request.
    """
    if not isinstance(request, Request):  # parsed once: a request passed on is not parsed again
        request = parse_request(request)
    if request.request_id is None and sender is not None:
        mark = WAITED_ID_MARK if waited else "-"
        request = dataclasses.replace(request, request_id=f"{sender[:12]}{mark}{uuid.uuid4().hex[:12]}")
    return request


def deliver(address: str | os.PathLike, request: str | Command | Request, *, kind: str | None = None,
            sender: str | None = None) -> Request:
    """Delivers one command to a channel without ever blocking.

    Args:
        address: A FIFO path, or the inbox folder of a spool channel.
        request: A command line, for example ``"stop"`` or ``"save #a1"``,
            or a `Command` or `Request`.
        kind: ``"fifo"`` or ``"spool"`` if the sender knows which the
            channel is (then anything else there is refused); None accepts
            either.
        sender: Who sends, for the request id (see `with_id`).

    Returns:
        The request delivered, with its id.

    Raises:
        UnknownCommandError: If `request` is not a valid request.
        NotListeningError: If no run listens there any more.
        UnsafePathError: If `address` is not a private FIFO or folder of
            ours (it is refused without being opened).
        ChannelError: If the command could not be written.
    """
    request = with_id(request, sender)
    address = Path(address)
    try:
        st = os.lstat(address)
    except FileNotFoundError:
        raise NotListeningError(f"No channel at {address}: the run is not listening.") from None
    if stat.S_ISDIR(st.st_mode) and kind in (None, "spool"):
        _write_to_spool(address, request)
    elif stat.S_ISFIFO(st.st_mode) and kind in (None, "fifo"):
        _write_to_fifo(address, request)
    else:  # a file, a folder where a FIFO should be, a symlink, a device: never opened
        check_private(address, st, kind="dir" if kind == "spool" else "fifo")
        raise UnsafePathError(f"Refusing {address}: expected a {kind}, found mode {stat.filemode(st.st_mode)}.")
    return request


def _write_to_fifo(path: Path, request: Request) -> None:
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as error:
        if error.errno == errno.ENXIO:
            raise NotListeningError(f"Nobody reads {path}: the run is not listening.") from None
        if error.errno == errno.ELOOP:
            raise UnsafePathError(f"Refusing {path}: it is a symlink; expected a FIFO.") from None
        raise ChannelError(f"Cannot open {path} for writing: {error.strerror}.") from None
    try:
        check_private(path, os.fstat(fd), kind="fifo")
        line = request.encode_line()
        try:
            written = os.write(fd, line)  # one write of < PIPE_BUF bytes: atomic
        except BlockingIOError:
            raise ChannelError(f"The FIFO {path} is full: the run is not reading it.") from None
        if written != len(line):
            raise ChannelError(f"Short write to {path}: {written} of {len(line)} bytes.")
    finally:
        os.close(fd)


def _write_to_spool(inbox: Path, request: Request) -> None:
    check_private(inbox, os.lstat(inbox), kind="dir")
    stem = f"{time.time_ns():020d}-{uuid.uuid4().hex}"
    tmp = inbox / f"{stem}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        os.write(fd, request.encode_line())
    finally:
        os.close(fd)
    os.replace(tmp, inbox / f"{stem}.cmd")


# Opening a run's channel --------------------------------------------------------------------------------

_CLASSES = {"fifo": FifoChannel, "spool": SpoolChannel}
#: The kinds of channel, and the name each has in a run folder.
CHANNEL_KINDS = {"fifo": FIFO_NAME, "spool": INBOX_NAME}


def open_channel(folder: Path, kind: str | None = None, **kwargs) -> CommandChannel:
    """Creates the channel of a run; what senders write waits in it until
    a thread reads it (`CommandChannel.read`: the run's thread).

    Args:
        folder: The run's private folder.
        kind: ``"fifo"`` or ``"spool"``. Defaults to ``"fifo"`` where
            `os.mkfifo` exists, else ``"spool"``.
        **kwargs: Passed to the channel class.

    Returns:
        The channel.
    """
    kind = kind or ("fifo" if hasattr(os, "mkfifo") else "spool")
    if kind not in _CLASSES:
        raise ValueError(f"Unknown channel kind {kind!r}. Expected one of: fifo, spool.")
    return _CLASSES[kind](folder, **kwargs)
