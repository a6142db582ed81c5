"""A run's private folder in the registry, claimed for its name.

A run folder appears whole, by renaming a prepared one (with its lock link
and first record) into place, or not at all; the folder of an ended run of
the same process serves a new run of its name as it is. A record stays,
with its final state, while its process lives; `release` removes the
folder (keeping its last record in the history, `tombstones`), and every
folder this process claimed is released when it exits (`release_all`). A
claim releases this process's ended runs beyond the newest
`ENDED_RUNS_KEPT` into the history: a loop of new runs does not grow it.
An ended run's folder holds its lock and its last record only. What would
make the training thread wait (closing a removed folder's last descriptor,
removing a folder set aside, sweeping the registry) is left to the run's
thread (`free_kept`, `tidy_up`): a `RunFolder` notes such work in its
`Leftovers`, done once by whichever thread comes first, and a claim of the
same name takes over what an ended run had not done yet (`Leftovers.hand_to`).
Each is a few tenths of a millisecond on ext4 (a sweep about one): in a loop
of short fits, more than the rest of a run's opening and closing.
"""

from __future__ import annotations

import atexit
import errno
import os
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ..protocol import ACTIVE_STATES, FINAL_STATES, RunState, shorten
from ..system.flock import ProcessLock
from ..system.private_fs import (
    check_private, ensure_private_dir, file_identity, open_dir, read_json, write_json_atomic,
)
from .listing import unique_name
from .liveness import LOCK_NAME, folder_is_live, move_away, remove_if_dead, set_aside, sweep_dead_runs
from .paths import CLAIM_PREFIX, RECORD_NAME, NameTakenError, registry_root, validate_name
from .tombstones import keep_tombstone, remove_old_tombstones

__all__ = ["ENDED_RUNS_KEPT", "RunFolder", "Leftovers", "release_all"]

#: How many of its ended runs a process keeps in a registry; a claim moves
#: older ones to the history (`tombstones`, which `list --all` and the side
#: panel show).
ENDED_RUNS_KEPT = 20
_CLAIM_ATTEMPTS = 5


