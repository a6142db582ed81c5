"""Checkpoints that are never half-written, and restoring from them.

A checkpoint is a ``.keras`` file (architecture, weights and optimizer state;
`keras.models.load_model` opens it in any process) plus a small JSON sidecar
saying where training was: epoch, global step, step in the epoch, the last
metrics, why it was taken and when, and whose it is.

Whose: the folder may hold other files too (``ModelCheckpoint`` output, a
``ckpt-best.keras`` copied in by hand, other runs' checkpoints). The store
recognises its own checkpoints by their sidecar, never by a file name: the
sidecar carries the tool's marker, its format, the run's name, the run
instance's ``run_id``, the model file's name and its size (`read_sidecar`
checks all of it, strictly). A run lists, prunes and resumes from the
checkpoints of its own name only; nothing else in the folder is ever
removed or renamed.

Writing: both files are written inside a hidden ``.partial-RUNID-SEQ`` folder
and renamed into place: first the model, then the sidecar. The sidecar is
the commit mark: a ``.keras`` file without its sidecar is not a checkpoint.
So a process killed at any moment leaves the previous checkpoint whole, and
nothing half-written is ever listed. Before it stages anything, a save
records its intent (the staging folder's and the model file's names, then
the staged file's inode and size) in the folder's lock file; a later run
uses that record, and only that, to remove what a killed save left.

Flushing to disk (fsync) guards against a machine crash or power cut, not
against a killed process, and it holds the training thread for as long as
the disk needs to write the whole file. So a checkpoint taken while training
goes on (reason ``save``) is not flushed when it is written: the kernel
writes it back on its own (within about 30 s on Linux). A save that is
going to remove the oldest checkpoint (beyond `keep`, sidecar first) first
flushes the newest one, written a save earlier and by then usually on disk
already, so that is cheap; with ``keep=1``, the new one is flushed before the
old one goes. A checkpoint that ends a run (reason ``stop`` or
``interrupt``) is flushed at once. The sidecar records the model file's
size, so a file that a crash left short or empty is not listed. Together: a
power cut may lose the ``save`` checkpoints of the last half minute, never
an older one nor the one a run ended with, and never leaves a broken one
listed.

The folder lock: a live run holds its folder with an OS lock (`fcntl.flock`
on ``.traincontrol.lock``, which names the holder), released by the kernel
when the process dies. A second store on the same folder, in this process
or another, fails with `CheckpointDirBusyError`. While it holds the folder,
the store works through a descriptor of it opened once, and a save fails
clearly if the path now leads to another folder.

Example:

>>> store = CheckpointStore("checkpoints/run-1", keep=3, run="run-1")   # doctest: +SKIP
>>> with store:                                                          # doctest: +SKIP
...     store.save(model, TrainingPosition(epoch=2, step_in_epoch=10), reason="save")
>>> store.latest().path                                                  # doctest: +SKIP
PosixPath('checkpoints/run-1/ckpt-000001-epoch0003-step000010.keras')
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import fcntl
import json
import logging
import math
import os
import re
import stat
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

from .private_fs import UnsafePathError, ensure_private_dir, json_safe, make_private_dirs

__all__ = [
    "Checkpoint",
    "CheckpointDirBusyError",
    "CheckpointDirChangedError",
    "CheckpointDirError",
    "CheckpointError",
    "CheckpointStore",
    "LOCK_FILE",
    "MalformedSidecarError",
    "Restored",
    "SIDECAR_FORMAT",
    "SkippedCheckpoint",
    "TrainingPosition",
    "parse_sidecar",
    "read_sidecar",
    "restore_weights",
]

logger = logging.getLogger("jupyter_traincontrol")

SIDECAR_FORMAT = 2
#: The tool's marker in every sidecar and lock record it writes.
TOOL = "jupyter-traincontrol"
#: The lock file of a checkpoint folder (never removed: see `CheckpointStore.release`).
LOCK_FILE = ".traincontrol.lock"
#: The run name of a store given none.
DEFAULT_RUN = "run"
_STAGING_PREFIX = ".partial-"
_STAGED_MODEL = "model.keras"
_STAGED_SIDECAR = "info.json"
_LOCK_RECORD_BYTES = 4096  # one page: a record is written with one pwrite, whole or not at all
_SIDECAR_MAX_BYTES = 64 * 1024
_MAX_COUNT = 2**53  # epochs, steps, sequences: exact in any JSON reader
_MAX_SIZE = 2**62
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
#: Names the store writes, used only to avoid reusing a number and to say
#: which broken sidecar a resume skipped; never to decide what is ours.
_OUR_NAME = re.compile(r"^ckpt-(?P<seq>\d{6,})-epoch\d+-step\d+\.(?:keras|json)$")
#: Reasons of checkpoints that end a run: flushed to disk before `save` returns.
_FLUSH_AT_ONCE = frozenset({"stop", "interrupt"})


class CheckpointError(OSError):
    """A checkpoint could not be written or read."""


class CheckpointDirError(CheckpointError):
    """The checkpoint folder cannot be used: a file, a dangling symlink,
    unwritable, or unsafe."""


class CheckpointDirBusyError(CheckpointDirError):
    """Another live run holds the checkpoint folder."""


class CheckpointDirChangedError(CheckpointDirError):
    """The checkpoint folder was replaced or removed under a live run."""


class MalformedSidecarError(CheckpointError):
    """A file is not a sidecar of this tool: not JSON, or a field is wrong."""


@dataclasses.dataclass(frozen=True)
class TrainingPosition:
    """Where training stands, in Keras's terms.

    Attributes:
        epoch: Zero-based index of the epoch in progress (as `initial_epoch`).
        step_in_epoch: Batches of that epoch already trained.
        steps_per_epoch: Batches in an epoch, or None while unknown.
        global_step: Optimizer steps taken in all (`optimizer.iterations`).
        epoch_complete: True once every batch of `epoch` is trained.
    """

    epoch: int
    step_in_epoch: int
    steps_per_epoch: int | None = None
    global_step: int = 0
    epoch_complete: bool = False

    @property
    def resume_epoch(self) -> int:
        """The epoch a resumed `fit` continues in."""
        return self.epoch + 1 if self.epoch_complete else self.epoch

    @property
    def resume_step(self) -> int:
        """Batches of `resume_epoch` already trained."""
        return 0 if self.epoch_complete else self.step_in_epoch


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk.

    Attributes:
        path: The ``.keras`` file.
        info: The sidecar's content, as checked by `parse_sidecar`.
    """

    path: Path
    info: Mapping[str, Any]

    @property
    def sidecar(self) -> Path:
        """The JSON sidecar next to `path`."""
        return self.path.with_suffix(".json")

    @property
    def sequence(self) -> int:
        """Position in the folder's order: larger is newer."""
        return int(self.info["sequence"])

    @property
    def run(self) -> str:
        """The name of the run that wrote it."""
        return self.info["run"] if self.info.get("run") is not None else DEFAULT_RUN

    @property
    def position(self) -> TrainingPosition:
        """Where training stood when the checkpoint was taken."""
        return TrainingPosition(
            epoch=int(self.info["epoch"]),
            step_in_epoch=int(self.info["step_in_epoch"]),
            steps_per_epoch=self.info.get("steps_per_epoch"),
            global_step=int(self.info.get("global_step") or 0),
            epoch_complete=bool(self.info["epoch_complete"]),
        )


