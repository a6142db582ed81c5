"""What a run's folder leaves to its run's thread, so the training thread does not wait for it.

Freeing a file or folder on ext4 costs a few tenths of a millisecond, and a
sweep of the registry about a millisecond: in a loop of short fits, more
than the rest of a run's opening and closing. A `RunFolder` notes such work
in its `Leftovers` (a descriptor whose close frees a removed folder, a
folder set aside, a sweep or a bound of the history);
its run's thread does it (`free_kept`, `free_all`), and a claim of the
same name takes over what an ended run had not done yet (`hand_to`).
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from .liveness import sweep_dead_runs
from .tombstones import remove_old_tombstones

__all__ = ["Leftovers"]

_NOTHING, _BOUND_HISTORY, _SWEEP = 0, 1, 2  # what tidies the registry; a sweep bounds the history too


class Leftovers:
    """Work on files left for later, done once, by whichever thread comes first."""

    def __init__(self):
        self._lock = threading.Lock()
        self._descriptors: list[int] = []
        self._folders: list[Path] = []
        self._tidy = _NOTHING

    def close_later(self, fd: int) -> None:
        """Keeps `fd` to close (its close frees a folder removed)."""
        with self._lock:
            self._descriptors.append(fd)

    def remove_later(self, folder: Path) -> None:
        """Keeps `folder` (set aside: `liveness.set_aside`) to remove."""
        with self._lock:
            self._folders.append(folder)

    def tidy_later(self, sweep: bool) -> None:
        """Keeps a sweep of dead runs (`sweep`), else a bound of the history, to do."""
        with self._lock:
            self._tidy = max(self._tidy, _SWEEP if sweep else _BOUND_HISTORY)

    def hand_to(self, other: "Leftovers") -> None:
        """Leaves all that is kept to `other` (a new run's, which a claim frees a name for)."""
        with self._lock:
            descriptors, folders, tidy = self._take()
        with other._lock:
            other._descriptors += descriptors
            other._folders += folders
            other._tidy = max(other._tidy, tidy)

    def free_kept(self) -> None:
        """Closes the descriptors and removes the folders kept. Any thread."""
        with self._lock:
            descriptors, self._descriptors = self._descriptors, []
            folders, self._folders = self._folders, []
        for fd in descriptors:
            os.close(fd)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)

    def free_all(self, registry: Path) -> None:
        """`free_kept`, and tidies `registry` as asked. Any thread."""
        self.free_kept()
        with self._lock:
            tidy, self._tidy = self._tidy, _NOTHING
        if tidy == _SWEEP:
            sweep_dead_runs(registry)
        elif tidy == _BOUND_HISTORY:
            remove_old_tombstones(registry)

    def _take(self) -> tuple[list[int], list[Path], int]:
        taken = self._descriptors, self._folders, self._tidy
        self._descriptors, self._folders, self._tidy = [], [], _NOTHING
        return taken
