"""Where runs are listed: one private folder per run under the Jupyter runtime dir.

::

    $(jupyter --runtime-dir)/traincontrol/         0700
        run-1/                                     0700
            run.json    the run's record (written atomically)
            control     its FIFO (while the run listens)

Any process of the same user reads the records: the CLI, the Jupyter server,
other kernels. A record stays, with its final state, while its process
lives; records of dead processes are removed when runs are listed. Names are
unique among live runs; the name of an ended run may be taken again.

This module knows nothing of Keras or IPython, so the CLI and the server
import it in milliseconds.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from .private_fs import check_private, ensure_private_dir, read_json, write_json_atomic
from .processes import process_alive, process_start_ticks

__all__ = [
    "STATES",
    "ACTIVE_STATES",
    "FINAL_STATES",
    "RECORD_NAME",
    "NameTakenError",
    "RunNotFoundError",
    "RunFolder",
    "registry_root",
    "list_runs",
    "find_run",
    "validate_name",
    "unique_name",
    "record_is_live",
]

#: Every state a run can be in, in lifecycle order.
STATES = ("starting", "running", "paused", "stopping", "stopped", "aborted", "finished", "failed")
#: States of a run that still trains (or is about to, or is winding down).
ACTIVE_STATES = frozenset(STATES[:4])
#: States after `fit` has returned or raised.
FINAL_STATES = frozenset(STATES[4:])

RECORD_NAME = "run.json"
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_CLAIM_GRACE_SECONDS = 10.0


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


def record_is_live(record: dict[str, Any]) -> bool:
    """True if the record's process lives (the same process, not a reused pid)."""
    return process_alive(record.get("pid", -1), record.get("pid_start"))


def _is_active(record: dict[str, Any] | None) -> bool:
    return bool(record) and record.get("state") in ACTIVE_STATES and record_is_live(record)


def _remove_folder(folder: Path) -> None:
    """Removes a run folder, first renaming it so no reader sees it half-gone."""
    trash = folder.parent / f".removed-{uuid.uuid4().hex}"
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


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
        self._write_lock = threading.Lock()

    @property
    def record_path(self) -> Path:
        """The run's JSON record."""
        return self.path / RECORD_NAME

    @classmethod
    def claim(cls, name: str, root: Path | None = None) -> "RunFolder":
        """Creates the private folder of a new run named `name`.

        Args:
            name: The run's name; see `validate_name`.
            root: The registry folder. Defaults to `registry_root()`.

        Returns:
            The claimed folder, with a first record (state ``starting``).

        Raises:
            NameTakenError: If a live run already has this name.
            UnsafePathError: If the registry or the run's folder is a
                symlink, someone else's, or not private.
        """
        validate_name(name)
        root = ensure_private_dir(Path(root) if root else registry_root())
        folder = root / name
        for _attempt in range(3):
            try:
                os.mkdir(folder, 0o700)
                break
            except FileExistsError:
                check_private(folder, os.lstat(folder), kind="dir")
                record = read_json(folder / RECORD_NAME)
                if _is_active(record):
                    raise NameTakenError(
                        f"A run named {name!r} is already {record['state']} "
                        f"(pid {record.get('pid')}). Choose another name, or stop that run first."
                    ) from None
                if record is None and time.time() - os.lstat(folder).st_mtime < _CLAIM_GRACE_SECONDS:
                    raise NameTakenError(
                        f"A run named {name!r} is being started by another process. Choose another name."
                    ) from None
                _remove_folder(folder)  # an ended or dead run: the name is free
        else:
            raise NameTakenError(f"Could not claim the name {name!r}: other processes keep taking it.")
        os.chmod(folder, 0o700)
        run_folder = cls(name, folder, uuid.uuid4().hex)
        run_folder.write_record({"state": "starting"})
        _claimed_in_this_process.add(run_folder)
        return run_folder

    def base_record(self) -> dict[str, Any]:
        """The fields every record of this run carries."""
        return {
            "name": self.name,
            "run_id": self.run_id,
            "pid": os.getpid(),
            "pid_start": process_start_ticks(os.getpid()),
        }

    def write_record(self, record: dict[str, Any]) -> None:
        """Replaces the run's record atomically (thread-safe).

        Args:
            record: The fields to write; `base_record` fields are added.
        """
        full = {**record, **self.base_record(), "updated": time.time()}
        with self._write_lock:
            if self.path.is_dir():
                write_json_atomic(self.record_path, full)

    def owns_folder(self) -> bool:
        """True while the folder on disk still belongs to this run."""
        record = read_json(self.record_path)
        return bool(record) and record.get("run_id") == self.run_id

    def release(self) -> None:
        """Removes the run's folder if it is still this run's. Idempotent."""
        _claimed_in_this_process.discard(self)
        if self.owns_folder():
            _remove_folder(self.path)


_claimed_in_this_process: set[RunFolder] = set()


@atexit.register
def _release_all_at_exit() -> None:
    for run_folder in list(_claimed_in_this_process):
        run_folder.release()


def list_runs(root: Path | None = None, *, clean: bool = True) -> list[dict[str, Any]]:
    """Reads the records of all listed runs, oldest first.

    Args:
        root: The registry folder. Defaults to `registry_root()`.
        clean: Remove the folders of runs whose process is gone.

    Returns:
        One record (a dict) per run, with ``live`` added: False once the
        run's process is gone (only seen with ``clean=False``).
    """
    root = Path(root) if root else registry_root()
    try:
        check_private(root, os.lstat(root), kind="dir")
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    records = []
    for name in names:
        if name.startswith("."):
            continue
        folder = root / name
        record = read_json(folder / RECORD_NAME)
        if not isinstance(record, dict):
            if clean and _stale_without_record(folder):
                _remove_folder(folder)
            continue
        live = record_is_live(record)
        if not live and clean:
            _remove_folder(folder)
            continue
        record["live"] = live
        records.append(record)
    return sorted(records, key=lambda record: record.get("started") or 0)


def _stale_without_record(folder: Path) -> bool:
    try:
        return time.time() - os.lstat(folder).st_mtime > _CLAIM_GRACE_SECONDS
    except FileNotFoundError:
        return False


def find_run(name: str, root: Path | None = None) -> dict[str, Any]:
    """Returns the record of the listed run called `name`.

    Raises:
        RunNotFoundError: If no live process lists a run of that name.
    """
    for record in list_runs(root):
        if record.get("name") == name:
            return record
    known = ", ".join(record["name"] for record in list_runs(root)) or "none"
    raise RunNotFoundError(f"No run named {name!r}. Runs listed: {known}.")


def unique_name(prefix: str = "run", root: Path | None = None) -> str:
    """Returns ``PREFIX-N`` with the smallest N not used by a listed run."""
    taken = {record.get("name") for record in list_runs(root)}
    number = 1
    while f"{prefix}-{number}" in taken:
        number += 1
    return f"{prefix}-{number}"

