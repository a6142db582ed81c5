"""Holding a checkpoint folder: its OS lock, the intent record, and recovery.

A live run holds its folder with an OS lock (`fcntl.flock` on ``.traincontrol.lock``, which
names the holder), released by the kernel when the process dies. A second holder of the same
folder, in this process or another, fails with `CheckpointDirBusyError`. While it holds the
folder, the holder works through a descriptor of it opened once, and a save fails clearly if
the path now leads to another folder.

Before a save stages anything, it records its intent (the staging folder's and the model
file's names, then the staged file's inode and size) in the lock file, in one page written
with one ``pwrite``; a later holder uses that record, and only that, to remove what a killed
save left, and only files of the names a save makes (its checkpoint files, its staging
folders). A lock file owned by another user is refused; one that others could write has its
intent ignored (and is made private). The lock file stays with anything else the folder
holds; a folder its holder created and leaves with nothing else in it (a run that ended
without a checkpoint) is removed on release, so ended runs leave no empty folders behind. A
second holder that opened the lock file just before it was removed takes the folder anew.

What the folder holds is read in one pass (`scan`): it may hold anything (``ModelCheckpoint``
output, a file copied in by hand, other runs' checkpoints, what a killed save left), and `scan`
reads every sidecar-like file, never raising for one: a complete checkpoint is a valid sidecar
of this tool whose model file exists with the size it says.

`CheckpointStore` holds one (`CheckpointStore.folder`) and adds what a checkpoint is; the
commit protocol (`store.Committer`) works through it.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import logging
import os
import re
import stat
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

from ..system.private_fs import UnsafePathError, describe_kind, ensure_private_dir, make_private_dirs
from .records import (
    Checkpoint, CheckpointDirBusyError, CheckpointDirChangedError, CheckpointDirError, MalformedSidecarError,
)
from .sidecar import DEFAULT_RUN, TOOL, check_run_name, is_folder_part, part_size, read_sidecar, remove_part, sidecar_of

__all__ = ["CheckpointFolder", "LOCK_FILE", "STAGING_PREFIX", "Scan", "scan", "OUR_NAME"]

logger = logging.getLogger("jupyter_traincontrol")

#: Names the store writes, used only to avoid reusing a number and to say
#: which broken sidecar a resume skipped; never to decide what is ours.
OUR_NAME = re.compile(r"^ckpt-(?P<seq>\d{6,})-epoch\d+-step\d+\.(?:keras|pt|ckpt|json)$")

#: The lock file of a checkpoint folder (removed only with an empty folder its holder made: see `CheckpointFolder.release`).
LOCK_FILE = ".traincontrol.lock"
#: Hidden staging folders of saves in progress: ``.partial-RUNID-SEQ``.
STAGING_PREFIX = ".partial-"
_LOCK_RECORD_BYTES = 4096  # one page: a record is written with one pwrite, whole or not at all
#: A staging folder's name, as a save makes it (the only kind an intent record may name, with model files).
_STAGING_NAME = re.compile(r"^\.partial-[0-9a-f]{32}-\d{1,16}$")
#: How often `acquire` takes the folder anew when its holder removed it meanwhile.
_ACQUIRE_ATTEMPTS = 5


class _FolderRemoved(Exception):
    """The folder, or its lock file, was removed while being taken (its last holder left it empty)."""


class CheckpointFolder:
    """One checkpoint folder, held by one run of this process.

    Args:
        directory: The folder; created (mode 0700, and any missing parent
            too) when first taken.
        run: The run's name. Defaults to ``"run"``.
        run_id: The run instance's id (32 hex digits; the run record's).
            Defaults to a new one.
        private: True for a folder the tool chose: it and its parent are
            then created private or must be real, private folders of the
            current user. Defaults to False.
        on_phase: Called with the name of each phase completed (see
            `CheckpointStore`).
        close_removed: Closes the descriptor of a folder `release` removed, which frees it (0.2 ms
            on ext4; a run's own thread does it: `registry.RunFolder.close_later`). Defaults to `os.close`.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        run: str | None = None,
        run_id: str | None = None,
        private: bool = False,
        on_phase: Callable[[str], None] | None = None,
        close_removed: Callable[[int], None] = os.close,
    ):
        if run is not None:
            try:
                check_run_name(run)
            except ValueError as error:
                raise ValueError(f"run is {error}.") from None
        self.directory = Path(directory).absolute()
        self.run = DEFAULT_RUN if run is None else run
        self.run_id = run_id or uuid.uuid4().hex
        self.private = bool(private)
        self.on_phase = on_phase
        self._dir_fd: int | None = None
        self._lock_fd: int | None = None
        self._identity: tuple[int, int] | None = None
        self._pending: dict[str, Any] | None = None
        self._made: list[Path] = []  # the folders this hold made (parents first): removed on release if left empty
        self._close_removed = close_removed

    @property
    def dir_fd(self) -> int | None:
        """The folder's descriptor while held, else None."""
        return self._dir_fd

    @property
    def pending(self) -> dict[str, Any] | None:
        """The intent recorded in the lock file now (a save in progress), or None."""
        return self._pending

    @property
    def held(self) -> bool:
        """True between `acquire` and `release`."""
        return self._lock_fd is not None

    def acquire(self) -> "CheckpointFolder":
        """Takes the folder: checks it, creates it if missing, locks it.

        Also removes what a save killed in an earlier process left (as
        recorded in the lock file). Idempotent.

        Returns:
            self.

        Raises:
            CheckpointDirError: If the folder is a file, a dangling symlink,
                unwritable, or (with ``private``) not a private folder of the
                current user. The message names the path.
            CheckpointDirBusyError: If another live run holds the folder; the
                message names it and its process.
        """
        if self.held:
            return self
        for _ in range(_ACQUIRE_ATTEMPTS):
            try:
                dir_fd = self._open_folder()
            except _FolderRemoved:
                continue
            try:
                lock_fd, previous = self._lock(dir_fd)
                break
            except _FolderRemoved:
                os.close(dir_fd)
            except BaseException:
                os.close(dir_fd)
                raise
        else:
            raise CheckpointDirError(
                f"Could not take checkpoint folder {self.directory}: it was removed each of the "
                f"{_ACQUIRE_ATTEMPTS} times it was opened; expected a folder that stays."
            )
        self._dir_fd, self._lock_fd = dir_fd, lock_fd
        self._identity = _identity(os.fstat(dir_fd))
        pending = previous.get("pending")
        self._pending = pending if isinstance(pending, dict) else None  # kept until recovered
        try:
            self._write_lock_record()
            self.phase("locked")
            self._recover()
        except OSError as error:
            self.release()
            raise CheckpointDirError(f"Could not take checkpoint folder {self.directory}: {error.strerror or error}.") from error
        return self

    def release(self) -> None:
        """Lets the folder go: the lock file stays, marked free, unless this hold made the folder and
        only the lock file is in it (then both go, and the parents it made while empty). Idempotent."""
        lock_fd, dir_fd, identity = self._lock_fd, self._dir_fd, self._identity
        self._lock_fd = self._dir_fd = self._identity = None
        if lock_fd is None:
            return
        removed = False
        try:
            removed = self._made[-1:] == [self.directory] and self._remove_if_empty(dir_fd, identity)
            if not removed:
                _write_record(lock_fd, {"tool": TOOL, "holder": None})
        except OSError as error:
            logger.warning("Could not mark %s free: %s", self.directory / LOCK_FILE, error)
        finally:
            os.close(lock_fd)  # drops the flock
            (self._close_removed if removed else os.close)(dir_fd)

    def _remove_if_empty(self, dir_fd: int, identity: tuple[int, int] | None) -> bool:
        """Removes the folder (still locked) if its lock file is all it holds;
        True if the lock file went (the folder too, unless a new taker's is in it)."""
        if self._pending is not None or os.listdir(dir_fd) != [LOCK_FILE]:
            return False
        os.unlink(LOCK_FILE, dir_fd=dir_fd)  # a taker that opened it before this sees it gone, and retries
        try:
            if _identity(os.lstat(self.directory)) == identity:
                os.rmdir(self.directory)  # fails if a new taker's lock file is in it already: it stays theirs
                for parent in reversed(self._made[:-1]):  # then the parents it made, while empty
                    os.rmdir(parent)
        except OSError:
            pass
        return True

    def __enter__(self) -> "CheckpointFolder":
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()

    def _open_folder(self) -> int:
        """Creates or checks the folder; returns a descriptor of it."""
        path = self.directory
        self._made = []
        try:
            if self.private:
                self._made = make_private_dirs(path.parent)
                ensure_private_dir(path.parent)  # checked before anything is made in it
                self._made += make_private_dirs(path)
                ensure_private_dir(path)
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                if _identity(os.fstat(fd)) != _identity(os.lstat(path)):
                    os.close(fd)
                    raise UnsafePathError(f"Refusing {path}: it was replaced while being opened.")
                return fd
            if os.path.islink(path) and not os.path.exists(path):
                raise CheckpointDirError(
                    f"Checkpoint folder {path} is a symlink to {os.readlink(path)!r}, which does not exist; "
                    f"expected a folder (or a link to one)."
                )
            if not os.path.lexists(path):
                self._made = make_private_dirs(path)
            st = os.stat(path)
            if not stat.S_ISDIR(st.st_mode):
                raise CheckpointDirError(
                    f"Checkpoint folder {path} is {describe_kind(st)}; expected a folder (created if missing)."
                )
            if not os.access(path, os.W_OK | os.X_OK):
                raise CheckpointDirError(f"Checkpoint folder {path} is not writable by this user; expected a folder it can write.")
            return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except UnsafePathError as error:
            raise CheckpointDirError(f"Checkpoint folder {path} is unsafe: {error}") from error
        except CheckpointDirError:
            raise
        except FileNotFoundError as error:
            if os.path.lexists(path.parent):
                raise _FolderRemoved() from error  # its last holder removed it just now
            raise CheckpointDirError(f"Could not use checkpoint folder {path}: {error.strerror or error}.") from error
        except OSError as error:
            raise CheckpointDirError(f"Could not use checkpoint folder {path}: {error.strerror or error}.") from error

    def _lock(self, dir_fd: int) -> tuple[int, dict]:
        """Opens and flocks the lock file; returns it and its previous record."""
        lock_path = self.directory / LOCK_FILE
        try:
            fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        except FileNotFoundError as error:
            raise _FolderRemoved() from error  # the folder itself was removed since it was opened
        except OSError as error:
            if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise CheckpointDirError(
                    f"Checkpoint folder {self.directory} is not writable: {error.strerror}; expected a folder this user can write."
                ) from error
            raise CheckpointDirError(f"Could not open {lock_path}: {error.strerror}; expected a regular file of ours.") from error
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointDirError(f"{lock_path} is not a regular file; expected the folder's lock file.")
            uid = os.getuid() if hasattr(os, "getuid") else None
            if uid is not None and st.st_uid != uid:
                raise CheckpointDirError(
                    f"{lock_path} belongs to uid {st.st_uid}, not to this user (uid {uid}): a lock file someone else put "
                    f"there is not acted on. Expected a lock file of this user's; use a checkpoint folder of your own."
                )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_record(fd).get("holder") or {}
                raise CheckpointDirBusyError(
                    f"Checkpoint folder {self.directory} is in use by run {holder.get('run', '?')!r} "
                    f"(pid {holder.get('pid', '?')}); expected a folder no live run holds. Give this run its own "
                    f"checkpoint_dir, or end that run first."
                ) from None
            if not _still_linked(st, dir_fd):
                raise _FolderRemoved()  # its holder removed it (left empty) before letting go: take the folder anew
            record = _read_record(fd)
            if st.st_mode & 0o022:  # others could have written its intent: what it says is not acted on
                os.fchmod(fd, 0o600)
                if record.get("pending") is not None:
                    logger.warning("%s was writable by others (mode %s): its recorded intent was ignored and the "
                                   "file made private.", lock_path, stat.filemode(st.st_mode))
                record = {key: value for key, value in record.items() if key != "pending"}
            return fd, record
        except BaseException:
            os.close(fd)
            raise

    def _write_lock_record(self) -> None:
        holder = {"run": self.run, "run_id": self.run_id, "pid": os.getpid(), "since": time.time()}
        _write_record(self._lock_fd, {"tool": TOOL, "holder": holder, "pending": self._pending})

    def record_intent(self, pending: dict[str, Any] | None) -> None:
        """Records what a save is about to make (or None once done) in the lock file, in place."""
        self._pending = pending
        self._write_lock_record()

    def check_unchanged(self) -> None:
        """Fails if the folder's path now leads elsewhere (or nowhere)."""
        try:
            now = _identity(os.stat(self.directory) if not self.private else os.lstat(self.directory))
        except FileNotFoundError:
            now = None
        if now != self._identity:
            found = "nothing" if now is None else f"another folder (device {now[0]}, inode {now[1]})"
            raise CheckpointDirChangedError(
                f"Checkpoint folder {self.directory} was replaced while run {self.run!r} held it: it now leads to "
                f"{found}; expected device {self._identity[0]}, inode {self._identity[1]}. Not saving; "
                f"training goes on. Give the run its folder back, or stop it and start again."
            )

    def _recover(self) -> None:
        """Removes what a killed save left, as its intent record says."""
        pending = self._pending
        if pending is None:
            return
        # Only what this tool writes: its checkpoint files and its staging folders.
        staging, model_file = pending.get("staging"), pending.get("file")
        ours = isinstance(model_file, str) and not model_file.endswith(".json") and OUR_NAME.match(model_file)
        if ours and not self._is_committed(model_file):
            self.remove_if_same(model_file, pending.get("inode"), pending.get("size"))
        if isinstance(staging, str) and _STAGING_NAME.match(staging):
            self.remove_staging(staging)
        self.record_intent(None)
        self.phase("recovered")

    def _is_committed(self, model_file: str) -> bool:
        try:
            info = read_sidecar(self._dir_fd, sidecar_of(model_file))
        except MalformedSidecarError:
            return False
        return info["file"] == model_file

    def remove_if_same(self, name: str, inode: Any, size: Any) -> None:
        """Removes the model part `name` (a file, or a folder and what it
        holds) if it is the one a killed save staged (same inode and size)."""
        try:
            st = os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)) and st.st_ino == inode \
                and part_size(self._dir_fd, name, st) == size:
            remove_part(self._dir_fd, name)

    def remove_staging(self, name: str) -> None:
        """Removes a staging folder of ours and what it holds (symlinks in it
        are removed, never followed)."""
        try:
            st = os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            return  # a symlink or a file: not what we made
        try:
            remove_part(self._dir_fd, name)
        except OSError as error:
            logger.warning("Left staging folder %s: %s", self.directory / name, error.strerror)

    @property
    def on_phase(self) -> Callable[[str], None] | None:
        """The hook told each phase as it completes (tests, tracing), or None."""
        return self._on_phase

    @on_phase.setter
    def on_phase(self, hook: Callable[[str], None] | None) -> None:
        self._on_phase = hook
        #: Tells `on_phase`, if any, that a phase has just completed: ``phase(name)``.
        self.phase: Callable[[str], None] = hook if hook is not None else _NO_HOOK


