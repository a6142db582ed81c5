"""Where runs are listed: one private folder per run under the Jupyter runtime dir.

::

    $(jupyter --runtime-dir)/traincontrol/         0700
        run-1/                                     0700
            lock        held (flock) by the run's process for its lifetime
            run.json    the run's record (written atomically)
            control     its FIFO (while the run listens)

Any process of the same user reads the records: the CLI, the Jupyter server,
other kernels. A run is alive while its process holds its lock
(`run_locks`). A run folder appears whole, by renaming a prepared one into
place. A record stays, with its final state, while its process lives; the folders of dead runs are removed when runs are listed or
a new run claims the name. Names are unique among live runs; the name of an
ended run may be taken again.

This module knows nothing of Keras or IPython, so the CLI and the server
import it in milliseconds.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import re
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

from .commands import ACTIVE_STATES, FINAL_STATES, RunState, shorten
from .private_fs import check_private, ensure_private_dir, open_dir, read_json, write_json_atomic
from .run_locks import LOCK_NAME, ProcessLock, folder_is_live, move_away, remove_dead_locks, remove_if_dead
from .run_record import MAX_RECORD_BYTES, validate_record

__all__ = [
    "RECORD_NAME",
    "LOCK_NAME",
    "NameTakenError",
    "RunNotFoundError",
    "RunFolder",
    "registry_root",
    "list_runs",
    "find_run",
    "validate_name",
    "unique_name",
    "folder_is_live",
    "sweep_dead_runs",
    "read_tombstone",
]

logger = logging.getLogger("jupyter_traincontrol")

RECORD_NAME = "run.json"
_TOMBSTONES_FOLDER = ".ended"
#: How long the last record of a run whose process let it go is kept.
_TOMBSTONE_SECONDS = 300.0
_CLAIM_PREFIX = ".claim-"
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_CLAIM_ATTEMPTS = 5


class NameTakenError(ValueError):
    """Another live run already has this name."""


class RunNotFoundError(LookupError):
    """No listed run has this name."""


def registry_root() -> Path:
    """Returns the folder that lists runs (honours ``JUPYTER_RUNTIME_DIR``)."""
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / "traincontrol"


def validate_name(name: str) -> str:
    """Checks a run name: 1-64 letters, digits, ``.``, ``_`` or ``-``.

    Returns:
        `name`.

    Raises:
        ValueError: If `name` could not safely be a folder name.
    """
    if not isinstance(name, str) or not _NAME_PATTERN.match(name):
        raise ValueError(
            f"Invalid run name {name!r}. Expected 1-64 characters: letters, digits, "
            "'.', '_' or '-', starting with a letter or digit."
        )
    return name


def sweep_dead_runs(root: Path) -> None:
    """Removes the folders (FIFOs included) and lock files of dead processes,
    and tombstones older than a few minutes."""
    remove_dead_locks(root)
    for name in os.listdir(root):
        if name.startswith(_CLAIM_PREFIX):
            remove_if_dead(root / name)  # a claim its process never finished
    _remove_old_tombstones(root)
    for name in os.listdir(root):
        folder = root / name
        if name.startswith("."):
            continue
        try:
            check_private(folder, os.lstat(folder), kind="dir")
            if not folder_is_live(folder):
                remove_if_dead(folder)
        except OSError:
            continue  # not ours to remove (a planted symlink, someone else's), or gone


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
        self._write_lock = threading.RLock()  # re-entrant: defensive, a signal handler may land mid-write
        self.dir_fd = -1  # the folder, opened once: writes go through it, not through its path

    @property
    def record_path(self) -> Path:
        """The run's JSON record."""
        return self.path / RECORD_NAME

    @classmethod
    def claim(cls, name: str, root: Path | None = None) -> "RunFolder":
        """Creates the private folder of a new run named `name`, atomically:
        the folder appears with its lock and first record (state
        ``starting``), or not at all.

        Args:
            name: The run's name; see `validate_name`.
            root: The registry folder. Defaults to `registry_root()`.

        Returns:
            The claimed folder.

        Raises:
            NameTakenError: If a live run already has this name.
            UnsafePathError: If the registry or the run's folder is a
                symlink, someone else's, or not private.
        """
        validate_name(name)
        root = ensure_private_dir(Path(root) if root else registry_root())
        sweep_dead_runs(root)  # so `echo stop > FIFO` never waits on a dead run's FIFO
        folder = root / name
        run_folder = cls(name, folder, uuid.uuid4().hex)
        lock = ProcessLock.path_for(root)
        for _attempt in range(_CLAIM_ATTEMPTS):
            staging = Path(tempfile.mkdtemp(prefix=_CLAIM_PREFIX, dir=root))
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
            move_away(staging)
            check_private(folder, os.lstat(folder), kind="dir")
            _free_name(folder, name)
        else:
            raise NameTakenError(f"Could not claim the name {name!r}: other processes keep taking it.")
        run_folder.dir_fd = open_dir(folder)
        _claimed_in_this_process.add(run_folder)
        return run_folder

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
            if self.dir_fd >= 0:
                write_json_atomic(self.record_path, self._full_record(record), dir_fd=self.dir_fd)

    def seal(self) -> None:
        """Closes the folder's handle: the run has written its last record.
        Idempotent."""
        with self._write_lock:
            if self.dir_fd >= 0:
                os.close(self.dir_fd)
                self.dir_fd = -1

    def owns_folder(self) -> bool:
        """True while the folder on disk still belongs to this run."""
        record = read_json(self.record_path)
        return isinstance(record, dict) and record.get("run_id") == self.run_id

    def release(self) -> None:
        """Removes the run's folder if it is still this run's, keeping its
        last record a while as a tombstone (see `read_tombstone`). Idempotent."""
        _claimed_in_this_process.discard(self)
        self.seal()
        with self._write_lock:
            if self._released:
                return
            self._released = True
            if self.owns_folder():
                _keep_tombstone(self.path)
                move_away(self.path)


