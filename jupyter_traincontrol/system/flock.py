"""``flock`` without waiting, and the one lock file a process holds for its lifetime.

A lock taken with `fcntl.flock` is let go by the OS when its process ends,
however it ends: "is the holder alive" needs no look at the process table.
`ProcessLock` is the lock file this process creates and holds, one per
registry, for as long as it lives (every run folder's ``lock`` is a hard
link to it; see `registry.liveness`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import uuid
from pathlib import Path

from .private_fs import ensure_private_dir

__all__ = ["LockFileError", "ProcessLock", "try_lock", "same_file", "LOCKS_FOLDER"]

#: Where the lock files of the processes live, under a registry folder.
LOCKS_FOLDER = ".locks"
_CREATE_ATTEMPTS = 5


class LockFileError(OSError):
    """This process could not create and hold its lock file."""


def try_lock(fd: int, mode: int) -> bool:
    """Takes a flock (``fcntl.LOCK_SH`` or ``LOCK_EX``) without waiting;
    False if another holder has it."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


def same_file(path: Path, fd: int) -> bool:
    """True if `path` is (still) the file open as `fd`."""
    try:
        on_disk = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


class ProcessLock:
    """The one lock file this process holds, per registry, for its lifetime.

    Every run folder's ``lock`` is a hard link to it, so each run holds its
    lock for as long as its process lives (ended runs stay listed until
    then) at the cost of one descriptor per process, not one per run.
    """

    _held: dict[Path, tuple[int, Path]] = {}
    _guard = threading.Lock()

    @classmethod
    def path_for(cls, root: Path) -> Path:
        """The lock file of this process under `root`, created and locked on first use."""
        with cls._guard:
            held = cls._held.get(root)
            if held is not None and same_file(held[1], held[0]):
                return held[1]
            folder = ensure_private_dir(root / LOCKS_FOLDER)
            for _attempt in range(_CREATE_ATTEMPTS):
                path = folder / f"{os.getpid()}-{uuid.uuid4().hex}"
                flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(path, flags, 0o600)
                if try_lock(fd, fcntl.LOCK_EX) and same_file(path, fd):
                    cls._held[root] = (fd, path)
                    return path
                os.close(fd)  # a lister took it for a dead one's: try another name
            raise LockFileError(f"Could not create a lock file in {folder}: other processes keep removing it.")

    @classmethod
    def forget_inherited(cls) -> None:
        """In a forked child: let go of the parent's locks (they stay the parent's)."""
        for fd, _path in cls._held.values():
            os.close(fd)
        cls._held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=ProcessLock.forget_inherited)
