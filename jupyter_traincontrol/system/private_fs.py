"""Private files and folders: created safely, never adopted blindly.

Every folder the tool creates is mode 0700 and every file 0600. An existing
path is used only if it is what we expect (a real folder, not a symlink),
owned by the current user and private; otherwise `UnsafePathError` says why.
JSON metadata is always written to a temporary file and renamed into place,
so a reader never sees half a file, and never holds ``NaN`` or ``Infinity``
(which are not JSON): they are written as ``null``.
"""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path
from typing import Any

from ..protocol.values import json_safe

__all__ = [
    "UnsafePathError",
    "check_private",
    "ensure_private_dir",
    "describe_kind",
    "exists_at",
    "make_private_dirs",
    "open_dir",
    "read_json",
    "write_json_atomic",
    "json_text",
    "file_identity",
]


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
    make_private_dirs(path)
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


def make_private_dirs(path: Path) -> list[Path]:
    """Creates `path` and its missing parents, each with mode 0700.

    Unlike `os.makedirs`, which gives the parents it creates the default
    mode, every folder created here is private. Existing folders are left
    as they are.

    Args:
        path: The folder to create.

    Returns:
        The folders created, outermost first (empty if `path` existed).

    Raises:
        OSError: If a component is not a folder or cannot be created.
    """
    path = Path(path).absolute()
    created: list[Path] = []
    for _attempt in range(_MAKE_ATTEMPTS):
        missing = []
        for folder in [path, *path.parents]:
            if os.path.lexists(folder):
                break
            missing.append(folder)
        try:
            for folder in reversed(missing):
                try:
                    os.mkdir(folder, 0o700)
                except FileExistsError:  # made by someone else meanwhile: checked by the caller
                    continue
                created.append(folder)
            return created
        except FileNotFoundError:  # a parent was removed meanwhile (a run let its empty folder go): again
            created = [folder for folder in created if os.path.lexists(folder)]
    raise FileNotFoundError(f"Could not create {path}: its parent folders kept being removed.")


#: Tries of `make_private_dirs` while other processes remove the empty parents it is making folders in.
_MAKE_ATTEMPTS = 5


_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_json_atomic(path: Path, data: Any, *, dir_fd: int | None = None) -> tuple[int, int, int]:
    """Writes `data` as JSON to `path` through a temporary file and a rename.

    Non-finite floats are written as ``null`` (see `json_safe`).

    Args:
        path: The destination. Its folder must exist.
        data: Anything `json.dumps` accepts.
        dir_fd: An open descriptor of the folder to write in; then only
            `path`'s last component is used, and nothing on the way is
            looked up again (a folder renamed or swapped meanwhile cannot
            redirect the write).

    Returns:
        The written file's identity (`file_identity`): while the file at
        `path` has it, it is this write's.
    """
    path = Path(path)
    text = json_text(data)
    if dir_fd is None:
        dir_fd_to_close = dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    else:
        dir_fd_to_close = None
    try:
        tmp = _temporary_name(path.name)
        fd = os.open(tmp, _NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                identity = file_identity(os.fstat(fd))
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
            raise
    finally:
        if dir_fd_to_close is not None:
            os.close(dir_fd_to_close)
    return identity


def _temporary_name(name: str) -> str:
    return f".{name}.{uuid.uuid4().hex}.tmp"


def json_text(data: Any) -> str:
    """`data` as one line of JSON, keys sorted, non-finite floats as ``null``.

    Data that is plain JSON already (the usual case) goes straight to the C
    encoder; only data with a non-finite float or a value JSON has no type
    for (a path, say: written as its ``str``) is walked first (`json_safe`).
    """
    try:
        return json.dumps(data, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return json.dumps(json_safe(data), sort_keys=True, default=str, allow_nan=False)


def file_identity(st: os.stat_result) -> tuple[int, int, int]:
    """What tells one written file from another at the same path: inode, size, modification time."""
    return st.st_ino, st.st_size, st.st_mtime_ns


def open_dir(path: Path) -> int:
    """Opens a folder for `dir_fd` use, never through a symlink.

    Raises:
        OSError: If `path` is a symlink (ELOOP) or not a folder.
    """
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def read_json(path: Path) -> Any | None:
    """Reads a JSON file, or returns None if it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def describe_kind(st: os.stat_result) -> str:
    """What a stat result is, in words: ``a regular file``, ``a symlink``, ..."""
    kinds = [(stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
             (stat.S_ISDIR, "a folder")]
    return next((text for test, text in kinds if test(st.st_mode)), f"mode {stat.filemode(st.st_mode)}")


def exists_at(dir_fd: int, name: str) -> bool:
    """True if `name` exists in the folder open as `dir_fd` (a dangling symlink counts)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