def _keep_tombstone(folder: Path) -> None:
    """Keeps the last record of a run whose process let it go (it ended and
    its process exits), so that a sender waiting for an acknowledgement
    still finds it: a script that applies ``stop`` and exits at once must not
    look like one that died first."""
    tombstones = folder.parent / _TOMBSTONES_FOLDER
    try:
        os.makedirs(tombstones, mode=0o700, exist_ok=True)
        check_private(tombstones, os.lstat(tombstones), kind="dir")
        os.replace(folder / RECORD_NAME, tombstones / f"{folder.name}.json")
    except OSError:
        pass  # no tombstone: a waiting sender then says the run is gone


def read_tombstone(name: str, root: Path | None = None) -> dict[str, Any] | None:
    """The last record of the ended run `name` whose process let it go
    within the last few minutes, validated; None if there is none."""
    root = Path(root) if root else registry_root()
    path = root / _TOMBSTONES_FOLDER / f"{name}.json"
    try:
        text = _read_record_text(path)
    except OSError:
        return None
    if text is None:
        return None
    record, _problem = validate_record(text, name)
    return record


def _remove_old_tombstones(root: Path) -> None:
    folder = root / _TOMBSTONES_FOLDER
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return
    for entry in entries:
        try:
            if time.time() - entry.stat(follow_symlinks=False).st_mtime > _TOMBSTONE_SECONDS:
                os.unlink(entry.path)
        except OSError:
            continue


def _free_name(folder: Path, name: str) -> None:
    """Frees the name held by `folder` if its run has ended or its process died.

    Raises:
        NameTakenError: If the run there is still active.
    """
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
    for claimed in list(_claimed_in_this_process):
        if claimed.path == folder and claimed.owns_folder():
            claimed.release()  # an ended run of this process: let go of it now
            return
    move_away(folder)  # an ended run of a live process: its record goes


_claimed_in_this_process: set[RunFolder] = set()