_NO_HOOK: Callable[[str], None] = lambda _name: None  # what `CheckpointFolder.phase` calls without a hook


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _still_linked(lock: os.stat_result, dir_fd: int) -> bool:
    """True if the lock file opened (`lock`) is still the folder's, and the folder was not removed."""
    try:
        return _identity(lock) == _identity(os.stat(LOCK_FILE, dir_fd=dir_fd, follow_symlinks=False)) \
            and os.fstat(dir_fd).st_nlink > 0
    except FileNotFoundError:
        return False


def _write_record(fd: int, record: Mapping[str, Any]) -> None:
    """Writes a lock record: one page, in one pwrite, so whole or not at all."""
    data = json.dumps(record, sort_keys=True, allow_nan=False).encode("utf-8")
    if len(data) >= _LOCK_RECORD_BYTES:
        raise ValueError(f"A lock record of {len(data)} bytes; expected under {_LOCK_RECORD_BYTES}.")
    os.pwrite(fd, data.ljust(_LOCK_RECORD_BYTES - 1) + b"\n", 0)


def _read_record(fd: int) -> dict:
    """The lock file's record, or {} if it holds none of ours."""
    try:
        record = json.loads(os.pread(fd, _LOCK_RECORD_BYTES, 0).decode("utf-8") or "{}")
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) and record.get("tool") == TOOL else {}


