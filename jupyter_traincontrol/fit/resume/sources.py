"""Where a resume from another run finds its checkpoints: a run's name, or a checkpoint's file.

``resume_from`` (`ControlCallback`, ``%%interruptible_fit --resume-from``)
names a run or a checkpoint file; `find_source` finds the checkpoints it
means, without Keras (the magic checks it before a run starts):

- a run name: its complete checkpoints in the run's own checkpoint folder;
  if there are none, in the folder the run's record names (a live run's, or
  an ended one's in the registry's history: ``checkpoints/a`` for a run
  ``a`` of a notebook);
- a path (it has a folder separator, or ends with ``.keras`` or
  ``.json``): that checkpoint, recognised by its sidecar.

Found nothing: `ResumeSourceError`, saying what was found instead.

Example:

>>> find_source("a", Path("checkpoints/b")).checkpoints[-1].path   # doctest: +SKIP
PosixPath('checkpoints/a/ckpt-000004-epoch0004-step000008.keras')
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ...checkpoint import Checkpoint
from ...checkpoint.folder import Scan, scan
from ...protocol import shorten
from ...registry import list_runs, validate_name

__all__ = ["ResumeSource", "ResumeSourceError", "check_resume_from", "find_source", "describe_others"]


class ResumeSourceError(ValueError):
    """``resume_from`` names nothing that can be resumed from; the message says what was found."""


@dataclasses.dataclass(frozen=True)
class ResumeSource:
    """The checkpoints a resume from another run chooses among.

    Attributes:
        run: The run whose checkpoints they are.
        directory: Their folder.
        checkpoints: Complete checkpoints, oldest first (one, for a path).
    """

    run: str
    directory: Path
    checkpoints: list[Checkpoint]


def check_resume_from(value: str | os.PathLike | None) -> str | Path | None:
    """``resume_from`` as given: None, a run name (`str`), or a checkpoint's path (`Path`).

    Raises:
        ValueError: For something that is neither, saying what was received.
    """
    if value is None:
        return None
    if isinstance(value, os.PathLike) or isinstance(value, str) and _is_path(value):
        return Path(value).expanduser()
    if not isinstance(value, str):
        raise ValueError(f"resume_from must be a run name or a checkpoint's path, got {type(value).__name__} "
                         f"{shorten(repr(value), 80)}.")
    try:
        return validate_name(value)
    except ValueError as error:
        raise ValueError(f"resume_from={shorten(value, 80)!r} is neither a checkpoint file nor a run name: "
                         f"{error}") from None


def _is_path(text: str) -> bool:
    return os.sep in text or text.endswith((".keras", ".json")) or text.startswith("~")


def find_source(resume_from: str | os.PathLike, directory: Path) -> ResumeSource:
    """The checkpoints `resume_from` names, for a run whose folder is `directory`.

    Raises:
        ResumeSourceError: If it names no complete checkpoint; the message
            says what was found.
        ValueError: If `resume_from` is neither a run name nor a path.
    """
    wanted = check_resume_from(resume_from)
    if isinstance(wanted, Path):
        return _from_path(wanted)
    return _from_run(wanted, Path(directory))


def _from_path(path: Path) -> ResumeSource:
    path = path.absolute()
    keras_file = path.with_suffix(".keras") if path.suffix == ".json" else path
    found = scan(path.parent, None)
    for checkpoint in found.checkpoints:
        if checkpoint.path.name == keras_file.name or checkpoint.path.with_suffix(".json").name == path.name:
            return ResumeSource(checkpoint.run, path.parent, [checkpoint])
    if not os.path.lexists(path):
        what = f"there is no file {path}" + (f" (its folder holds {describe_others(found)})" if found.checkpoints else "")
    else:
        why = next((why for name, _info, why in found.broken if name == keras_file.with_suffix(".json").name), None)
        why = why or next((why for name, why in found.rejected if name == keras_file.with_suffix(".json").name), None)
        what = (f"{path.name} is not a complete checkpoint: {why}" if why else
                f"{path.name} has no sidecar of jupyter-traincontrol beside it ({keras_file.with_suffix('.json').name})")
    raise ResumeSourceError(f"Cannot resume from {path}: {what}. Expected the .keras file of a checkpoint this tool "
                            "wrote, or the name of a run.")


def _from_run(run: str, directory: Path) -> ResumeSource:
    here = scan(directory, None)
    if here.of_run(run):
        return ResumeSource(run, directory, here.of_run(run))
    folders = [Path(record["checkpoint_dir"]) for record in reversed(list_runs(ended=True))
               if record.get("name") == run and isinstance(record.get("checkpoint_dir"), str)]
    for folder in dict.fromkeys(folders):  # the newest instance's folder first
        checkpoints = scan(folder, None).of_run(run)
        if checkpoints:
            return ResumeSource(run, folder, checkpoints)
    listed = (f"run {run!r} is listed with the folder {folders[0]}, which holds none of its checkpoints" if folders
              else f"no run {run!r} is listed, nor in the history of ended runs")
    raise ResumeSourceError(
        f"Cannot resume from run {run!r}: {directory} holds {describe_others(here)}, and {listed}. Expected the name "
        "of a run whose checkpoints are in the checkpoint folder, or the path of a checkpoint's .keras file."
    )


def describe_others(found: Scan, but: str | None = None) -> str:
    """What a folder holds, in words: ``checkpoints of runs 'a' (3, newest
    ckpt-...keras) and 'b' (1, ...)``, leaving out run `but`."""
    runs: dict[str, list[Checkpoint]] = {}
    for checkpoint in found.checkpoints:
        if checkpoint.run != but:
            runs.setdefault(checkpoint.run, []).append(checkpoint)
    if not runs:
        return "no checkpoints of this tool"
    parts = [f"{name!r} ({len(items)}, newest {items[-1].path.name})" for name, items in sorted(runs.items())]
    return f"checkpoints of run{'s' if len(parts) > 1 else ''} " + ", ".join(parts)
