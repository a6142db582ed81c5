"""Liveness of runs: a run is alive while its process holds its lock (flock).

Each run folder's ``lock`` is a hard link to one lock file its process
creates under the registry's ``.locks/`` and holds for its lifetime: one
descriptor per process, however many runs it starts. The OS lets go of the
lock when the process ends, however it ends, so "is this run alive" needs
no look at the process table. Whoever removes a dead run's folder or lock
file holds that lock meanwhile, so a live process never loses its own.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import threading
import uuid
from pathlib import Path

from .private_fs import ensure_private_dir

__all__ = [
    "LOCK_NAME",
    "LockFileError",
    "ProcessLock",
    "folder_is_live",
    "move_away",
    "remove_if_dead",
    "remove_dead_locks",
]

LOCK_NAME = "lock"
LOCKS_FOLDER = ".locks"
CREATE_ATTEMPTS = 5


class LockFileError(OSError):
    """This process could not create and hold its lock file."""


def _open_lock(folder: Path) -> int | None:
    """Opens a run folder's lock file (never through a symlink), or None if missing."""
    try:
        return os.open(folder / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None


def _try_lock(fd: int, mode: int) -> bool:
    """Takes a flock without waiting; False if another holder has it."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


def _same_file(path: Path, fd: int) -> bool:
    """True if `path` is (still) the file open as `fd`."""
    try:
        on_disk = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


def folder_is_live(folder: Path) -> bool:
    """True while the process of the run in `folder` holds its lock."""
    fd = _open_lock(folder)
    if fd is None:
        return False
    try:
        return not _try_lock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)  # also drops the shared lock if we took it


def move_away(folder: Path) -> None:
    """Removes a run folder, first renaming it so no reader sees it half-gone."""
    trash = folder.parent / f".removed-{uuid.uuid4().hex}"
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def remove_if_dead(folder: Path) -> bool:
    """Removes the folder of a dead run, holding its lock meanwhile. Returns
    True if removed. A folder without a lock file is not a run's (claims
    are atomic), so it goes too."""
    fd = _open_lock(folder)
    if fd is None:
        move_away(folder)
        return True
    try:
        if not _try_lock(fd, fcntl.LOCK_EX):
            return False
        move_away(folder)
        return True
    finally:
        os.close(fd)


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
            if held is not None and _same_file(held[1], held[0]):
                return held[1]
            folder = ensure_private_dir(root / LOCKS_FOLDER)
            for _attempt in range(CREATE_ATTEMPTS):
                path = folder / f"{os.getpid()}-{uuid.uuid4().hex}"
                flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(path, flags, 0o600)
                if _try_lock(fd, fcntl.LOCK_EX) and _same_file(path, fd):
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


def remove_dead_locks(root: Path) -> None:
    """Removes the lock files of processes that have ended."""
    folder = root / LOCKS_FOLDER
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        names = []
    for name in names:
        path = folder / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if _try_lock(fd, fcntl.LOCK_EX) and _same_file(path, fd):
                os.unlink(path)
        finally:
            os.close(fd)
