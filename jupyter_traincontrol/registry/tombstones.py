"""The history of ended runs: the last record of each run whose folder went, kept a week.

A run's folder goes when its process lets it go (at exit, or when its
name is taken again) or when its process is found dead. Its last record is
then kept in ``.ended/`` (a tombstone): its final state, how it ended
(``end_reason``), its checkpoints, its acknowledgements. So:

- a sender waiting for an acknowledgement still finds it (`read_tombstone`):
  a script that applies ``stop`` and exits at once must not look like one
  that died first;
- ``jupyter-traincontrol list --all``, ``GET runs?all=true`` and the side
  panel show the user's ended runs after their kernel or server restarted
  (`ended_runs`).

A record found active whose process is gone (killed, or a kernel ended
before its run could stop) is kept too, as it was, with ``end_reason``
``process-gone``. The history is bounded: the newest `HISTORY_RUNS` runs,
at most `HISTORY_RUNS_PER_NAME` of one name (a loop of `fit` calls under
one name, a run each, does not push every other run out), none ended
more than `HISTORY_SECONDS` ago; each tombstone's modification time is
when its run ended.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

from ..protocol import FINAL_STATES, end_reason
from ..protocol.record import validate_record
from ..system.private_fs import check_private, write_json_atomic
from .paths import RECORD_NAME, TOMBSTONES_FOLDER, read_record_text, registry_root

__all__ = ["keep_tombstone", "read_tombstone", "ended_runs", "remove_old_tombstones", "HISTORY_RUNS",
           "HISTORY_RUNS_PER_NAME", "HISTORY_SECONDS"]

#: How many ended runs the history keeps at most.
HISTORY_RUNS = 50
#: How many ended runs of one name the history keeps at most (the newest).
HISTORY_RUNS_PER_NAME = 5
#: How long an ended run stays in the history.
HISTORY_SECONDS = 7 * 24 * 3600.0


def keep_tombstone(folder: Path, own: dict[str, Any] | None = None, prune: bool = True) -> None:
    """Keeps the last record of the run in `folder`, whose folder is about to
    go, in the history; one that is not valid is not kept. Never raises:
    without a tombstone, a waiting sender says the run is gone.

    Args:
        folder: The run's folder.
        own: The record as this process read it from its own run's folder
            (`RunFolder.release`): a final one is moved as it is, not
            read and written again.
        prune: Bound the history now (`remove_old_tombstones`). False: the
            caller has it done later (a claim: by its run's thread).
    """
    if own is not None and own.get("state") in FINAL_STATES and own.get("end_reason") is not None:
        try:
            path = _folder(folder.parent, create=True) / _file_name(own)
            os.replace(folder / RECORD_NAME, path)
            ended = _number(own.get("ended")) or time.time()
            os.utime(path, (ended, ended))
            if prune:
                remove_old_tombstones(folder.parent)
        except (OSError, KeyError, TypeError):
            pass
        return
    text = read_record_text(folder / RECORD_NAME)
    record, _problem = validate_record(text, folder.name) if text is not None else (None, "")
    if record is None:
        return
    now = time.time()
    if record["state"] not in FINAL_STATES:  # its process went without ending it
        record.update(end_reason="process-gone", commands=[], channel=None, fifo=None, address=None,
                      ended=_number(record.get("updated")) or now)
    elif record.get("end_reason") is None:  # written by an earlier version
        record["end_reason"] = end_reason(record["state"])
    ended = min(_number(record.get("ended")) or now, now)
    try:
        tombstones = _folder(folder.parent, create=True)
        path = tombstones / _file_name(record)
        write_json_atomic(path, record)
        os.utime(path, (ended, ended))
        remove_old_tombstones(folder.parent)
    except (OSError, ValueError):
        pass


def read_tombstone(name: str, root: Path | None = None) -> dict[str, Any] | None:
    """The last record of the newest ended run called `name`, validated;
    None if the history has none. A run whose process went without ending
    it says ``live: False``."""
    root = Path(root) if root else registry_root()
    newest = None
    for entry, entry_name in _entries(root):
        if entry_name == name and (newest is None or _mtime(entry) > _mtime(newest)):
            newest = entry
    if newest is None:
        return None
    record = _read(newest, name)[0]
    if record is not None and record.get("end_reason") == "process-gone":
        record["live"] = False
    return record


def ended_runs(root: Path | None = None) -> tuple[list[dict[str, Any]], list[tuple[Path, str]]]:
    """The records of the history, oldest first, each with ``live: False``.

    Returns:
        The records, and ``(path, why)`` for each tombstone that is not a
        valid record (skipped).
    """
    root = Path(root) if root else registry_root()
    records, problems = [], []
    horizon = time.time() - HISTORY_SECONDS
    for entry, name in _entries(root):
        if _mtime(entry) < horizon:
            continue
        record, problem = _read(entry, name)
        if record is None:
            problems.append((Path(entry.path), problem))
            continue
        record["live"] = False
        records.append(record)
    return sorted(records, key=lambda record: record.get("started") or 0), problems


def remove_old_tombstones(root: Path) -> None:
    """Bounds the history: removes tombstones beyond the newest `HISTORY_RUNS`,
    beyond the newest `HISTORY_RUNS_PER_NAME` of their name, and those of
    runs ended more than `HISTORY_SECONDS` ago."""
    entries = sorted(((entry, name, _mtime(entry)) for entry, name in _entries(root)), key=lambda item: -item[2])
    horizon = time.time() - HISTORY_SECONDS
    of_name: dict[str, int] = {}
    kept = 0
    for entry, name, mtime in entries:
        of_name[name] = of_name.get(name, 0) + 1
        if kept < HISTORY_RUNS and of_name[name] <= HISTORY_RUNS_PER_NAME and mtime >= horizon:
            kept += 1
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass  # gone already, or not ours to remove: the next sweep tries again


def _file_name(record: dict[str, Any]) -> str:
    """``NAME.DIGEST.json``: one file per run instance (the digest of its run id)."""
    digest = hashlib.sha256(record["run_id"].encode("utf-8", "replace")).hexdigest()[:16]
    return f"{record['name']}.{digest}.json"


def _folder(root: Path, create: bool = False) -> Path:
    folder = root / TOMBSTONES_FOLDER
    if create:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    check_private(folder, os.lstat(folder), kind="dir")
    return folder


def _entries(root: Path) -> list[tuple[os.DirEntry, str]]:
    """The history's files with the run name each is of (regular files only)."""
    try:
        entries = list(os.scandir(_folder(root)))
    except OSError:  # no history yet, or not a private folder of ours
        return []
    found = []
    for entry in entries:
        if entry.name.startswith(".") or not entry.name.endswith(".json"):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
        except OSError:
            continue
        found.append((entry, entry.name[: -len(".json")].rpartition(".")[0]))
    return found


def _read(entry: os.DirEntry, name: str) -> tuple[dict[str, Any] | None, str]:
    try:
        text = read_record_text(Path(entry.path))
    except OSError as error:
        return None, str(error)
    if text is None:
        return None, "gone"
    return validate_record(text, name)


def _mtime(entry: os.DirEntry) -> float:
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
