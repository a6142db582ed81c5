"""Liveness of runs: a run is alive while its process holds its lock (flock).

Each run folder's ``lock`` is a hard link to the one lock file its process
holds for its lifetime (`system.flock.ProcessLock`). The OS lets go of the
lock when the process ends, however it ends, so "is this run alive" needs
no look at the process table. Whoever removes a dead run's folder or lock
file holds that lock meanwhile, so a live process never loses its own.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
import uuid
from pathlib import Path

from ..system.flock import LOCKS_FOLDER, same_file, try_lock
from ..system.private_fs import check_private
from .paths import CLAIM_PREFIX
from .tombstones import keep_tombstone, remove_old_tombstones

__all__ = ["LOCK_NAME", "TRASH_PREFIX", "folder_is_live", "move_away", "set_aside", "remove_if_dead", "remove_dead_locks", "sweep_dead_runs"]

#: A run folder's hard link to its process's lock file.
LOCK_NAME = "lock"
#: Run folders renamed for removal (`set_aside`).
TRASH_PREFIX = ".removed-"
#: How long a folder set aside, or a claim's staging folder without its lock
#: link, waits for the process that made it to finish with it, before a sweep removes it.
_TRASH_GRACE_SECONDS = 60.0


def _open_lock(folder: Path) -> int | None:
    """Opens a run folder's lock file (never through a symlink), or None if missing."""
    try:
        return os.open(folder / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None


def folder_is_live(folder: Path) -> bool:
    """True while the process of the run in `folder` holds its lock."""
    fd = _open_lock(folder)
    if fd is None:
        return False
    try:
        return not try_lock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)  # also drops the shared lock if we took it


def move_away(folder: Path) -> None:
    """Removes a run folder, first renaming it so no reader sees it half-gone."""
    trash = set_aside(folder)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def set_aside(folder: Path) -> Path | None:
    """Renames a run folder to a hidden name (``.removed-...``), for its
    removal later; returns that name, or None if the folder was gone. Its
    name is free at once; a sweep removes what a process left set aside."""
    trash = folder.parent / f"{TRASH_PREFIX}{uuid.uuid4().hex}"
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        return None
    return trash


def remove_if_dead(folder: Path) -> bool:
    """Removes the folder of a dead run, holding its lock meanwhile, and
    keeps its last record in the history (`tombstones`). Returns True if
    removed. A folder without a lock file is not a run's (claims are
    atomic), so it goes too."""
    fd = _open_lock(folder)
    if fd is None:
        move_away(folder)
        return True
    try:
        if not try_lock(fd, fcntl.LOCK_EX):
            return False
        keep_tombstone(folder)
        move_away(folder)
        return True
    finally:
        os.close(fd)


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
            if try_lock(fd, fcntl.LOCK_EX) and same_file(path, fd):
                os.unlink(path)
        finally:
            os.close(fd)


def sweep_dead_runs(root: Path) -> None:
    """Removes the folders (FIFOs included) and lock files of dead processes,
    claims their process never finished, folders set aside long ago, and
    what the history no longer keeps."""
    remove_dead_locks(root)
    for name in os.listdir(root):
        if name.startswith(CLAIM_PREFIX):
            _remove_unfinished_claim(root / name)
    remove_old_tombstones(root)
    for name in os.listdir(root):
        folder = root / name
        if name.startswith(TRASH_PREFIX):
            _remove_old_trash(folder)
        if name.startswith("."):
            continue
        try:
            check_private(folder, os.lstat(folder), kind="dir")
            if not folder_is_live(folder):
                remove_if_dead(folder)
        except OSError:
            continue  # not ours to remove (a planted symlink, someone else's), or gone


def _remove_unfinished_claim(staging: Path) -> None:
    """Removes a claim's staging folder whose process never finished it:
    one with a lock file if that lock is free, one without only once older
    than a claim would take to link it (a claim made just now, by this
    process's other thread or another process, has no lock link yet)."""
    try:
        if os.path.lexists(staging / LOCK_NAME) or _past_grace(staging):
            remove_if_dead(staging)
    except OSError:
        pass  # finished or removed meanwhile


def _remove_old_trash(folder: Path) -> None:
    """Removes a folder set aside (`set_aside`) longer ago than its setter
    would have taken to remove it (a process that ended first)."""
    try:
        if _past_grace(folder):
            shutil.rmtree(folder, ignore_errors=True)
    except OSError:
        pass  # removed meanwhile


def _past_grace(folder: Path) -> bool:
    """True if `folder` was made (or renamed) longer than `_TRASH_GRACE_SECONDS` ago."""
    return os.lstat(folder).st_ctime < time.time() - _TRASH_GRACE_SECONDS