@atexit.register
def _release_all_at_exit() -> None:
    for run_folder in list(_claimed_in_this_process):
        run_folder.release()


def list_runs(root: Path | None = None, *, clean: bool = True) -> list[dict[str, Any]]:
    """Reads the records of all listed runs, oldest first.

    A record that is not what a run writes (truncated, hand-edited, hostile)
    is skipped, and reported once in one line (logger
    ``jupyter_traincontrol``); every other run is listed as usual.

    Args:
        root: The registry folder. Defaults to `registry_root()`.
        clean: Remove the folders of runs whose process is gone.

    Returns:
        One record (a dict) per run, with ``live`` (False once the run's
        process is gone, only seen with ``clean=False``) and ``folder`` (the
        run's folder, as found here) added.
    """
    root = Path(root) if root else registry_root()
    try:
        check_private(root, os.lstat(root), kind="dir")
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    if clean:
        sweep_dead_runs(root)
    records = []
    for name in names:
        if name.startswith("."):
            continue
        record = _read_run(root / name, clean=clean)
        if record is not None:
            records.append(record)
    return sorted(records, key=lambda record: record.get("started") or 0)


def _read_run(folder: Path, *, clean: bool) -> dict[str, Any] | None:
    """The validated record of the run in `folder`, or None (gone, removed
    because dead, or malformed)."""
    try:
        check_private(folder, os.lstat(folder), kind="dir")
        live = folder_is_live(folder)
        if not live and clean and remove_if_dead(folder):
            return None
        raw = _read_record_text(folder / RECORD_NAME)
    except FileNotFoundError:
        return None
    except OSError as error:  # a planted symlink, someone else's folder, an I/O error
        _report_once(folder, f"Skipping {folder}: {error}")
        return None
    if raw is None:
        return None
    record, problem = validate_record(raw, folder.name)
    if record is None:
        _report_once(folder / RECORD_NAME, f"Skipping the malformed run record {folder / RECORD_NAME}: {problem}")
        return None
    record["live"] = live
    record["folder"] = str(folder)
    return record


def _read_record_text(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_RECORD_BYTES + 1)
    return data.decode("utf-8", "replace")


def find_run(name: str, root: Path | None = None) -> dict[str, Any]:
    """Returns the record of the run called `name`, read from its folder
    directly (no scan of the registry).

    The record says ``live: False`` if the run's process is gone (its
    folder is removed then: the next lookup finds nothing).

    Raises:
        RunNotFoundError: If no run of that name is listed.
    """
    root = Path(root) if root else registry_root()
    if not isinstance(name, str) or not _NAME_PATTERN.match(name):
        raise RunNotFoundError(f"No run named {shorten(repr(name), 80)}: not a valid run name.")
    record = _read_run(root / name, clean=False)
    if record is None:
        known = ", ".join(record["name"] for record in list_runs(root)) or "none"
        raise RunNotFoundError(f"No run named {name!r}. Runs listed: {shorten(known, 80)}.")
    if not record["live"]:
        remove_if_dead(root / name)  # its FIFO goes too: `echo stop >` never waits on a dead run
    return record


def unique_name(prefix: str = "run", root: Path | None = None) -> str:
    """Returns ``PREFIX-N`` with the smallest N not used by a listed run."""
    taken = {record.get("name") for record in list_runs(root)}
    number = 1
    while f"{prefix}-{number}" in taken:
        number += 1
    return f"{prefix}-{number}"


_REPORTED_LIMIT = 256  # a long-lived process (a server) remembers this many
_reported: "OrderedDict[tuple[str, str], None]" = OrderedDict()
_reported_lock = threading.Lock()  # the server lists runs from a thread pool


def _report_once(path: Path, message: str) -> None:
    """Logs `message` about `path` once, remembering the most recent reports."""
    key = (str(path), message)
    with _reported_lock:
        if key in _reported:
            _reported.move_to_end(key)
            return
        _reported[key] = None
        if len(_reported) > _REPORTED_LIMIT:
            _reported.popitem(last=False)
    logger.warning("%s", message)


