"""Private files and folders: created safely, never adopted blindly.

Every folder the tool creates is mode 0700 and every file 0600. An existing
path is used only if it is what we expect (a real folder, not a symlink),
owned by the current user and private; otherwise `UnsafePathError` says why.
JSON metadata is always written to a temporary file and renamed into place,
so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["UnsafePathError", "ensure_private_dir", "write_json_atomic", "read_json"]


class UnsafePathError(OSError):
    """Raised for a path that is a symlink, owned by someone else, or public."""


def _current_uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def check_private(path: Path, st: os.stat_result, *, kind: str) -> None:
    """Checks that an lstat result describes a private object of ours.

    Args:
        path: The path, for messages.
        st: Its `os.lstat` result.
        kind: ``"dir"`` or ``"fifo"``.

    Raises:
        UnsafePathError: If the object is of another kind, belongs to another
            user, or can be reached by group or others.
    """
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"Refusing {path}: it is a symlink; expected a real {kind}.")
    is_kind = stat.S_ISDIR if kind == "dir" else stat.S_ISFIFO
    if not is_kind(st.st_mode):
        raise UnsafePathError(
            f"Refusing {path}: expected a {kind}, found mode {stat.filemode(st.st_mode)}."
        )
    uid = _current_uid()
    if uid is not None and st.st_uid != uid:
        raise UnsafePathError(
            f"Refusing {path}: owned by uid {st.st_uid}, expected the current user (uid {uid})."
        )
    if os.name == "posix" and st.st_mode & 0o077:
        raise UnsafePathError(
            f"Refusing {path}: mode {stat.filemode(st.st_mode)} lets others in; "
            f"expected {'0700' if kind == 'dir' else '0600'}."
        )


def ensure_private_dir(path: Path) -> Path:
    """Creates `path` (and missing parents) as a private folder, or checks it.

    Missing parents are created with mode 0700 too. An existing `path` must be
    a real folder owned by the current user; if it is ours but too open, it
    is tightened to 0700.

    Args:
        path: The folder.

    Returns:
        `path`, now known to be a private folder of ours.

    Raises:
        UnsafePathError: If `path` is a symlink, not a folder, or someone
            else's.
    """
    path = Path(path)
    try:
        os.makedirs(path, mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    try:
        check_private(path, st, kind="dir")
    except UnsafePathError:
        uid = _current_uid()
        ours = stat.S_ISDIR(st.st_mode) and (uid is None or st.st_uid == uid)
        if not ours:
            raise
        os.chmod(path, 0o700)
    return path


def write_json_atomic(path: Path, data: Any) -> None:
    """Writes `data` as JSON to `path` through a temporary file and a rename.

    Args:
        path: The destination. Its folder must exist.
        data: Anything `json.dumps` accepts.
    """
    path = Path(path)
    text = json.dumps(data, indent=1, sort_keys=True, default=str)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".json.tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: Path) -> Any | None:
    """Reads a JSON file, or returns None if it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None
