"""The command channel of a run: a private FIFO, listened to in the background.

Each run has one channel in its private folder. A daemon reader thread
decodes what arrives and puts whole commands on a queue, so the training
thread only has to check whether the queue is non-empty at each batch boundary: the FIFO
is opened once, never per batch, and a command written while no batch runs
(validation, a pause) is read at once and waits in the queue.

Writers are any process of the same user: the CLI, the notebook panel, the
kernel-interrupt handler, the Jupyter server, or a shell
(``echo stop > FIFO``). `send_command` never blocks: with nobody reading it
fails at once with `NotListeningError`.

Where `os.mkfifo` does not exist (Windows), `SpoolChannel` gives the same
behaviour with one small file per command in a private inbox folder.

Example:

>>> channel = open_channel(run_folder, on_rejected=print)  # doctest: +SKIP
>>> send_command(channel.address, "save")                   # doctest: +SKIP
>>> channel.pop().command                                   # doctest: +SKIP
<Command.SAVE: 'save'>
"""

from __future__ import annotations

import errno
import os
import queue
import select
import stat
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from .commands import Command, LineDecoder, Rejected, Request, parse_request
from .private_fs import UnsafePathError, check_private

__all__ = [
    "ChannelError",
    "NotListeningError",
    "CommandChannel",
    "FifoChannel",
    "SpoolChannel",
    "open_channel",
    "send_command",
    "FIFO_NAME",
    "INBOX_NAME",
]

FIFO_NAME = "control"
INBOX_NAME = "inbox"
_READ_SIZE = 65536
_SPOOL_POLL_SECONDS = 0.01
#: How often the reader checks that the channel is still there on disk.
_HEALTH_CHECK_SECONDS = 0.5

RejectedListener = Callable[[Rejected], None]
NoticeListener = Callable[[str], None]


class ChannelError(OSError):
    """A command could not be delivered."""


class NotListeningError(ChannelError):
    """Nobody reads the channel: the run has ended or its process is gone."""