@dataclasses.dataclass(frozen=True)
class SkippedCheckpoint:
    """A checkpoint that a resume passed over, and why."""

    path: Path
    reason: str


@dataclasses.dataclass(frozen=True)
class Restored:
    """What `CheckpointStore.restore_latest` did.

    Attributes:
        checkpoint: The checkpoint now loaded in the model, or None (then the
            model is as it was).
        skipped: Newer checkpoints that could not be used, newest first.
    """

    checkpoint: Checkpoint | None
    skipped: list[SkippedCheckpoint]


# The sidecar reader -----------------------------------------------------------


def _whole(low: int, high: int):
    def check(value):
        if type(value) is not int or not low <= value <= high:
            raise ValueError(f"{_shown(value)}; expected a whole number from {low} to {high}")
        return value

    return check


def _optional(check):
    return lambda value: None if value is None else check(value)


def _boolean(value):
    if type(value) is not bool:
        raise ValueError(f"{_shown(value)}; expected true or false")
    return value


def _text(longest: int):
    def check(value):
        if not isinstance(value, str) or not 0 < len(value) <= longest or not value.isprintable():
            raise ValueError(f"{_shown(value)}; expected printable text of 1 to {longest} characters")
        return value

    return check


def _exactly(expected):
    def check(value):
        if value != expected or type(value) is not type(expected):
            raise ValueError(f"{_shown(value)}; expected {expected!r}")
        return value

    return check


def _run_id(value):
    if not isinstance(value, str) or not _RUN_ID.match(value):
        raise ValueError(f"{_shown(value)}; expected 32 lowercase hex digits")
    return value


def _model_file(value):
    if not isinstance(value, str) or not value.endswith(".keras") or len(value) > 255:
        raise ValueError(f"{_shown(value)}; expected a .keras file name")
    if "/" in value or "\\" in value or "\0" in value or value.startswith("."):
        raise ValueError(f"{_shown(value)}; expected a plain file name, without a folder")
    return value