class RunFolder:
    """The private folder of one run, claimed for its name.

    Use `RunFolder.claim`; `release` gives the name back and removes the
    folder (only if it is still this run's).

    Attributes:
        name: The run's name.
        path: Its folder.
        run_id: A random id that tells this run from earlier ones of the
            same name.
    """

    def __init__(self, name: str, path: Path, run_id: str):
        self.name = name
        self.path = path
        self.run_id = run_id
        self._released = False
        self._sealed_at = 0.0  # when its run last ended (`seal`): the oldest ended runs are let go first
        self._write_lock = threading.RLock()  # re-entrant: defensive, a signal handler may land mid-write
        self.dir_fd = -1  # the folder, opened once: writes go through it, not through its path
        self._written: tuple[int, int, int] | None = None  # the identity of the record this run wrote last
        self._last_record: dict[str, Any] = {}  # and what it holds (`_own_record` reads no file it wrote)
        self._leftovers = Leftovers()  # for this run's thread: `free_kept`, `tidy_up`

    @property
    def record_path(self) -> Path:
        """The run's JSON record."""
        return self.path / RECORD_NAME

    @classmethod
    def claim(cls, name: str, root: Path | None = None, run_id: str | None = None, *,
              sweep_later: bool = False) -> "RunFolder":
        """Creates the private folder of a new run named `name`, atomically:
        the folder appears with its lock and first record (state
        ``starting``), or not at all. The folder of an ended run of this
        process is taken over instead (its record goes to the history).

        Args:
            name: The run's name; see `validate_name`.
            root: The registry folder. Defaults to `registry_root()`.
            run_id: The run instance's id. Defaults to a new one.
            sweep_later: Leave the sweep of dead runs to `tidy_up` (the
                run's thread); the folder of `name` is freed, if dead, anyway.

        Returns:
            The claimed folder.

        Raises:
            NameTakenError: If a live run already has this name.
            UnsafePathError: If the registry or the run's folder is a
                symlink, someone else's, or not private.
        """
        validate_name(name)
        root = ensure_private_dir(Path(root) if root else registry_root())
        if not sweep_later:
            sweep_dead_runs(root)  # so `echo stop > FIFO` never waits on a dead run's FIFO
        claimed = cls._claim_swept(name, root, run_id)
        if sweep_later:
            claimed._leftovers.tidy_later(sweep=True)
        return claimed

    @classmethod
    def _claim_swept(cls, name: str, root: Path, run_id: str | None) -> "RunFolder":
        """`claim` in a private registry folder just swept of dead runs."""
        folder = root / name
        run_folder = cls(name, folder, run_id or uuid.uuid4().hex)
        lock = ProcessLock.path_for(root)
        taken_over = False
        for _attempt in range(_CLAIM_ATTEMPTS):
            taken_over = _release_own(folder, run_folder, only_ended=True, keep_folder=True)
            if taken_over:
                break  # an ended run of this process: its folder serves as it is (its record in the history)
            if os.path.lexists(folder):  # freed first (its run has ended), not after a staging made in vain
                _free_name(folder, name, heir=run_folder)
            staging = Path(tempfile.mkdtemp(prefix=CLAIM_PREFIX, dir=root))
            os.link(lock, staging / LOCK_NAME)
            write_json_atomic(staging / RECORD_NAME, run_folder._full_record({"state": RunState.STARTING.value}))
            try:
                if not os.path.lexists(folder):
                    os.rename(staging, folder)  # fails if another claim got there first
                    break
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    move_away(staging)
                    raise
            move_away(staging)  # another claim got there first
        else:
            raise NameTakenError(f"Could not claim the name {name!r}: other processes keep taking it.")
        run_folder.dir_fd = open_dir(folder)
        if taken_over:  # its first record now
            run_folder.write_record({"state": RunState.STARTING.value})
        _claimed_in_this_process.add(run_folder)
        _release_old_ended_runs(root)
        return run_folder

    @classmethod
    def claim_any(cls, name: str | None, root: Path | None = None, run_id: str | None = None, *,
                  sweep_later: bool = False) -> "RunFolder":
        """Claims `name` (see `claim`, which `sweep_later` goes to), or with
        None the first free ``run-N`` (after a sweep: a dead run's name is free).

        Raises:
            NameTakenError: If a live run has `name`, or no ``run-N`` stayed
                free long enough to be claimed.
        """
        if name is not None:
            return cls.claim(name, root, run_id=run_id, sweep_later=sweep_later)
        root = ensure_private_dir(Path(root) if root else registry_root())
        for _attempt in range(20):
            try:  # unique_name sweeps the registry first: one sweep a claim, not two
                return cls._claim_swept(unique_name("run", root), root, run_id)
            except NameTakenError:
                continue  # another process took it between listing and claiming
        raise NameTakenError("Could not find a free run name; pass name= explicitly.")

    def base_record(self) -> dict[str, Any]:
        """The fields every record of this run carries."""
        return {"name": self.name, "run_id": self.run_id, "pid": os.getpid()}

    def _full_record(self, record: dict[str, Any]) -> dict[str, Any]:
        return {**record, **self.base_record(), "updated": time.time()}

    def write_record(self, record: dict[str, Any]) -> None:
        """Replaces the run's record atomically (thread-safe).

        Args:
            record: The fields to write; `base_record` fields are added.
        """
        with self._write_lock:
            if self.dir_fd < 0:
                return
            full = self._full_record(record)
            self._written = write_json_atomic(self.record_path, full, dir_fd=self.dir_fd)
            self._last_record = full

    def close_later(self, fd: int) -> None:
        """Keeps `fd`, the last descriptor of a folder removed (a checkpoint
        folder its run left empty), for the run's thread to close as it ends
        (`free_kept`): the close frees the folder, which the training thread
        then does not wait for. Once the run has ended, closes it now."""
        with self._write_lock:
            if self.dir_fd >= 0:
                self._leftovers.close_later(fd)
                return
        os.close(fd)

    def free_kept(self) -> None:
        """Frees what was left to this run's thread: closes what
        `close_later` kept and removes the folders set aside for it
        (`remove_later`). Any thread; the run's, as it ends."""
        self._leftovers.free_kept()

    def tidy_up(self) -> None:
        """Frees what `free_kept` frees, and tidies the registry as `claim`
        or `remove_later` left it to (else the next sweep does). Any thread
        (the run's, soon after the run opens, or as it ends if that came first)."""
        self._leftovers.free_all(self.path.parent)

    def reopen(self, run_id: str) -> bool:
        """Takes the folder again for a new run of the same name and process
        (a reused callback's next `fit`), if it still holds this process's
        ended run: no new folder, lock or tombstone. The caller writes the
        new run's record. Returns False if it does not (claim anew)."""
        with self._write_lock:
            if self._released or self.dir_fd >= 0 or not (self._wrote_what_is_there() or self.owns_folder()):
                return False
            try:
                self.dir_fd = open_dir(self.path)
            except OSError:
                return False
            self.run_id = run_id
            return True

    def seal(self) -> None:
        """Closes the folder's handle: the run has written its last record.
        Idempotent."""
        with self._write_lock:
            if self.dir_fd >= 0:
                os.close(self.dir_fd)
                self.dir_fd = -1
                self._sealed_at = time.monotonic()

    def _wrote_what_is_there(self) -> bool:
        """True if the record on disk is the very file this run wrote last
        (one stat, where `owns_folder` reads and parses it)."""
        try:
            return self._written is not None and file_identity(os.stat(self.record_path)) == self._written
        except OSError:
            return False

    def owns_folder(self) -> bool:
        """True while the folder on disk still belongs to this run."""
        return self._own_record() is not None

    def _own_record(self) -> dict[str, Any] | None:
        """The record on disk, if the folder still belongs to this run (not
        read again if it is the very file this run wrote last)."""
        with self._write_lock:
            if self._wrote_what_is_there():
                record = self._last_record
                return record if record.get("run_id") == self.run_id else None
        record = read_json(self.record_path)
        return record if isinstance(record, dict) and record.get("run_id") == self.run_id else None

    def release(self) -> None:
        """Removes the run's folder if it is still this run's, keeping its
        last record in the history (see `tombstones`). Idempotent."""
        self._release(only_ended=False)

    def _release(self, *, only_ended: bool, heir: "RunFolder | None" = None, keep_folder: bool = False) -> bool:
        """`release`; with `heir` (a claim of this name), what is left to do
        (the folder set aside, removed) is left to the heir's run's thread,
        and with `keep_folder` the heir takes the folder as it is."""
        with self._write_lock:
            if self._released or only_ended and self.dir_fd >= 0:  # gone already, or (re)opened by its run
                return False
            self._released = True  # from here `reopen` refuses it
        _claimed_in_this_process.discard(self)
        self.seal()
        with self._write_lock:
            record = self._own_record()
            if record is not None:
                keep_tombstone(self.path, record, prune=heir is None)  # a claim's run's thread bounds the history
                trash = None if keep_folder else set_aside(self.path)
        if record is not None:
            (heir or self).remove_later(trash, prune_history=heir is not None)
        if heir is None:
            self.tidy_up()
        else:  # all of it, by the claim's run's thread: even what this run's thread had no time for
            self._leftovers.hand_to(heir._leftovers)
        return True

    def remove_later(self, trash: Path | None, prune_history: bool = False) -> None:
        """Leaves a folder set aside (`liveness.set_aside`; None: nothing was
        there) to `free_kept`, and with `prune_history`, bounding the history
        (a tombstone kept without it) to `tidy_up`."""
        if trash is not None:
            self._leftovers.remove_later(trash)
        if prune_history:
            self._leftovers.tidy_later(sweep=False)

    @property
    def ended(self) -> bool:
        """True while the folder is claimed and its run has ended (sealed, not reopened)."""
        return not self._released and self.dir_fd < 0


