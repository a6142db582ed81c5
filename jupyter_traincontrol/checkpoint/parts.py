"""The model part of a checkpoint: a file (``.keras``, ``.pt``) or a folder (``.ckpt``).

A checkpoint is its model part plus its sidecar (``NAME.json``). The part is
whatever its source writes at a path with ``save(path)``: a Keras model or
snapshot writes a ``.keras`` file, PyTorch state dicts a ``.pt`` file, the
user's own ``save=`` a ``.ckpt`` folder of files. These helpers measure and
remove a part, file or folder alike, through the checkpoint folder's
descriptor and never through a symlink.
"""

from __future__ import annotations

import os
import shutil
import stat

from .sidecar import PART_SUFFIXES

__all__ = ["PART_SUFFIXES", "is_folder_part", "part_size", "remove_part", "sidecar_of"]


def is_folder_part(name: str) -> bool:
    """True if a part of this name is a folder (``.ckpt``)."""
    return PART_SUFFIXES.get(os.path.splitext(name)[1]) == "folder"


def sidecar_of(name: str) -> str:
    """The sidecar's name of part `name`: ``ckpt-...-step000010.json``."""
    return os.path.splitext(name)[0] + ".json"


def part_size(dir_fd: int, name: str, st: os.stat_result | None = None) -> int:
    """Bytes of the part `name`: a file's size, or the sum of the regular
    files' sizes in a folder, however deep (symlinks not followed)."""
    st = st or os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    total = 0
    for _root, _dirs, files, root_fd in os.fwalk(name, dir_fd=dir_fd, follow_symlinks=False):
        for file in files:
            entry = os.stat(file, dir_fd=root_fd, follow_symlinks=False)
            if stat.S_ISREG(entry.st_mode):
                total += entry.st_size
    return total


def remove_part(dir_fd: int, name: str) -> None:
    """Removes the part `name`: a file, or a folder and all it holds (a
    symlink inside is removed, never followed)."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)
