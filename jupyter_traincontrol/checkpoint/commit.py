"""The commit protocol: a checkpoint is staged, renamed into place sidecar last, flushed, pruned.

Both files are written inside a hidden ``.partial-RUNID-SEQ`` folder and
renamed into place: first the model, then the sidecar. The sidecar is the
commit mark: a model file without its sidecar is not a checkpoint. So a
process killed at any moment leaves the previous checkpoint whole, and
nothing half-written is ever listed. Before it stages anything, a save
records its intent (the staging folder's and the model file's names, then
the staged file's inode and size) in the folder's lock file
(`CheckpointFolder.record_intent`); a later holder uses that record, and
only that, to remove what a killed save left.

Flushing (fsync) guards against a machine crash, not a killed process, and
costs as long as the disk needs to write the file: `Committer` flushes a
checkpoint that ends a run at once, and otherwise flushes the newest one
only before a save would remove an older one (see `CheckpointStore`).
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any, Mapping

from .folder import STAGING_PREFIX, CheckpointFolder
from .records import Checkpoint
from .sidecar import DEFAULT_RUN, part_size, remove_part, sidecar_of

__all__ = ["Committer", "AUTOSAVE_REASON", "AUTOSAVES_KEPT", "retained"]

logger = logging.getLogger("jupyter_traincontrol")

#: The sidecar reason of a checkpoint taken by the autosave timer.
AUTOSAVE_REASON = "autosave"
#: How many of a run's newest autosaves are kept, beside its `keep` others.
AUTOSAVES_KEPT = 2

_STAGED_PART = "model"  # and the part's suffix: the model part's name inside a staging folder
_STAGED_SIDECAR = "info.json"


def retained(checkpoints: list[Checkpoint], keep: int) -> tuple[list[Checkpoint], list[Checkpoint]]:
    """Which of a run's `checkpoints` (oldest first, of its own line: see
    `CheckpointStore.lineage`) stay and which go: the
    newest `keep` of those the user asked for (``save``, ``stop``,
    ``interrupt``, ``end``, ...) and, apart from them, the newest
    `AUTOSAVES_KEPT` autosaves. So autosaves never push a checkpoint the
    user asked for out of `keep`.

    Returns:
        ``(kept, doomed)``, each oldest first.
    """
    autosaves = [c for c in checkpoints if c.info.get("reason") == AUTOSAVE_REASON]
    others = [c for c in checkpoints if c.info.get("reason") != AUTOSAVE_REASON]
    doomed_ids = {id(c) for c in others[: max(0, len(others) - keep)]}
    doomed_ids.update(id(c) for c in autosaves[: max(0, len(autosaves) - AUTOSAVES_KEPT)])
    return ([c for c in checkpoints if id(c) not in doomed_ids], [c for c in checkpoints if id(c) in doomed_ids])


class Committer:
    """Writes, flushes and removes the checkpoints of one run in a held folder.

    Args:
        folder: The held folder.
        keep: How many of the run's newest checkpoints to keep (autosaves
            apart: see `retained`).
    """

    def __init__(self, folder: CheckpointFolder, keep: int):
        self.folder = folder
        self.keep = keep
        self._flushed: set[int] = set()  # sequences flushed to disk

    def write(self, source, info: dict[str, Any]) -> None:
        """Stages `source` (anything with ``save(path)``: a model, a snapshot)
        and its sidecar `info`, then renames them into place.

        On failure, removes whatever it made (the renamed model file too)
        and re-raises.
        """
        folder = self.folder
        fd, file = folder.dir_fd, info["file"]
        sidecar = sidecar_of(file)
        staged = _STAGED_PART + os.path.splitext(file)[1]
        staging = f"{STAGING_PREFIX}{folder.run_id}-{info['sequence']}"
        intent = {"staging": staging, "file": file}
        folder.record_intent(intent)
        folder.phase("intent-recorded")
        renamed = False
        try:
            os.mkdir(staging, 0o700, dir_fd=fd)
            folder.phase("staging-created")
            source.save(folder.directory / staging / staged)
            st = os.stat(f"{staging}/{staged}", dir_fd=fd, follow_symlinks=False)
            info["size"] = part_size(fd, f"{staging}/{staged}", st)
            folder.record_intent({**intent, "inode": st.st_ino, "size": info["size"]})
            folder.phase("staged-model")
            _write_new_file(folder.directory / staging / _STAGED_SIDECAR, _json_text(info))
            folder.phase("staged-sidecar")
            os.rename(f"{staging}/{staged}", file, src_dir_fd=fd, dst_dir_fd=fd)
            renamed = True
            folder.phase("model-renamed")
            os.rename(f"{staging}/{_STAGED_SIDECAR}", sidecar, src_dir_fd=fd, dst_dir_fd=fd)  # the commit
            folder.phase("sidecar-committed")
        except BaseException:
            self._undo(staging, file if renamed else None)
            raise
        os.rmdir(staging, dir_fd=fd)
        folder.phase("staging-removed")
        folder.record_intent(None)
        folder.phase("intent-cleared")

    def _undo(self, staging: str, renamed_model: str | None) -> None:
        """Cleans up after a failed save; reports (never raises) what it could not."""
        folder = self.folder
        pending = folder.pending or {}
        try:
            if renamed_model is not None:
                folder.remove_if_same(renamed_model, pending.get("inode"), pending.get("size"))
            folder.remove_staging(staging)
            folder.record_intent(None)
        except OSError as error:
            logger.warning("A failed save left files in %s (the next run removes them): %s", folder.directory, error)

    def flush_previous(self, checkpoints: list[Checkpoint], reason: str) -> None:
        """Flushes the newest of `checkpoints` if this save (of `reason`) is going to prune.

        Done first, before this save changes the folder: a checkpoint written
        a while ago is then usually on disk already, and on a journaling file
        system flushing it forces no journal commit (which, on a busy disk,
        can take seconds).
        """
        autosave = reason == AUTOSAVE_REASON
        same_kind = [c for c in checkpoints if (c.info.get("reason") == AUTOSAVE_REASON) == autosave]
        limit = AUTOSAVES_KEPT if autosave else self.keep
        if checkpoints and limit > 1 and len(same_kind) >= limit:
            self.flush(checkpoints[-1])
            self.folder.phase("previous-flushed")

    def prune(self, checkpoints: list[Checkpoint], broken: list[tuple[str, dict, str]]) -> list[Checkpoint]:
        """Removes the run's `checkpoints` (those of its line, oldest first)
        that `retained` lets go, and the sidecars of the run's name whose
        model file a crash left short or missing.

        Returns:
            The checkpoints removed, oldest first.
        """
        kept, doomed = retained(checkpoints, self.keep)
        if doomed and not any(c.sequence in self._flushed for c in kept):
            # Never delete a checkpoint before a newer one is surely on disk
            # (with keep=1, that is the new one).
            self.flush(kept[-1])
        for old in doomed:
            self._remove(old.sidecar.name, old.path.name, shorter_than=None)
        for sidecar, info, _why in broken:
            if (info.get("run") or DEFAULT_RUN) == self.folder.run:
                self._remove(sidecar, info["file"], shorter_than=info["size"])
        return doomed

    def _remove(self, sidecar: str, model_file: str, shorter_than: int | None) -> None:
        """Uncommits a checkpoint of this run (its sidecar goes first), then
        removes its model file.

        The model file's inode and size are recorded as intent first, so a
        kill between the two removals leaves a record the next run acts on.

        Args:
            sidecar: The sidecar's name.
            model_file: The model file's name.
            shorter_than: For a checkpoint a crash broke: remove the model
                file only if it is shorter than this (a crash leaves it
                short; a longer one is not what this run wrote). None: the
                model file is whole, remove it.
        """
        folder = self.folder
        try:
            st = os.stat(model_file, dir_fd=folder.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        size = part_size(folder.dir_fd, model_file, st) if st is not None and _is_part(st) else None
        ours = size is not None and (shorter_than is None or size < shorter_than)
        if ours:
            folder.record_intent({"file": model_file, "inode": st.st_ino, "size": size})
        os.unlink(sidecar, dir_fd=folder.dir_fd)  # uncommit first
        folder.phase("uncommitted")
        if ours:
            remove_part(folder.dir_fd, model_file)
            folder.record_intent(None)

    def flush(self, checkpoint: Checkpoint) -> None:
        """Makes `checkpoint` durable: its two files and their names in the folder."""
        if checkpoint.sequence in self._flushed:
            return
        if checkpoint.path.is_dir():  # a folder part: its files, then its folders' names
            for root, _dirs, files in os.walk(checkpoint.path):
                for file in files:
                    _fsync_file(Path(root) / file)
                _fsync_dir(Path(root))
        else:
            _fsync_file(checkpoint.path)
        _fsync_file(checkpoint.sidecar)
        _fsync_dir(self.folder.directory)
        self._flushed.add(checkpoint.sequence)


def _is_part(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)


def _write_new_file(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def _json_text(info: Mapping[str, Any]) -> str:
    return json.dumps(info, indent=1, sort_keys=True, allow_nan=False)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