class CommandChannel:
    """Base of the channel kinds: a queue filled by a daemon reader thread.

    The reader thread only reads: it decodes what arrives, queues whole
    commands, reports rejected lines, and repairs the channel on disk if
    something removed or replaced it.

    Args:
        folder: The run's private folder; the channel lives inside it.
        on_rejected: Called from the reader thread with each line that is
            not a command. Must not raise.
        on_notice: Called from the reader thread with a sentence about the
            channel itself (for example a FIFO re-created after deletion).
        name: Used to name the reader thread.
        health_check_seconds: How often the reader checks that the channel
            is still there on disk. Defaults to 0.5.
        dir_fd: An open descriptor of `folder`. The channel then creates,
            checks and re-creates itself through it, so a folder renamed or
            swapped under a live run cannot redirect it.
    """

    kind = "abstract"

    def __init__(
        self,
        folder: Path,
        *,
        on_rejected: RejectedListener | None = None,
        on_notice: NoticeListener | None = None,
        name: str = "run",
        health_check_seconds: float = _HEALTH_CHECK_SECONDS,
        dir_fd: int | None = None,
    ):
        self.folder = Path(folder)
        self._health_check_seconds = health_check_seconds
        self._dir_fd = dir_fd
        self._on_rejected = on_rejected or (lambda rejected: None)
        self._on_notice = on_notice or (lambda text: None)
        self._queue: queue.SimpleQueue[Request] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._run_reader, name=f"traincontrol-reader-{name}", daemon=True
        )

    @property
    def address(self) -> str:
        """Where writers send commands (the FIFO, or the inbox folder)."""
        raise NotImplementedError

    @property
    def pending(self) -> bool:
        """True when a command waits. Cheap enough for every batch."""
        return not self._queue.empty()

    def pop(self) -> Request | None:
        """Takes the oldest waiting request, or returns None."""
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def get(self, timeout: float | None) -> Request | None:
        """Takes the oldest request, waiting up to `timeout` seconds for one.

        Returns:
            The request, or None if none came in time.
        """
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def inject(self, request: Request | Command) -> None:
        """Queues a request directly, for an in-process sender whose write
        to the channel failed."""
        self._queue.put(parse_request(request))

    def start(self) -> "CommandChannel":
        """Starts the reader thread. Returns self."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stops the reader and removes the channel from disk. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake_reader()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self._release()

    def _deliver(self, results: list[Request | Rejected]) -> None:
        for result in results:
            if isinstance(result, Request):
                self._queue.put(result)
            else:
                self._on_rejected(result)

    def _run_reader(self) -> None:
        interval = self._health_check_seconds
        next_check = time.monotonic() + interval
        last_problem = None
        while not self._closed.is_set():
            try:
                self._read_some(max(0.0, next_check - time.monotonic()))
                if time.monotonic() >= next_check and not self._closed.is_set():
                    next_check = time.monotonic() + interval
                    self._check_health()
                last_problem = None
            except Exception as error:  # the reader must outlive any hiccup
                problem = f"Command channel problem: {error}"
                if problem != last_problem:
                    self._on_notice(problem)
                last_problem = problem
                self._closed.wait(interval)

    # Subclass interface.
    def _read_some(self, timeout: float) -> None:
        raise NotImplementedError

    def _check_health(self) -> None:
        """Repairs the channel on disk if something removed or replaced it."""

    def _wake_reader(self) -> None:
        """Makes a blocked `_read_some` return at once."""

    def _release(self) -> None:
        """Closes descriptors and removes files; runs once, after the reader."""


class FifoChannel(CommandChannel):
    """A named pipe, mode 0600, inside the run's private folder.

    The reader holds its own write end open, so the FIFO never reports
    end-of-file between writers and is never reopened per batch.
    """

    kind = "fifo"

    def __init__(self, folder: Path, **kwargs):
        super().__init__(folder, **kwargs)
        self.path = self.folder / FIFO_NAME
        self._decoder = LineDecoder()
        self._read_fd = -1
        self._keepalive_fd = -1
        self._wake_r, self._wake_w = os.pipe()
        try:
            self._create()
        except BaseException:
            os.close(self._wake_r)
            os.close(self._wake_w)
            raise

    @property
    def address(self) -> str:
        return str(self.path)

    def _at(self) -> tuple[str | Path, dict]:
        """The FIFO's name and the ``dir_fd`` keyword to reach it."""
        if self._dir_fd is None:
            return self.path, {}
        return FIFO_NAME, {"dir_fd": self._dir_fd}

    def _create(self) -> None:
        name, at = self._at()
        os.mkfifo(name, 0o600, **at)  # fails if anything exists there
        self._open()

    def _open(self) -> None:
        name, at = self._at()
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
        read_fd = os.open(name, flags, **at)
        try:
            os.fchmod(read_fd, 0o600)  # in case the umask was unusual
            check_private(self.path, os.fstat(read_fd), kind="fifo")
            keepalive_fd = os.open(name, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, **at)
        except BaseException:
            os.close(read_fd)
            raise
        self._read_fd, self._keepalive_fd = read_fd, keepalive_fd
        self._inode = os.fstat(read_fd).st_ino

    def _close_fds(self) -> None:
        for fd in (self._read_fd, self._keepalive_fd):
            if fd >= 0:
                os.close(fd)
        self._read_fd = self._keepalive_fd = -1

    def _read_some(self, timeout: float) -> None:
        if self._read_fd < 0:  # the FIFO is being re-created
            self._closed.wait(timeout)
            return
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        if not poller.poll(timeout * 1000):
            return
        while not self._closed.is_set():
            try:
                data = os.read(self._read_fd, _READ_SIZE)
            except BlockingIOError:
                return
            if not data:
                return
            self._deliver(self._decoder.feed(data))

    def _check_health(self) -> None:
        name, at = self._at()
        try:
            st = os.stat(name, follow_symlinks=False, **at)
            if st.st_ino == self._inode and stat.S_ISFIFO(st.st_mode):
                return
            what = "replaced"
        except FileNotFoundError:
            what = "deleted"
        # Drain what the old FIFO still holds before letting it go.
        self._read_some(0)
        self._close_fds()
        if what == "replaced":
            os.unlink(name, **at)  # unlink never follows a symlink
        self._create()
        self._on_notice(f"The FIFO {self.path} was {what}; re-created it.")

    def _wake_reader(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _release(self) -> None:
        self._close_fds()
        os.close(self._wake_r)
        os.close(self._wake_w)
        name, at = self._at()
        try:
            if stat.S_ISFIFO(os.stat(name, follow_symlinks=False, **at).st_mode):
                os.unlink(name, **at)
        except FileNotFoundError:
            pass


class SpoolChannel(CommandChannel):
    """One file per command in a private inbox folder (no FIFOs needed).

    Writers create ``<time>-<random>.tmp`` and rename it to ``.cmd``; the
    reader polls the folder every 10 ms and handles files in name order.
    """

    kind = "spool"

    def __init__(self, folder: Path, **kwargs):
        super().__init__(folder, **kwargs)
        self.path = self.folder / INBOX_NAME
        os.mkdir(self.path, 0o700)

    @property
    def address(self) -> str:
        return str(self.path)

    def _read_some(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._closed.is_set():
            try:
                names = sorted(n for n in os.listdir(self.path) if n.endswith(".cmd"))
            except FileNotFoundError:
                return  # `_check_health` re-creates the inbox
            for name in names:
                file = self.path / name
                try:
                    data = file.read_bytes()
                    file.unlink()
                except OSError:
                    continue
                decoder = LineDecoder()
                self._deliver(decoder.feed(data) + decoder.flush())
            if names or time.monotonic() >= deadline:
                return
            self._closed.wait(min(_SPOOL_POLL_SECONDS, max(0.0, deadline - time.monotonic())))

    def _check_health(self) -> None:
        if not self.path.is_dir():
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            self._on_notice(f"The inbox {self.path} was deleted; re-created it.")

    def _release(self) -> None:
        for leftover in self.path.glob("*"):
            leftover.unlink(missing_ok=True)
        try:
            self.path.rmdir()
        except OSError:
            pass


def open_channel(folder: Path, kind: str | None = None, **kwargs) -> CommandChannel:
    """Creates and starts the channel of a run.

    Args:
        folder: The run's private folder.
        kind: ``"fifo"`` or ``"spool"``. Defaults to ``"fifo"`` where
            `os.mkfifo` exists, else ``"spool"``.
        **kwargs: Passed to the channel class.

    Returns:
        The started channel.
    """
    kind = kind or ("fifo" if hasattr(os, "mkfifo") else "spool")
    classes = {"fifo": FifoChannel, "spool": SpoolChannel}
    if kind not in classes:
        raise ValueError(f"Unknown channel kind {kind!r}. Expected one of: fifo, spool.")
    return classes[kind](folder, **kwargs).start()


def send_command(address: str | os.PathLike, request: str | Command | Request, kind: str | None = None) -> Request:
    """Delivers one command to a channel without ever blocking.

    Args:
        address: A FIFO path, or the inbox folder of a spool channel.
        request: A command line, for example ``"stop"`` or ``"save #a1"``,
            or a `Command` or `Request`.
        kind: ``"fifo"`` or ``"spool"`` if the sender knows which the
            channel is (then anything else there is refused); None accepts
            either.

    Returns:
        The request delivered.

    Raises:
        UnknownCommandError: If `request` is not a valid request.
        NotListeningError: If no run listens there any more.
        UnsafePathError: If `address` is not a private FIFO or folder of
            ours (it is refused without being opened).
        ChannelError: If the command could not be written.
    """
    request = parse_request(request)
    address = Path(address)
    try:
        st = os.lstat(address)
    except FileNotFoundError:
        raise NotListeningError(f"No channel at {address}: the run is not listening.") from None
    if stat.S_ISDIR(st.st_mode) and kind in (None, "spool"):
        _send_to_spool(address, request)
    elif stat.S_ISFIFO(st.st_mode) and kind in (None, "fifo"):
        _send_to_fifo(address, request)
    else:  # a file, a folder where a FIFO should be, a symlink, a device: never opened
        check_private(address, st, kind="dir" if kind == "spool" else "fifo")
        raise UnsafePathError(f"Refusing {address}: expected a {kind}, found mode {stat.filemode(st.st_mode)}.")
    return request


def _send_to_fifo(path: Path, request: Request) -> None:
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


def _send_to_spool(inbox: Path, request: Request) -> None:
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
