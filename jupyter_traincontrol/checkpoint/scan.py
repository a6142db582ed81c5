"""One pass over a checkpoint folder: which files are checkpoints, of which run.

The folder may hold anything (``ModelCheckpoint`` output, a file copied in
by hand, other runs' checkpoints, what a killed save left). `scan` reads
every sidecar-like file, never raising for one: a complete checkpoint is a
valid sidecar of this tool whose model file exists with the size it says.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from pathlib import Path
from typing import Any, Mapping

from ..system.private_fs import describe_kind
from .parts import is_folder_part, part_size
from .records import Checkpoint, MalformedSidecarError
from .sidecar import read_sidecar

__all__ = ["Scan", "scan", "OUR_NAME"]

#: Names the store writes, used only to avoid reusing a number and to say
#: which broken sidecar a resume skipped; never to decide what is ours.
OUR_NAME = re.compile(r"^ckpt-(?P<seq>\d{6,})-epoch\d+-step\d+\.(?:keras|pt|ckpt|json)$")


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
