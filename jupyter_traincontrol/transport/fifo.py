"""A run's channel as a named pipe: mode 0600, inside the run's private folder.

The reader holds its own write end open, so the FIFO never reports
end-of-file between writers and is never reopened per batch; if something
removes or replaces the FIFO, the reader re-creates it.
"""

from __future__ import annotations

import os
import select
import stat
import threading
from pathlib import Path

from ..protocol import LineDecoder
from ..system.private_fs import check_private
from .receiver import CommandChannel

__all__ = ["FifoChannel", "FIFO_NAME"]

#: The FIFO's name in a run folder.
FIFO_NAME = "control"
_READ_SIZE = 65536


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
        self._wake_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)  # a full pipe wakes the reader already
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
        ready = poller.poll(timeout * 1000)
        if not ready:
            return
        if any(fd == self._wake_r for fd, _events in ready):
            try:
                os.read(self._wake_r, _READ_SIZE)  # taken: the next poll waits again
            except BlockingIOError:
                pass
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
        self.on_notice(f"The FIFO {self.path} was {what}; re-created it.")

    def _wake_reader(self) -> None:
        with self._wake_lock:  # never a write into a descriptor closed meanwhile (its number reused)
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except OSError:  # full: a wake-up waits already
                pass

    def _close_descriptors(self) -> None:
        self._close_fds()
        with self._wake_lock:
            wake_r, wake_w = self._wake_r, self._wake_w
            self._wake_r = self._wake_w = -1
        os.close(wake_r)
        os.close(wake_w)

    def _remove(self) -> None:
        name, at = self._at()
        try:
            if stat.S_ISFIFO(os.stat(name, follow_symlinks=False, **at).st_mode):
                os.unlink(name, **at)
        except FileNotFoundError:
            pass
