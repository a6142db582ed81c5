"""Listing runs, finding one by name, and a free name.

Records are outside data to every reader: one that is truncated,
hand-edited or hostile is skipped, reported once in one line (logger
``jupyter_traincontrol``), and every other run is listed as usual.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ..protocol import shorten
from ..protocol.record import validate_record
from ..system.private_fs import check_private
from .liveness import folder_is_live, remove_if_dead, sweep_dead_runs
from .paths import NAME_PATTERN, RECORD_NAME, RunNotFoundError, read_record_text, registry_root
from .tombstones import ended_runs, read_tombstone

__all__ = ["list_runs", "find_run", "unique_name"]

logger = logging.getLogger("jupyter_traincontrol")


def list_runs(root: Path | None = None, *, clean: bool = True, ended: bool = False) -> list[dict[str, Any]]:
    """Reads the records of all listed runs, oldest first.

    A record that is not what a run writes (truncated, hand-edited, hostile)
    is skipped, and reported once in one line (logger
    ``jupyter_traincontrol``); every other run is listed as usual.

    Args:
        root: The registry folder. Defaults to `registry_root()`.
        clean: Remove the folders of runs whose process is gone (their
            last records go to the history).
        ended: Also the history's ended runs (`tombstones`: the last 50, 5 of one name, at
            most 7 days old), with ``live: False`` and their ``end_reason``.

    Returns:
        One record (a dict) per run, with ``live`` (False once the run's
        process is gone, or for a run of the history) added, and, for a run
        of a live folder, ``folder`` (as found here).
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
    if ended:
        history, problems = ended_runs(root)
        for path, problem in problems:
            _report_once(path, f"Skipping the malformed record of an ended run {path}: {problem}")
        listed = {record.get("run_id") for record in records}
        records.extend(record for record in history if record.get("run_id") not in listed)
    return sorted(records, key=lambda record: record.get("started") or 0)


def _read_run(folder: Path, *, clean: bool) -> dict[str, Any] | None:
    """The validated record of the run in `folder`, or None (gone, removed
    because dead, or malformed)."""
    try:
        check_private(folder, os.lstat(folder), kind="dir")
        live = folder_is_live(folder)
        if not live and clean and remove_if_dead(folder):
            return None
        raw = read_record_text(folder / RECORD_NAME)
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



def find_run(name: str, root: Path | None = None) -> dict[str, Any]:
    """Returns the record of the run called `name`, read from its folder
    directly (no scan of the registry).

    The record says ``live: False`` if the run's process is gone (its
    folder is removed then: the next lookup finds nothing).

    Raises:
        RunNotFoundError: If no run of that name is listed.
    """
    root = Path(root) if root else registry_root()
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise RunNotFoundError(f"No run named {shorten(repr(name), 80)}: not a valid run name.")
    record = _read_run(root / name, clean=False)
    if record is None:
        known = ", ".join(record["name"] for record in list_runs(root)) or "none"
        ended = read_tombstone(name, root)
        last = (f" The last run named {name!r} has ended (state {ended['state']}, end reason "
                f"{ended.get('end_reason')}); it takes no more commands." if ended else "")
        raise RunNotFoundError(f"No run named {name!r}. Runs listed: {shorten(known, 80)}.{last}")
    if not record["live"]:
        remove_if_dead(root / name)  # its FIFO goes too: `echo stop >` never waits on a dead run
    return record


def unique_name(prefix: str = "run", root: Path | None = None) -> str:
    """Returns ``PREFIX-N`` with the smallest N that no folder in the
    registry has (after a sweep of dead runs' folders): the folders' names
    only, not their records, which a claim would otherwise read and check
    one by one."""
    root = Path(root) if root else registry_root()
    try:
        check_private(root, os.lstat(root), kind="dir")
        sweep_dead_runs(root)
        taken = set(os.listdir(root))
    except FileNotFoundError:
        taken = set()
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