def _metrics(value):
    if not isinstance(value, dict) or len(value) > 1000:
        raise ValueError(f"{_shown(value)}; expected an object of at most 1000 metrics")
    plain = {}
    for key, number in value.items():
        if number is None or (isinstance(number, float) and not math.isfinite(number)):
            plain[key] = None  # NaN written by format 1, or a hand edit
        elif type(number) in (int, float) and abs(number) < 1e300:
            plain[key] = float(number)
        else:
            raise ValueError(f"metric {key[:40]!r} is {_shown(number)}; expected a number or null")
    return plain


def _tunables(value):
    if not isinstance(value, dict) or len(value) > 100:
        raise ValueError(f"{_shown(value)}; expected an object of at most 100 names")
    for key, number in value.items():
        if len(key) > 64 or type(number) not in (int, float) or not math.isfinite(number):
            raise ValueError(f"{key[:40]!r}: {_shown(number)}; expected a finite number")
    return {key: float(number) for key, number in value.items()}


_RUN_NAME = _text(255)
_FIELDS = {
    "sequence": _whole(1, _MAX_COUNT),
    "file": _model_file,
    "size": _whole(1, _MAX_SIZE),
    "epoch": _whole(0, _MAX_COUNT),
    "step_in_epoch": _whole(0, _MAX_COUNT),
    "steps_per_epoch": _optional(_whole(1, _MAX_COUNT)),
    "epoch_complete": _boolean,
    "global_step": _optional(_whole(0, _MAX_COUNT)),
    "resume_epoch": _whole(0, _MAX_COUNT),
    "resume_step": _whole(0, _MAX_COUNT),
    "metrics": _metrics,
    "reason": _text(64),
    "time": _text(64),
}
_FIELDS_BY_FORMAT = {
    1: {**_FIELDS, "format": _exactly(1), "run": _optional(_RUN_NAME)},
    2: {**_FIELDS, "format": _exactly(2), "tool": _exactly(TOOL), "run": _RUN_NAME, "run_id": _run_id},
}


def parse_sidecar(data: bytes, name: str) -> dict[str, Any]:
    """Checks the bytes of a sidecar named `name`; returns its fields.

    A sidecar of this tool is a JSON object with the tool's marker, its
    format (1, written by the previous release, or 2), the run's name and
    ``run_id`` (format 2), the model file's name (the sidecar's own name with
    ``.keras``) and size, and where training stood. Every field must have
    its type and a sane range; fields not known here are dropped.

    Args:
        data: The file's content.
        name: The sidecar's file name (the model file's name must match it).

    Returns:
        The checked fields. Non-finite metrics are None.

    Raises:
        MalformedSidecarError: Saying what was found and what was expected.
            Nothing else, whatever `data` holds.
    """
    if len(data) > _SIDECAR_MAX_BYTES:
        raise MalformedSidecarError(f"{name}: {len(data)} bytes; expected a sidecar of at most {_SIDECAR_MAX_BYTES}.")
    try:
        info = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise MalformedSidecarError(f"{name}: not JSON ({type(error).__name__}); expected a JSON object.") from None
    if not isinstance(info, dict):
        raise MalformedSidecarError(f"{name}: a JSON {type(info).__name__}; expected a JSON object.")
    fields = _FIELDS_BY_FORMAT.get(info.get("format")) if type(info.get("format")) is int else None
    if fields is None:
        raise MalformedSidecarError(f"{name}: format {_shown(info.get('format'))}; expected 1 or 2.")
    checked = {}
    for field, check in fields.items():
        if field not in info:
            raise MalformedSidecarError(f"{name}: no {field!r}; expected every field of format {info['format']}.")
        try:
            checked[field] = check(info[field])
        except ValueError as error:
            raise MalformedSidecarError(f"{name}: {field!r} is {error}.") from None
    if "tunables" in info:  # optional: only sidecars of runs that were steered have it
        try:
            checked["tunables"] = _tunables(info["tunables"])
        except ValueError as error:
            raise MalformedSidecarError(f"{name}: 'tunables' is {error}.") from None
    expected_file = name[: -len(".json")] + ".keras" if name.endswith(".json") else None
    if checked["file"] != expected_file:
        raise MalformedSidecarError(f"{name}: 'file' is {checked['file']!r}; expected {expected_file!r}.")
    return checked


