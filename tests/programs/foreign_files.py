"""Files a user (or another tool, or another run) keeps in a checkpoint folder.

`plant` puts one of every kind in a folder, several of them named as the
store names its own; `fingerprint` hashes what is there, so a test can check
that the store removed, renamed or changed none of them. Used by the tests
and by the programs of this folder (no Keras needed).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

OTHER_RUN = "someone-else"


def plant(directory: Path, model_bytes: bytes) -> list[str]:
    """Creates the foreign files in `directory` (created if missing).

    Args:
        directory: The checkpoint folder.
        model_bytes: The bytes of a real ``.keras`` file, for the copies.

    Returns:
        The names planted (files and folders at the top of `directory`).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    other = "ckpt-000900-epoch0001-step000001"
    files = {
        "ckpt-best.keras": model_bytes,  # a copy made by hand
        "model-epoch03.keras": model_bytes[: len(model_bytes) // 2],  # ModelCheckpoint output, say
        "notes.txt": b"what I tried\n",
        "ckpt-000950-epoch0001-step000002.keras": b"looks like an orphan of ours",
        "ckpt-000960-epoch0001-step000003.json": b'{"format": 2, "tool": "jupyter-traincontrol", "run"',
        "ckpt-000970-epoch0001-step000004.json": json.dumps(
            {"format": 1, "run": "run", "file": "elsewhere/../x.keras", "size": 3}).encode(),
        f"{other}.keras": model_bytes,  # a complete checkpoint of another run
        f"{other}.json": json.dumps(_sidecar_of(OTHER_RUN, 900, f"{other}.keras", len(model_bytes))).encode(),
    }
    for name, data in files.items():
        (directory / name).write_bytes(data)
    staging_lookalike = directory / ".partial-12345-mine"
    staging_lookalike.mkdir(exist_ok=True)
    (staging_lookalike / "model.keras").write_bytes(b"a user's half file")
    return sorted([*files, staging_lookalike.name])


def fingerprint(directory: Path, names: list[str]) -> dict[str, str]:
    """SHA-256 of each of `names` (of every file inside a folder, for one)."""
    prints = {}
    for name in names:
        path = Path(directory) / name
        if path.is_dir() and not path.is_symlink():
            for inner in sorted(path.rglob("*")):
                prints[str(inner.relative_to(directory))] = _sha(inner)
            prints[name] = "folder"
        else:
            prints[name] = _sha(path) if os.path.lexists(path) else "missing"
    return prints


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _sidecar_of(run: str, sequence: int, file: str, size: int) -> dict:
    return {
        "tool": "jupyter-traincontrol", "format": 2, "run": run, "run_id": "f" * 32, "sequence": sequence,
        "file": file, "size": size, "epoch": 0, "step_in_epoch": 1, "steps_per_epoch": None,
        "epoch_complete": False, "global_step": 1, "resume_epoch": 0, "resume_step": 1, "metrics": {},
        "reason": "save", "time": "2026-01-01T00:00:00+00:00",
    }