def _free_name(folder: Path, name: str, heir: RunFolder) -> None:
    """Frees the name held by `folder` if its run has ended or its process
    died. An ended run's folder is set aside for `heir` (the claim's) to
    remove later (`RunFolder.free_kept`, on its run's thread).

    Raises:
        NameTakenError: If the run there is still active.
        UnsafePathError: If `folder` is not a private folder of ours.
    """
    try:
        check_private(folder, os.lstat(folder), kind="dir")
    except FileNotFoundError:
        return  # freed meanwhile
    if not folder_is_live(folder):
        remove_if_dead(folder)
        return
    record = read_json(folder / RECORD_NAME)
    state = record.get("state") if isinstance(record, dict) else None
    if not (isinstance(state, str) and state in FINAL_STATES):
        pid = record.get("pid") if isinstance(record, dict) else None
        shown = state if isinstance(state, str) and state in ACTIVE_STATES else "starting"
        raise NameTakenError(
            f"A run named {name!r} is already {shown} (pid {shorten(repr(pid), 80)}). "
            "Choose another name, or stop that run first."
        )
    if not _release_own(folder, heir, only_ended=False):  # ended, of this process: let go of it now
        keep_tombstone(folder)  # an ended run of another live process: its record goes to the history
        heir.remove_later(set_aside(folder))


def _release_own(folder: Path, heir: RunFolder, only_ended: bool, keep_folder: bool = False) -> bool:
    """Releases `folder` for `heir` if this process claimed it, it still
    holds its run's record (read from memory: see `_own_record`), and (with
    `only_ended`) that run has ended; `keep_folder`: see `RunFolder._release`."""
    return any(claimed.path == folder and (claimed.ended or not only_ended) and claimed.owns_folder()
               and claimed._release(only_ended=only_ended, heir=heir, keep_folder=keep_folder)
               for claimed in list(_claimed_in_this_process))


_claimed_in_this_process: set[RunFolder] = set()


def _release_old_ended_runs(root: Path) -> None:
    """Releases this process's ended runs in `root` beyond the newest
    `ENDED_RUNS_KEPT` (their records go to the history)."""
    ended = [folder for folder in list(_claimed_in_this_process) if folder.ended and folder.path.parent == root]
    if len(ended) <= ENDED_RUNS_KEPT:
        return
    ended.sort(key=lambda folder: folder._sealed_at)
    for folder in ended[:len(ended) - ENDED_RUNS_KEPT]:
        folder._release(only_ended=True)  # not if its run reopened it meanwhile


@atexit.register
def release_all() -> None:
    """Releases every run folder this process claimed (at exit, or before `os._exit`)."""
    for run_folder in list(_claimed_in_this_process):
        run_folder.release()


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
