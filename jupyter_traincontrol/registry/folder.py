"""A run's private folder in the registry, claimed for its name.

A run folder appears whole, by renaming a prepared one (with its lock link
and first record) into place, or not at all; the folder of an ended run of
the same process serves a new run of its name as it is. A record stays,
with its final state, while its process lives; `release` removes the
folder (keeping its last record in the history, `tombstones`), and every
folder this process claimed is released when it exits (`release_all`). A
claim releases this process's ended runs beyond the newest
`ENDED_RUNS_KEPT` into the history: a loop of new runs does not grow it.
An ended run's folder holds its lock and its last record only: what the
run made for its own writes (replaced records kept for later, empty files
made ahead) its thread removes as the run ends (`last_chore`).
"""

from __future__ import annotations

import atexit
import errno
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from ..protocol import ACTIVE_STATES, FINAL_STATES, RunState, shorten
from ..system.flock import ProcessLock
from ..system.private_fs import (
    check_private, ensure_private_dir, file_identity, make_empty_file, open_dir, read_json, write_json_atomic,
)
from .leftovers import Leftovers
from .listing import unique_name
from .liveness import LOCK_NAME, folder_is_live, move_away, remove_if_dead, set_aside, sweep_dead_runs
from .paths import CLAIM_PREFIX, RECORD_NAME, NameTakenError, registry_root, validate_name
from .tombstones import keep_tombstone

__all__ = ["ENDED_RUNS_KEPT", "RunFolder", "release_all"]

