"""The sidecar of a checkpoint: its format, and the strict reader of outside data.

A sidecar is a small JSON file beside each checkpoint's model part (a
``.keras`` file, a ``.pt`` file or a ``.ckpt`` folder): where training
stood, why the checkpoint was taken, and whose it is (the tool's marker, the
format, the run's name and instance id, the model file's name and size). It
is what makes a file in the folder a checkpoint of ours. `build_sidecar`
writes one; `parse_sidecar` accepts a sidecar only if every field is what
`build_sidecar` writes, and raises `MalformedSidecarError` (only that) for
anything else.

The part is whatever its source writes at a path with ``save(path)``: a
Keras model or snapshot writes a ``.keras`` file, PyTorch state dicts a
``.pt`` file, the user's own ``save=`` a ``.ckpt`` folder of files
(`PART_SUFFIXES`). `sidecar_of` names a part's sidecar; `part_size` and
`remove_part` measure and remove a part, file or folder alike, through the
checkpoint folder's descriptor and never through a symlink.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any, Mapping

from ..protocol.values import finite_metrics, json_safe
from .records import DEFAULT_RUN, MalformedSidecarError, TrainingPosition

__all__ = ["SIDECAR_FORMAT", "TOOL", "DEFAULT_RUN", "PART_SUFFIXES", "build_sidecar", "parse_sidecar", "read_sidecar",
           "check_run_name", "is_folder_part", "sidecar_of", "part_size", "remove_part"]

SIDECAR_FORMAT = 2
#: The tool's marker in every sidecar and lock record it writes.
TOOL = "jupyter-traincontrol"
_SIDECAR_MAX_BYTES = 64 * 1024
_MAX_COUNT = 2**53  # epochs, steps, sequences: exact in any JSON reader
_MAX_SIZE = 2**62
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
#: What a checkpoint's model part is, by its name's suffix: a Keras ``.keras``
#: file, PyTorch state dicts in a ``.pt`` file, or a ``.ckpt`` folder that the
#: user's own ``save=`` wrote.
PART_SUFFIXES = {".keras": "file", ".pt": "file", ".ckpt": "folder"}


# The model part --------------------------------------------------------------


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


# The sidecar writer -----------------------------------------------------------


def build_sidecar(*, run: str, run_id: str, sequence: int, file: str, position: TrainingPosition, reason: str,
                  metrics: Mapping[str, Any] | None = None, tunables: Mapping[str, float] | None = None,
                  resume_state: Mapping[str, Any] | None = None, lineage: str | None = None) -> dict[str, Any]:
    """The fields of a new sidecar (format 2), as `parse_sidecar` reads them.

    Args:
        run: The run's name.
        run_id: The run instance's id (the run record's).
        sequence: The checkpoint's number in its folder.
        file: The model file's name (``size`` is set once it is written).
        position: Where training stood.
        reason: Why: ``save``, ``stop``, ``interrupt``, ...
        metrics: The latest logs (non-finite values as null).
        tunables: The values steered so far (``set``, the NaN policy), if any.
        resume_state: What an exact resume needs besides the weights.
        lineage: The ``run_id`` of the first run of the chain of resumes
            this run continues (`Checkpoint.lineage`); None: `run_id`.
    """
    info = {
        "tool": TOOL,
        "format": SIDECAR_FORMAT,
        "run": run,
        "run_id": run_id,
        "lineage": lineage or run_id,
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
        "metrics": finite_metrics(metrics or {}),
        "reason": reason,
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if tunables:
        info["tunables"] = dict(tunables)
    if resume_state is not None:
        info["resume_state"] = dict(resume_state)
    return json_safe(info)


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
    if not isinstance(value, str) or os.path.splitext(value)[1] not in PART_SUFFIXES or len(value) > 255:
        raise ValueError(f"{_shown(value)}; expected a name ending in {', '.join(PART_SUFFIXES)}")
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


_RUN_NAME = _text(255)


def check_run_name(value: Any) -> Any:
    """A run name as sidecars carry it; raises `MalformedSidecarError` otherwise."""
    return _RUN_NAME(value)

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
def _object(value):
    if not isinstance(value, dict):
        raise ValueError(f"{_shown(value)}; expected a JSON object")
    return value


def _tunables(value):
    if not isinstance(value, dict) or len(value) > 100:
        raise ValueError(f"{_shown(value)}; expected an object of at most 100 names")
    for key, number in value.items():
        if len(key) > 64 or type(number) not in (int, float) or not math.isfinite(number):
            raise ValueError(f"{key[:40]!r}: {_shown(number)}; expected a finite number")
    return {key: float(number) for key, number in value.items()}


#: Fields a sidecar may have (checked when present): ``resume_state``, the
#: random state and data-order counts of `random_state` (version 2, or 1
#: without the counts), and ``tunables``, the values a
#: run was steered to (``set``, the NaN policy), both written since 0.2, and
#: ``lineage``, the ``run_id`` of the first run of the chain of resumes the
#: checkpoint's run continued (`Checkpoint.lineage`; a reader that does not
#: know it drops it, so the format stays 2).
_OPTIONAL_FIELDS = {"resume_state": _object, "tunables": _tunables, "lineage": _run_id}
_FIELDS_BY_FORMAT = {
    1: {**_FIELDS, "format": _exactly(1), "run": _optional(_RUN_NAME)},
    2: {**_FIELDS, "format": _exactly(2), "tool": _exactly(TOOL), "run": _RUN_NAME, "run_id": _run_id},
}


def parse_sidecar(data: bytes, name: str) -> dict[str, Any]:
    """Checks the bytes of a sidecar named `name`; returns its fields.

    A sidecar of this tool is a JSON object with the tool's marker, its
    format (1, written by the previous release, or 2), the run's name and
    ``run_id`` (format 2), the model part's name (the sidecar's own name with
    ``.keras``, ``.pt`` or ``.ckpt``) and size, and where training stood. Every field must have
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
    for field, check in _OPTIONAL_FIELDS.items():
        if field in info:
            try:
                checked[field] = check(info[field])
            except ValueError as error:
                raise MalformedSidecarError(f"{name}: {field!r} is {error}.") from None
    stem = name[: -len(".json")] if name.endswith(".json") else None
    if os.path.splitext(checked["file"])[0] != stem:
        raise MalformedSidecarError(f"{name}: 'file' is {checked['file']!r}; expected {stem!r} with one of "
                                    f"{', '.join(PART_SUFFIXES)}.")
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
