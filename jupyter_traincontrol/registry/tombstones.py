"""Tombstones: the last record of a run whose process let it go, kept a few minutes.

A script that applies ``stop`` and exits at once must not look like one that
died first: a sender waiting for its acknowledgement still finds the run's
last record here (`read_tombstone`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ..protocol.record import validate_record
from ..system.private_fs import check_private
from .paths import RECORD_NAME, TOMBSTONES_FOLDER, read_record_text, registry_root

__all__ = ["keep_tombstone", "read_tombstone", "remove_old_tombstones", "TOMBSTONE_SECONDS"]

#: How long the last record of a run whose process let it go is kept.
TOMBSTONE_SECONDS = 300.0


def keep_tombstone(folder: Path) -> None:
    """Keeps the last record of a run whose process let it go (it ended and
    its process exits), so that a sender waiting for an acknowledgement
    still finds it: a script that applies ``stop`` and exits at once must not
    look like one that died first."""
    tombstones = folder.parent / TOMBSTONES_FOLDER
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
    path = root / TOMBSTONES_FOLDER / f"{name}.json"
    try:
        text = read_record_text(path)
    except OSError:
        return None
    if text is None:
        return None
    record, _problem = validate_record(text, name)
    return record


def remove_old_tombstones(root: Path) -> None:
    folder = root / TOMBSTONES_FOLDER
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return
    for entry in entries:
        try:
            if time.time() - entry.stat(follow_symlinks=False).st_mtime > TOMBSTONE_SECONDS:
                os.unlink(entry.path)
        except OSError:
            continue