def read_sidecar(directory: Path | int, name: str) -> dict[str, Any]:
    """Reads and checks sidecar `name` of a folder (a path or a descriptor).

    Never follows a symlink, never blocks on a FIFO, reads at most
    `_SIDECAR_MAX_BYTES` + 1 bytes.

    Raises:
        MalformedSidecarError: If it is not a regular file, cannot be read,
            or `parse_sidecar` refuses it.
    """
    dir_fd = directory if isinstance(directory, int) else None
    path = name if dir_fd is not None else os.path.join(directory, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as error:
        raise MalformedSidecarError(f"{name}: cannot be opened ({error.strerror}); expected a readable file.") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise MalformedSidecarError(f"{name}: not a regular file; expected a sidecar file.")
        data = os.read(fd, _SIDECAR_MAX_BYTES + 1)
    except OSError as error:
        raise MalformedSidecarError(f"{name}: cannot be read ({error.strerror}).") from None
    finally:
        os.close(fd)
    return parse_sidecar(data, name)


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


# The store ------------------------------------------------------------------


@dataclasses.dataclass
class _Scan:
    """What one pass over the folder found."""

    checkpoints: list[Checkpoint]  # complete checkpoints of any run of this tool
    broken: list[tuple[str, dict, str]]  # (sidecar name, fields, why) of this tool, model file wrong
    rejected: list[tuple[str, str]]  # (name, why) of files named like sidecars but refused
    top_sequence: int  # the largest number in use, by a sidecar or a name


class CheckpointStore:
    """The checkpoints of one run, in one folder.

    Args:
        directory: Folder of the checkpoints; created (mode 0700, and any
            missing parent too) when the store first takes it.
        keep: How many of the run's newest checkpoints to keep. Defaults to 3.
        run: The run's name: the store lists, prunes and resumes from the
            checkpoints of this name only. Defaults to ``"run"``.
        private: True for a folder the tool chose (``checkpoints/NAME``):
            it and its parent are then created private or must be real,
            private folders of the current user (a planted symlink or another
            user's folder is refused). Defaults to False: a folder the user
            gave is used as it is.
        on_phase: Called with the name of each phase a save (or taking the
            folder) has just completed, in order: ``locked``, ``recovered``,
            ``previous-flushed``, ``intent-recorded``, ``staging-created``,
            ``staged-model``, ``staged-sidecar``, ``model-renamed``,
            ``sidecar-committed``, ``staging-removed``, ``intent-cleared``,
            ``flushed``, ``uncommitted``, ``pruned`` (some only when they
            happen). For tests and tracing; an exception it raises fails the
            save like any other.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        keep: int = 3,
        *,
        run: str | None = None,
        private: bool = False,
        on_phase: Callable[[str], None] | None = None,
    ):
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"keep must be a whole number of at least 1, got {keep!r}.")
        if run is not None:
            try:
                _RUN_NAME(run)
            except ValueError as error:
                raise ValueError(f"run is {error}.") from None
        self.directory = Path(directory).absolute()
        self.keep = keep
        self.run = DEFAULT_RUN if run is None else run
        self.run_id = uuid.uuid4().hex
        self.private = bool(private)
        self._on_phase = on_phase
        self._flushed: set[int] = set()  # sequences this store flushed to disk
        self._dir_fd: int | None = None
        self._lock_fd: int | None = None
        self._identity: tuple[int, int] | None = None
        self._pending: dict[str, Any] | None = None
        #: The values steered so far (``set``, the NaN policy): written in
        #: each sidecar as ``tunables`` while not empty; a resume sets them again.
        self.tunables: dict[str, float] = {}

    # Holding the folder -------------------------------------------------------

    @property
    def held(self) -> bool:
        """True between `acquire` and `release`."""
        return self._lock_fd is not None

    def acquire(self) -> "CheckpointStore":
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
        dir_fd = self._open_folder()
        try:
            lock_fd, previous = self._lock(dir_fd)
        except BaseException:
            os.close(dir_fd)
            raise
        self._dir_fd, self._lock_fd = dir_fd, lock_fd
        self._identity = _identity(os.fstat(dir_fd))
        pending = previous.get("pending")
        self._pending = pending if isinstance(pending, dict) else None  # kept until recovered
        try:
            self._write_lock_record()
            self._phase("locked")
            self._recover()
        except OSError as error:
            self.release()
            raise CheckpointDirError(f"Could not take checkpoint folder {self.directory}: {error.strerror or error}.") from error
        return self

    def release(self) -> None:
        """Lets the folder go (the lock file stays, marked free). Idempotent."""
        lock_fd, dir_fd = self._lock_fd, self._dir_fd
        self._lock_fd = self._dir_fd = self._identity = None
        if lock_fd is None:
            return
        try:
            _write_record(lock_fd, {"tool": TOOL, "holder": None})
        except OSError as error:
            logger.warning("Could not mark %s free: %s", self.directory / LOCK_FILE, error)
        finally:
            os.close(lock_fd)  # drops the flock
            os.close(dir_fd)

    def __enter__(self) -> "CheckpointStore":
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()

    def _open_folder(self) -> int:
        """Creates or checks the folder; returns a descriptor of it."""
        path = self.directory
        try:
            if self.private:
                ensure_private_dir(path.parent)
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
                make_private_dirs(path)
            st = os.stat(path)
            if not stat.S_ISDIR(st.st_mode):
                raise CheckpointDirError(
                    f"Checkpoint folder {path} is {_kind(st)}; expected a folder (created if missing)."
                )
            if not os.access(path, os.W_OK | os.X_OK):
                raise CheckpointDirError(f"Checkpoint folder {path} is not writable by this user; expected a folder it can write.")
            return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except UnsafePathError as error:
            raise CheckpointDirError(f"Checkpoint folder {path} is unsafe: {error}") from error
        except CheckpointDirError:
            raise
        except OSError as error:
            raise CheckpointDirError(f"Could not use checkpoint folder {path}: {error.strerror or error}.") from error

    def _lock(self, dir_fd: int) -> tuple[int, dict]:
        """Opens and flocks the lock file; returns it and its previous record."""
        lock_path = self.directory / LOCK_FILE
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as error:
            if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise CheckpointDirError(
                    f"Checkpoint folder {self.directory} is not writable: {error.strerror}; expected a folder this user can write."
                ) from error
            raise CheckpointDirError(f"Could not open {lock_path}: {error.strerror}; expected a regular file of ours.") from error
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CheckpointDirError(f"{lock_path} is not a regular file; expected the folder's lock file.")
            if _identity(os.fstat(fd)) != _identity(os.stat(LOCK_FILE, dir_fd=dir_fd, follow_symlinks=False)):
                raise CheckpointDirChangedError(f"{self.directory} was replaced while being opened; expected one folder.")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_record(fd).get("holder") or {}
                raise CheckpointDirBusyError(
                    f"Checkpoint folder {self.directory} is in use by run {holder.get('run', '?')!r} "
                    f"(pid {holder.get('pid', '?')}); expected a folder no live run holds. Give this run its own "
                    f"checkpoint_dir, or end that run first."
                ) from None
            return fd, _read_record(fd)
        except BaseException:
            os.close(fd)
            raise

    def _write_lock_record(self) -> None:
        holder = {"run": self.run, "run_id": self.run_id, "pid": os.getpid(), "since": time.time()}
        _write_record(self._lock_fd, {"tool": TOOL, "holder": holder, "pending": self._pending})

    def _record_intent(self, pending: dict[str, Any] | None) -> None:
        self._pending = pending
        self._write_lock_record()

    def _check_folder(self) -> None:
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
        staging, model_file = pending.get("staging"), pending.get("file")
        if isinstance(model_file, str) and _is_plain_name(model_file) and not self._is_committed(model_file):
            self._remove_if_same(model_file, pending.get("inode"), pending.get("size"))
        if isinstance(staging, str) and _is_plain_name(staging) and staging.startswith(_STAGING_PREFIX):
            self._remove_staging(staging)
        self._record_intent(None)
        self._phase("recovered")

    def _is_committed(self, model_file: str) -> bool:
        try:
            info = read_sidecar(self._dir_fd, model_file[: -len(".keras")] + ".json")
        except MalformedSidecarError:
            return False
        return info["file"] == model_file

    def _remove_if_same(self, name: str, inode: Any, size: Any) -> None:
        """Removes file `name` if it is the one a killed save staged (same inode and size)."""
        try:
            st = os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISREG(st.st_mode) and (st.st_ino, st.st_size) == (inode, size):
            os.unlink(name, dir_fd=self._dir_fd)

    def _remove_staging(self, name: str) -> None:
        """Removes a staging folder of ours: its files, then itself."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._dir_fd)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as error:
            if error.errno == errno.ELOOP:
                return  # a symlink: not what we made
            raise
        try:
            for entry in os.listdir(fd):
                if stat.S_ISREG(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode):
                    os.unlink(entry, dir_fd=fd)
        finally:
            os.close(fd)
        try:
            os.rmdir(name, dir_fd=self._dir_fd)
        except OSError as error:
            logger.warning("Left staging folder %s: %s", self.directory / name, error.strerror)

    # Listing ----------------------------------------------------------------

    def list(self) -> list[Checkpoint]:
        """Returns this run's complete checkpoints, oldest first."""
        return [c for c in self._scan().checkpoints if c.run == self.run]

    def latest(self) -> Checkpoint | None:
        """Returns this run's newest complete checkpoint, or None."""
        checkpoints = self.list()
        return checkpoints[-1] if checkpoints else None

    def _scan(self) -> _Scan:
        """Reads every sidecar-like file of the folder, never raising for one."""
        fd = self._dir_fd
        opened = None
        if fd is None:
            try:
                fd = opened = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                return _Scan([], [], [], 0)
        try:
            return self._scan_fd(fd)
        finally:
            if opened is not None:
                os.close(opened)

    def _scan_fd(self, fd: int) -> _Scan:
        scan = _Scan([], [], [], 0)
        for name in os.listdir(fd):
            numbered = _OUR_NAME.match(name)
            if numbered:
                scan.top_sequence = max(scan.top_sequence, int(numbered["seq"]))
            if not name.endswith(".json") or name.startswith("."):
                continue
            try:
                info = read_sidecar(fd, name)
            except MalformedSidecarError as error:
                if numbered:
                    scan.rejected.append((name, str(error)))
                continue
            scan.top_sequence = max(scan.top_sequence, info["sequence"])
            why = _model_file_problem(fd, info)
            if why:
                scan.broken.append((name, info, why))
            else:
                scan.checkpoints.append(Checkpoint(path=self.directory / info["file"], info=info))
        scan.checkpoints.sort(key=lambda checkpoint: (checkpoint.sequence, checkpoint.path.name))
        return scan

    # Saving -----------------------------------------------------------------

    def save(
        self,
        model,
        position: TrainingPosition,
        *,
        reason: str,
        metrics: Mapping[str, Any] | None = None,
        run: str | None = None,
    ) -> Checkpoint:
        """Writes a checkpoint atomically and prunes this run's old ones.

        When this returns, the checkpoint is complete and listed; it is on
        disk for good (flushed) at once if `reason` ends the run (``stop``,
        ``interrupt``), otherwise once the kernel has written it back or the
        next save flushes it (see the module's docstring). A store that does
        not hold its folder takes it for the save and lets it go after.

        Args:
            model: The Keras model (optimizer state is included).
            position: Where training stands.
            reason: Why: ``"save"``, ``"stop"``, ``"interrupt"``, ...
            metrics: The latest metrics, stored in the sidecar (non-finite
                values as null).
            run: The run's name; if given, it must be the store's `run`.

        Returns:
            The new checkpoint.

        Raises:
            CheckpointError: If writing failed (a full disk, say). The
                previous checkpoints are untouched and nothing partial stays.
                Also if the checkpoint was written but flushing or removing
                older ones failed; the message says which.
            CheckpointDirError: If the folder cannot be taken, or was
                replaced under the run (`CheckpointDirChangedError`).
            ValueError: If `run` is not the store's run.
        """
        if run is not None and run != self.run:
            raise ValueError(f"save(run={run!r}) on the store of run {self.run!r}; expected {self.run!r} or None.")
        if self.held:
            return self._save(model, position, reason, metrics)
        with self:
            return self._save(model, position, reason, metrics)

    def _save(self, model, position: TrainingPosition, reason: str, metrics) -> Checkpoint:
        self._check_folder()
        try:
            scan = self._scan_fd(self._dir_fd)
            previous = [c for c in scan.checkpoints if c.run == self.run]
            self._flush_previous(previous)
            sequence, stem = self._free_name(scan.top_sequence, position)
            info = self._sidecar(sequence, f"{stem}.keras", position, reason, metrics)
            self._write_staged(model, info)
        except CheckpointDirError:
            raise
        except OSError as error:
            newest = self.latest()
            kept = f"the previous checkpoint {newest.path.name} is kept" if newest else "there is no earlier checkpoint"
            raise CheckpointError(
                f"Could not write a checkpoint in {self.directory}: {error.strerror or error}; {kept}."
            ) from error
        checkpoint = Checkpoint(path=self.directory / info["file"], info=info)
        try:
            if reason in _FLUSH_AT_ONCE:
                self._flush(checkpoint)
                self._phase("flushed")
            self._prune([*previous, checkpoint], scan.broken)
            self._phase("pruned")
        except OSError as error:
            raise CheckpointError(
                f"Wrote {checkpoint.path.name}, but could not flush or remove older checkpoints in "
                f"{self.directory}: {error.strerror or error}; older checkpoints may remain."
            ) from error
        return checkpoint

    def _free_name(self, top_sequence: int, position: TrainingPosition) -> tuple[int, str]:
        """The next sequence number and a stem whose two names are both free.

        File names count epochs from 1, as the UI does.
        """
        sequence = top_sequence
        while True:
            sequence += 1
            stem = f"ckpt-{sequence:06d}-epoch{position.epoch + 1:04d}-step{position.step_in_epoch:06d}"
            if not any(_lexists(self._dir_fd, stem + suffix) for suffix in (".keras", ".json")):
                return sequence, stem

    def _sidecar(self, sequence: int, file: str, position: TrainingPosition, reason: str, metrics) -> dict[str, Any]:
        return json_safe({
            "tool": TOOL,
            "format": SIDECAR_FORMAT,
            "run": self.run,
            "run_id": self.run_id,
            "sequence": sequence,
            "file": file,
            "size": 0,  # set once the model is written
            "epoch": position.epoch,
            "step_in_epoch": position.step_in_epoch,
            "steps_per_epoch": position.steps_per_epoch,
            "epoch_complete": position.epoch_complete,
            "global_step": position.global_step,
            "resume_epoch": position.resume_epoch,
            "resume_step": position.resume_step,
            "metrics": _plain_metrics(metrics or {}),
            "reason": reason,
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **({"tunables": dict(self.tunables)} if self.tunables else {}),
        })

    def _write_staged(self, model, info: dict[str, Any]) -> None:
        """Stages the model and sidecar, then renames them into place.

        On failure, removes whatever it made (the renamed model file too)
        and re-raises.
        """
        fd, file = self._dir_fd, info["file"]
        sidecar = file[: -len(".keras")] + ".json"
        staging = f"{_STAGING_PREFIX}{self.run_id}-{info['sequence']}"
        intent = {"staging": staging, "file": file}
        self._record_intent(intent)
        self._phase("intent-recorded")
        renamed = False
        try:
            os.mkdir(staging, 0o700, dir_fd=fd)
            self._phase("staging-created")
            model.save(self.directory / staging / _STAGED_MODEL)
            st = os.stat(f"{staging}/{_STAGED_MODEL}", dir_fd=fd, follow_symlinks=False)
            info["size"] = st.st_size
            self._record_intent({**intent, "inode": st.st_ino, "size": st.st_size})
            self._phase("staged-model")
            _write_new_file(self.directory / staging / _STAGED_SIDECAR, _json_text(info))
            self._phase("staged-sidecar")
            os.rename(f"{staging}/{_STAGED_MODEL}", file, src_dir_fd=fd, dst_dir_fd=fd)
            renamed = True
            self._phase("model-renamed")
            os.rename(f"{staging}/{_STAGED_SIDECAR}", sidecar, src_dir_fd=fd, dst_dir_fd=fd)  # the commit
            self._phase("sidecar-committed")
        except BaseException:
            self._undo(staging, file if renamed else None)
            raise
        os.rmdir(staging, dir_fd=fd)
        self._phase("staging-removed")
        self._record_intent(None)
        self._phase("intent-cleared")

    def _undo(self, staging: str, renamed_model: str | None) -> None:
        """Cleans up after a failed save; reports (never raises) what it could not."""
        try:
            if renamed_model is not None:
                self._remove_if_same(renamed_model, self._pending.get("inode"), self._pending.get("size"))
            self._remove_staging(staging)
            self._record_intent(None)
        except OSError as error:
            logger.warning("A failed save left files in %s (the next run removes them): %s", self.directory, error)

    def _flush_previous(self, checkpoints: list[Checkpoint]) -> None:
        """Flushes the newest of `checkpoints` if this save is going to prune.

        Done first, before this save changes the folder: a checkpoint written
        a while ago is then usually on disk already, and on a journaling file
        system flushing it forces no journal commit (which, on a busy disk,
        can take seconds).
        """
        if self.keep > 1 and len(checkpoints) >= self.keep:
            self._flush(checkpoints[-1])
            self._phase("previous-flushed")

    def _prune(self, checkpoints: list[Checkpoint], broken: list[tuple[str, dict, str]]) -> None:
        """Removes all but the newest `keep` of this run's `checkpoints`, and
        this run's sidecars whose model file a crash left short or missing."""
        doomed = checkpoints[: max(0, len(checkpoints) - self.keep)]
        kept = checkpoints[len(doomed):]
        if doomed and not any(c.sequence in self._flushed for c in kept):
            # Never delete a checkpoint before a newer one is surely on disk
            # (with keep=1, that is the new one).
            self._flush(kept[-1])
        for old in doomed:
            self._remove_checkpoint(old.sidecar.name, old.path.name, shorter_than=None)
        for sidecar, info, _why in broken:
            if (info.get("run") or DEFAULT_RUN) == self.run:
                self._remove_checkpoint(sidecar, info["file"], shorter_than=info["size"])

    def _remove_checkpoint(self, sidecar: str, model_file: str, shorter_than: int | None) -> None:
        """Uncommits a checkpoint of this run (its sidecar goes first), then
        removes its model file.

        The model file's inode and size are recorded as intent first, so a
        kill between the two removals leaves a record the next run acts on.

        Args:
            sidecar: The sidecar's name.
            model_file: The model file's name.
            shorter_than: For a checkpoint a crash broke: remove the model
                file only if it is shorter than this (a crash leaves it
                short; a longer one is not what this run wrote). None: the
                model file is whole, remove it.
        """
        try:
            st = os.stat(model_file, dir_fd=self._dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        ours = st is not None and stat.S_ISREG(st.st_mode) and (shorter_than is None or st.st_size < shorter_than)
        if ours:
            self._record_intent({"file": model_file, "inode": st.st_ino, "size": st.st_size})
        os.unlink(sidecar, dir_fd=self._dir_fd)  # uncommit first
        self._phase("uncommitted")
        if ours:
            os.unlink(model_file, dir_fd=self._dir_fd)
            self._record_intent(None)

    def _flush(self, checkpoint: Checkpoint) -> None:
        """Makes `checkpoint` durable: its two files and their names in the folder."""
        if checkpoint.sequence in self._flushed:
            return
        _fsync_file(checkpoint.path)
        _fsync_file(checkpoint.sidecar)
        _fsync_dir(self.directory)
        self._flushed.add(checkpoint.sequence)

    def _phase(self, name: str) -> None:
        if self._on_phase is not None:
            self._on_phase(name)

    # Resuming ---------------------------------------------------------------

    def restore_latest(self, model, on_skip: Callable[[SkippedCheckpoint], None] | None = None) -> Restored:
        """Loads this run's newest checkpoint that loads into `model`.

        Newer ones that do not load (a corrupt ``.keras`` file, a model file
        left short, a sidecar that is not valid) are skipped and reported.
        If none loads, `model` keeps the weights it had.

        Args:
            model: A built, compiled Keras model of the run's architecture.
            on_skip: Called with each skipped checkpoint, newest first, as
                it is skipped.

        Returns:
            The checkpoint loaded (or None) and the ones skipped.
        """
        skipped: list[SkippedCheckpoint] = []

        def skip(path: Path, reason: str) -> None:
            skipped.append(SkippedCheckpoint(path, reason))
            if on_skip is not None:
                on_skip(skipped[-1])

        scan = self._scan()
        candidates = [c for c in scan.checkpoints if c.run == self.run]
        newest = candidates[-1].sequence if candidates else 0
        unusable = [(info["sequence"], self.directory / info["file"], f"{name}: {why}") for name, info, why in scan.broken
                    if (info.get("run") or DEFAULT_RUN) == self.run]
        unusable += [(int(_OUR_NAME.match(name)["seq"]), self.directory / name, why) for name, why in scan.rejected]
        for sequence, path, why in sorted(unusable, key=lambda item: -item[0]):
            if sequence > newest:  # newer than any complete one: what a resume would have wanted
                skip(path, why)
        saved = None
        for checkpoint in reversed(candidates):
            saved = saved or _variables_of(model)
            try:
                restore_weights(model, checkpoint)
            except CheckpointError as error:
                skip(checkpoint.path, str(error))
                _assign(saved)
                continue
            return Restored(checkpoint, skipped)
        return Restored(None, skipped)


def restore_weights(model, checkpoint: Checkpoint) -> None:
    """Loads a checkpoint's weights and optimizer state into `model`.

    The optimizer is built first: Keras silently drops optimizer state
    loaded into an optimizer that is not built yet.

    Args:
        model: A built, compiled Keras model of the same architecture.
        checkpoint: What to load.

    Raises:
        CheckpointError: If the file cannot be loaded into this model.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    try:
        model.load_weights(checkpoint.path)
    except Exception as error:  # Keras raises ValueError, OSError, zipfile errors, ...
        raise CheckpointError(
            f"Could not load {checkpoint.path} into model {model.name!r}: {error}"
        ) from error


# Helpers --------------------------------------------------------------------


def _variables_of(model) -> list[tuple[Any, Any]]:
    """Every variable of `model` and its optimizer, with a copy of its value."""
    import numpy as np

    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    variables = list(model.weights) + (list(optimizer.variables) if optimizer is not None else [])
    return [(variable, np.array(variable)) for variable in variables]


def _assign(saved: list[tuple[Any, Any]]) -> None:
    """Puts back the values `_variables_of` copied (after a failed load)."""
    for variable, value in saved:
        variable.assign(value)


def _plain_metrics(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    plain = {}
    for key, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue  # a non-scalar log entry: not a metric to record
        plain[str(key)] = number if math.isfinite(number) else None
    return plain


def _model_file_problem(dir_fd: int, info: Mapping[str, Any]) -> str | None:
    """Why the model file a sidecar names is not the one it describes, or None."""
    try:
        st = os.stat(info["file"], dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return f"its model file {info['file']} is missing"
    except OSError as error:
        return f"its model file {info['file']} cannot be read ({error.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return f"its model file {info['file']} is {_kind(st)}, not a regular file"
    if st.st_size != info["size"]:
        return f"its model file {info['file']} has {st.st_size} bytes; the sidecar says {info['size']}"
    return None


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _kind(st: os.stat_result) -> str:
    kinds = [(stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")]
    return next((text for test, text in kinds if test(st.st_mode)), f"mode {stat.filemode(st.st_mode)}")


def _is_plain_name(name: str) -> bool:
    return 0 < len(name) <= 255 and "/" not in name and "\0" not in name and name not in (".", "..")


def _lexists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _write_new_file(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


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


def _json_text(info: Mapping[str, Any]) -> str:
    return json.dumps(info, indent=1, sort_keys=True, allow_nan=False)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