# What the folder holds -------------------------------------------------------------------------------


@dataclasses.dataclass
class Scan:
    """What one pass over the folder found.

    Attributes:
        checkpoints: Complete checkpoints of any run of this tool, oldest first.
        broken: ``(sidecar name, fields, why)`` of this tool's sidecars whose
            model file is missing or not the size they say.
        rejected: ``(name, why)`` of files named like our sidecars but refused.
        top_sequence: The largest number in use, by a sidecar or a name.
    """

    checkpoints: list[Checkpoint]
    broken: list[tuple[str, dict, str]]
    rejected: list[tuple[str, str]]
    top_sequence: int

    def of_run(self, run: str) -> list[Checkpoint]:
        """The complete checkpoints of run `run`, oldest first."""
        return [checkpoint for checkpoint in self.checkpoints if checkpoint.run == run]


def scan(directory: Path, dir_fd: int | None) -> Scan:
    """Reads every sidecar-like file of the folder (through `dir_fd` when
    given), never raising for one; an unreadable folder scans as empty."""
    opened = None
    if dir_fd is None:
        try:
            dir_fd = opened = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return Scan([], [], [], 0)
    try:
        return _scan_fd(directory, dir_fd)
    finally:
        if opened is not None:
            os.close(opened)


def _scan_fd(directory: Path, fd: int) -> Scan:
    found = Scan([], [], [], 0)
    for name in os.listdir(fd):
        numbered = OUR_NAME.match(name)
        if numbered:
            found.top_sequence = max(found.top_sequence, int(numbered["seq"]))
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            info = read_sidecar(fd, name)
        except MalformedSidecarError as error:
            if numbered:
                found.rejected.append((name, str(error)))
            continue
        found.top_sequence = max(found.top_sequence, info["sequence"])
        why = _model_file_problem(fd, info)
        if why:
            found.broken.append((name, info, why))
        else:
            found.checkpoints.append(Checkpoint(path=directory / info["file"], info=info))
    found.checkpoints.sort(key=lambda checkpoint: (checkpoint.sequence, checkpoint.path.name))
    return found


def _model_file_problem(dir_fd: int, info: Mapping[str, Any]) -> str | None:
    """Why the model file a sidecar names is not the one it describes, or None."""
    try:
        st = os.stat(info["file"], dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return f"its model file {info['file']} is missing"
    except OSError as error:
        return f"its model file {info['file']} cannot be read ({error.strerror})"
    folder = is_folder_part(info["file"])
    if not (stat.S_ISDIR(st.st_mode) if folder else stat.S_ISREG(st.st_mode)):
        return f"its model file {info['file']} is {describe_kind(st)}, not a {'folder' if folder else 'regular file'}"
    size = part_size(dir_fd, info["file"], st)
    if size != info["size"]:
        return f"its model file {info['file']} has {size} bytes; the sidecar says {info['size']}"
    return None