#: How many of its ended runs a process keeps in a registry; a claim moves
#: older ones to the history (`tombstones`, which `list --all` and the side
#: panel show).
ENDED_RUNS_KEPT = 20
_CLAIM_ATTEMPTS = 5
#: Empty files kept ready for the training thread's record writes: the one
#: that ends the run, and the first of the next run of this folder.
_PREPARED_FILES = 2
#: How long the run's thread waits, as its run ends, for the last record
#: (`RunFolder.last_chore`); a few milliseconds in practice.
_LAST_RECORD_WAIT_SECONDS = 10.0


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
        self._prepared: list[str] = []  # empty files made by `prepare_files`, for the next fast writes
        self._leftovers = Leftovers()  # for this run's thread: `free_kept`, `free_replaced`
        self._sealed = threading.Event()  # this run's last record is written: a new one for each run of the folder
        self._free_at_seal = False  # `last_chore` ran on the thread that seals: `seal` frees what it left

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
            sweep_later: Leave the sweep of dead runs to `free_replaced` (the
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
        if taken_over:  # its first record now, into a file made ahead
            run_folder.write_record({"state": RunState.STARTING.value}, keep_replaced=True)
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

    def write_record(self, record: dict[str, Any], keep_replaced: bool = False) -> None:
        """Replaces the run's record atomically (thread-safe).

        Args:
            record: The fields to write; `base_record` fields are added.
            keep_replaced: For the training thread: keep the replaced file
                under a second name (its freeing, 0.2-0.3 ms on ext4, is left
                to `free_replaced`) and write into a file `prepare_files`
                made, if one is ready (its creation, 0.05-0.2 ms, too).
        """
        with self._write_lock:
            if self.dir_fd < 0:
                return
            prepared = None
            if keep_replaced:
                self._keep_replaced()
                prepared = self._prepared.pop() if self._prepared else None
            full = self._full_record(record)
            self._written = write_json_atomic(self.record_path, full, dir_fd=self.dir_fd, into=prepared)
            self._last_record = full

    def _keep_replaced(self) -> None:
        name = f".{RECORD_NAME}.replaced-{uuid.uuid4().hex[:12]}"
        try:
            os.link(RECORD_NAME, name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd, follow_symlinks=False)
        except (OSError, NotImplementedError):
            return  # no record yet, or no hard links here: the rename frees it
        self._leftovers.unlink_later(self.path / name)

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

    def free_replaced(self) -> None:
        """Removes the replaced records `write_record` kept and what
        `free_kept` removes, and tidies the registry as `claim` or
        `remove_later` left it to (else the next sweep does). Any thread."""
        self._leftovers.free_all(self.path.parent)

    def prepare_files(self) -> None:
        """Makes the empty files the training thread's next record writes
        go into (see `write_record`). Any thread (the run's); they stay
        between runs of this folder, and go with it."""
        with self._write_lock:
            missing = _PREPARED_FILES - len(self._prepared)
            if self.dir_fd < 0 or missing <= 0:
                return
            dir_fd = os.dup(self.dir_fd)  # the folder, even if sealed meanwhile: made without the lock
        made = []
        try:
            for _ in range(missing):
                made.append(make_empty_file(RECORD_NAME, dir_fd=dir_fd))
        except OSError:
            pass  # a full disk, say: those writes make their own files
        try:
            with self._write_lock:
                # Kept only while a run of the folder is open: its end removes them. Sealed meanwhile (a
                # previous run's thread doing this late, after the last run's end had removed its files),
                # taken over or removed: nothing would take them or remove them.
                if not self._released and self.dir_fd >= 0:
                    self._prepared, made = self._prepared + made, []
            for name in made:
                os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass  # the folder went with them
        finally:
            os.close(dir_fd)

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
            self._sealed, self._free_at_seal = threading.Event(), False
            return True

    def seal(self) -> None:
        """Closes the folder's handle: the run has written its last record.
        Idempotent."""
        with self._write_lock:
            if self.dir_fd >= 0:
                os.close(self.dir_fd)
                self.dir_fd = -1
                self._sealed_at = time.monotonic()
            sealed, free_now, self._free_at_seal = self._sealed, self._free_at_seal, False
            sealed.set()
        if free_now:
            self._free_ended(sealed)

    def last_chore(self) -> Callable[[], None]:
        """The last chore of the run's thread for the run now ending
        (`RunLifecycle.close` asks for it before it writes the last record):
        `free_kept`, then, once the last record is written (`seal`), the
        removal of what the run made that no write of it will take: the
        replaced records kept for later and the empty files made ahead. The
        folder then holds its lock and its record only. A run of the folder
        reopened meanwhile keeps them (its own end removes them).

        Done on the thread that seals (a run whose thread had ended), the
        chore leaves that removal to `seal`, and never waits for itself.
        """
        sealed, closer = self._sealed, threading.get_ident()

        def chore() -> None:
            self.free_kept()
            if threading.get_ident() == closer:
                with self._write_lock:
                    if not sealed.is_set():
                        self._free_at_seal = sealed is self._sealed
                        return
            if sealed.wait(_LAST_RECORD_WAIT_SECONDS):
                self._free_ended(sealed)

        return chore

    def _free_ended(self, sealed: threading.Event) -> None:
        """Removes the empty files made ahead and the replaced records of the
        run that `sealed` is of, unless the folder serves another run now."""
        with self._write_lock:
            if sealed is not self._sealed or self._released or self.dir_fd >= 0:
                return  # reopened, released or taken over: not this run's to do
            prepared, self._prepared = self._prepared, []
        for name in prepared:
            try:
                os.unlink(self.path / name)
            except OSError:
                pass  # the folder went (released meanwhile)
        self._leftovers.free_all(self.path.parent)

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
                trash = None if keep_folder else set_aside(self.path)  # with the replaced records in it
                if keep_folder:
                    heir._prepared, self._prepared = self._prepared, []
                else:
                    self._leftovers.forget_files()
        if record is not None:
            (heir or self).remove_later(trash, prune_history=heir is not None)
        if heir is None:
            self.free_replaced()
        else:  # all of it, by the claim's run's thread: even what this run's thread had no time for
            self._leftovers.hand_to(heir._leftovers)
        return True

    def remove_later(self, trash: Path | None, prune_history: bool = False) -> None:
        """Leaves a folder set aside (`liveness.set_aside`; None: nothing was
        there) to `free_kept`, and with `prune_history`, bounding the history
        (a tombstone kept without it) to `free_replaced`."""
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
