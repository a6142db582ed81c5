"""The checkpoint store: checkpoints that are never half-written, and restoring from them.

A checkpoint is a ``.keras`` file (architecture, weights and optimizer state;
`keras.models.load_model` opens it in any process) plus a small JSON sidecar
saying where training was: epoch, global step, step in the epoch, the last
metrics, why it was taken and when, and whose it is.

Whose: the folder may hold other files too (``ModelCheckpoint`` output, a
``ckpt-best.keras`` copied in by hand, other runs' checkpoints). The store
recognises its own checkpoints by their sidecar, never by a file name: the
sidecar carries the tool's marker, its format, the run's name, the run
instance's ``run_id``, the model file's name and its size (`read_sidecar`
checks all of it, strictly). A run lists, prunes and resumes from the
checkpoints of its own name only; nothing else in the folder is ever
removed or renamed.

Writing: both files are written inside a hidden ``.partial-RUNID-SEQ`` folder
and renamed into place: first the model, then the sidecar. The sidecar is
the commit mark: a ``.keras`` file without its sidecar is not a checkpoint.
So a process killed at any moment leaves the previous checkpoint whole, and
nothing half-written is ever listed. Before it stages anything, a save
records its intent (the staging folder's and the model file's names, then
the staged file's inode and size) in the folder's lock file; a later run
uses that record, and only that, to remove what a killed save left.

Flushing to disk (fsync) guards against a machine crash or power cut, not
against a killed process, and it holds the training thread for as long as
the disk needs to write the whole file. So a checkpoint taken while training
goes on (reason ``save``) is not flushed when it is written: the kernel
writes it back on its own (within about 30 s on Linux). A save that is
going to remove the oldest checkpoint (beyond `keep`, sidecar first) first
flushes the newest one, written a save earlier and by then usually on disk
already, so that is cheap; with ``keep=1``, the new one is flushed before the
old one goes. A checkpoint that ends a run (reason ``stop`` or
``interrupt``) is flushed at once. The sidecar records the model file's
size, so a file that a crash left short or empty is not listed. Together: a
power cut may lose the ``save`` checkpoints of the last half minute, never
an older one nor the one a run ended with, and never leaves a broken one
listed.

The folder lock: a live run holds its folder with an OS lock (`fcntl.flock`
on ``.traincontrol.lock``, which names the holder), released by the kernel
when the process dies. A second store on the same folder, in this process
or another, fails with `CheckpointDirBusyError`. While it holds the folder,
the store works through a descriptor of it opened once, and a save fails
clearly if the path now leads to another folder.

Example:

>>> store = CheckpointStore("checkpoints/run-1", keep=3, run="run-1")   # doctest: +SKIP
>>> with store:                                                          # doctest: +SKIP
...     store.save(model, TrainingPosition(epoch=2, step_in_epoch=10), reason="save")
>>> store.latest().path                                                  # doctest: +SKIP
PosixPath('checkpoints/run-1/ckpt-000001-epoch0003-step000010.keras')
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import os
import re
import stat
from pathlib import Path
from typing import Any, Callable, Mapping

from ..private_fs import json_safe

from .folder import LOCK_FILE, STAGING_PREFIX, CheckpointFolder, _kind, _lexists
from .records import (
    Checkpoint,
    CheckpointDirError,
    CheckpointError,
    MalformedSidecarError,
    Restored,
    SkippedCheckpoint,
    TrainingPosition,
)
from .sidecar import DEFAULT_RUN, SIDECAR_FORMAT, TOOL, read_sidecar

__all__ = ["CheckpointStore", "LOCK_FILE", "assign_variables", "copy_variables", "restore_weights"]

logger = logging.getLogger("jupyter_traincontrol")

_STAGED_MODEL = "model.keras"
_STAGED_SIDECAR = "info.json"
#: Names the store writes, used only to avoid reusing a number and to say
#: which broken sidecar a resume skipped; never to decide what is ours.
_OUR_NAME = re.compile(r"^ckpt-(?P<seq>\d{6,})-epoch\d+-step\d+\.(?:keras|json)$")
#: Reasons of checkpoints that end a run: flushed to disk before `save` returns.
_FLUSH_AT_ONCE = frozenset({"stop", "interrupt"})


# The store ------------------------------------------------------------------


@dataclasses.dataclass
class _Scan:
    """What one pass over the folder found."""

    checkpoints: list[Checkpoint]  # complete checkpoints of any run of this tool
    broken: list[tuple[str, dict, str]]  # (sidecar name, fields, why) of this tool, model file wrong
    rejected: list[tuple[str, str]]  # (name, why) of files named like sidecars but refused
    top_sequence: int  # the largest number in use, by a sidecar or a name


class CheckpointStore(CheckpointFolder):
    """The checkpoints of one run, in one folder.

    Args:
        directory: Folder of the checkpoints; created (mode 0700, and any
            missing parent too) when the store first takes it.
        keep: How many of the run's newest checkpoints to keep. Defaults to 3.
        run: The run's name: the store lists, prunes and resumes from the
            checkpoints of this name only. Defaults to ``"run"``.
        private: True for a folder the tool chose (``checkpoints/NAME``):
            it and its parent are then created private or must be real,
            private folders of the current user (a planted symlink or another
            user's folder is refused). Defaults to False: a folder the user
            gave is used as it is.
        on_phase: Called with the name of each phase a save (or taking the
            folder) has just completed, in order: ``locked``, ``recovered``,
            ``previous-flushed``, ``intent-recorded``, ``staging-created``,
            ``staged-model``, ``staged-sidecar``, ``model-renamed``,
            ``sidecar-committed``, ``staging-removed``, ``intent-cleared``,
            ``flushed``, ``uncommitted``, ``pruned`` (some only when they
            happen); a `CheckpointWriter` adds ``writer-started`` and
            ``writer-done`` around a background save. Called on the thread
            that saves. For tests and tracing; an exception it raises fails the
            save like any other.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        keep: int = 3,
        *,
        run: str | None = None,
        private: bool = False,
        on_phase: Callable[[str], None] | None = None,
    ):
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"keep must be a whole number of at least 1, got {keep!r}.")
        super().__init__(directory, run=run, private=private, on_phase=on_phase)
        self.keep = keep
        self._flushed: set[int] = set()  # sequences this store flushed to disk
        #: The values steered so far (``set``, the NaN policy): written in
        #: each sidecar as ``tunables`` while not empty; a resume sets them again.
        self.tunables: dict[str, float] = {}

    # Listing ----------------------------------------------------------------

    def list(self) -> list[Checkpoint]:
        """Returns this run's complete checkpoints, oldest first."""
        return [c for c in self._scan().checkpoints if c.run == self.run]

    def latest(self) -> Checkpoint | None:
        """Returns this run's newest complete checkpoint, or None."""
        checkpoints = self.list()
        return checkpoints[-1] if checkpoints else None

    def _scan(self) -> _Scan:
        """Reads every sidecar-like file of the folder, never raising for one."""
        fd = self._dir_fd
        opened = None
        if fd is None:
            try:
                fd = opened = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                return _Scan([], [], [], 0)
        try:
            return self._scan_fd(fd)
        finally:
            if opened is not None:
                os.close(opened)

    def _scan_fd(self, fd: int) -> _Scan:
        scan = _Scan([], [], [], 0)
        for name in os.listdir(fd):
            numbered = _OUR_NAME.match(name)
            if numbered:
                scan.top_sequence = max(scan.top_sequence, int(numbered["seq"]))
            if not name.endswith(".json") or name.startswith("."):
                continue
            try:
                info = read_sidecar(fd, name)
            except MalformedSidecarError as error:
                if numbered:
                    scan.rejected.append((name, str(error)))
                continue
            scan.top_sequence = max(scan.top_sequence, info["sequence"])
            why = _model_file_problem(fd, info)
            if why:
                scan.broken.append((name, info, why))
            else:
                scan.checkpoints.append(Checkpoint(path=self.directory / info["file"], info=info))
        scan.checkpoints.sort(key=lambda checkpoint: (checkpoint.sequence, checkpoint.path.name))
        return scan

    # Saving -----------------------------------------------------------------

    def save(
        self,
        model,
        position: TrainingPosition,
        *,
        reason: str,
        metrics: Mapping[str, Any] | None = None,
        run: str | None = None,
        resume_state: Mapping[str, Any] | None = None,
    ) -> Checkpoint:
        """Writes a checkpoint atomically and prunes this run's old ones.

        When this returns, the checkpoint is complete and listed; it is on
        disk for good (flushed) at once if `reason` ends the run (``stop``,
        ``interrupt``), otherwise once the kernel has written it back or the
        next save flushes it (see the module's docstring). A store that does
        not hold its folder takes it for the save and lets it go after.

        Args:
            model: The Keras model (optimizer state is included).
            position: Where training stands.
            reason: Why: ``"save"``, ``"stop"``, ``"interrupt"``, ...
            metrics: The latest metrics, stored in the sidecar (non-finite
                values as null).
            run: The run's name; if given, it must be the store's `run`.
            resume_state: What an exact resume needs besides the weights
                (`random_state.capture`), kept in the sidecar.

        Returns:
            The new checkpoint.

        Raises:
            CheckpointError: If writing failed (a full disk, say). The
                previous checkpoints are untouched and nothing partial stays.
                Also if the checkpoint was written but flushing or removing
                older ones failed; the message says which.
            CheckpointDirError: If the folder cannot be taken, or was
                replaced under the run (`CheckpointDirChangedError`).
            ValueError: If `run` is not the store's run.
        """
        if run is not None and run != self.run:
            raise ValueError(f"save(run={run!r}) on the store of run {self.run!r}; expected {self.run!r} or None.")
        if self.held:
            return self._save(model, position, reason, metrics, resume_state)
        with self:
            return self._save(model, position, reason, metrics, resume_state)

    def _save(self, model, position: TrainingPosition, reason: str, metrics, resume_state=None) -> Checkpoint:
        self._check_folder()
        try:
            scan = self._scan_fd(self._dir_fd)
            previous = [c for c in scan.checkpoints if c.run == self.run]
            self._flush_previous(previous)
            sequence, stem = self._free_name(scan.top_sequence, position)
            info = self._sidecar(sequence, f"{stem}.keras", position, reason, metrics)
            if resume_state is not None:
                info["resume_state"] = json_safe(dict(resume_state))
            self._write_staged(model, info)
        except CheckpointDirError:
            raise
        except OSError as error:
            newest = self.latest()
            kept = f"the previous checkpoint {newest.path.name} is kept" if newest else "there is no earlier checkpoint"
            raise CheckpointError(
                f"Could not write a checkpoint in {self.directory}: {error.strerror or error}; {kept}."
            ) from error
        checkpoint = Checkpoint(path=self.directory / info["file"], info=info)
        try:
            if reason in _FLUSH_AT_ONCE:
                self._flush(checkpoint)
                self._phase("flushed")
            self._prune([*previous, checkpoint], scan.broken)
            self._phase("pruned")
        except OSError as error:
            raise CheckpointError(
                f"Wrote {checkpoint.path.name}, but could not flush or remove older checkpoints in "
                f"{self.directory}: {error.strerror or error}; older checkpoints may remain."
            ) from error
        return checkpoint

    def _free_name(self, top_sequence: int, position: TrainingPosition) -> tuple[int, str]:
        """The next sequence number and a stem whose two names are both free.

        File names count epochs from 1, as the UI does.
        """
        sequence = top_sequence
        while True:
            sequence += 1
            stem = f"ckpt-{sequence:06d}-epoch{position.epoch + 1:04d}-step{position.step_in_epoch:06d}"
            if not any(_lexists(self._dir_fd, stem + suffix) for suffix in (".keras", ".json")):
                return sequence, stem

    def _sidecar(self, sequence: int, file: str, position: TrainingPosition, reason: str, metrics) -> dict[str, Any]:
        return json_safe({
            "tool": TOOL,
            "format": SIDECAR_FORMAT,
            "run": self.run,
            "run_id": self.run_id,
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
            "metrics": _plain_metrics(metrics or {}),
            "reason": reason,
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **({"tunables": dict(self.tunables)} if self.tunables else {}),
        })

    def _write_staged(self, model, info: dict[str, Any]) -> None:
        """Stages the model and sidecar, then renames them into place.

        On failure, removes whatever it made (the renamed model file too)
        and re-raises.
        """
        fd, file = self._dir_fd, info["file"]
        sidecar = file[: -len(".keras")] + ".json"
        staging = f"{STAGING_PREFIX}{self.run_id}-{info['sequence']}"
        intent = {"staging": staging, "file": file}
        self._record_intent(intent)
        self._phase("intent-recorded")
        renamed = False
        try:
            os.mkdir(staging, 0o700, dir_fd=fd)
            self._phase("staging-created")
            model.save(self.directory / staging / _STAGED_MODEL)
            st = os.stat(f"{staging}/{_STAGED_MODEL}", dir_fd=fd, follow_symlinks=False)
            info["size"] = st.st_size
            self._record_intent({**intent, "inode": st.st_ino, "size": st.st_size})
            self._phase("staged-model")
            _write_new_file(self.directory / staging / _STAGED_SIDECAR, _json_text(info))
            self._phase("staged-sidecar")
            os.rename(f"{staging}/{_STAGED_MODEL}", file, src_dir_fd=fd, dst_dir_fd=fd)
            renamed = True
            self._phase("model-renamed")
            os.rename(f"{staging}/{_STAGED_SIDECAR}", sidecar, src_dir_fd=fd, dst_dir_fd=fd)  # the commit
            self._phase("sidecar-committed")
        except BaseException:
            self._undo(staging, file if renamed else None)
            raise
        os.rmdir(staging, dir_fd=fd)
        self._phase("staging-removed")
        self._record_intent(None)
        self._phase("intent-cleared")

    def _undo(self, staging: str, renamed_model: str | None) -> None:
        """Cleans up after a failed save; reports (never raises) what it could not."""
        try:
            if renamed_model is not None:
                self._remove_if_same(renamed_model, self._pending.get("inode"), self._pending.get("size"))
            self._remove_staging(staging)
            self._record_intent(None)
        except OSError as error:
            logger.warning("A failed save left files in %s (the next run removes them): %s", self.directory, error)

    def _flush_previous(self, checkpoints: list[Checkpoint]) -> None:
        """Flushes the newest of `checkpoints` if this save is going to prune.

        Done first, before this save changes the folder: a checkpoint written
        a while ago is then usually on disk already, and on a journaling file
        system flushing it forces no journal commit (which, on a busy disk,
        can take seconds).
        """
        if self.keep > 1 and len(checkpoints) >= self.keep:
            self._flush(checkpoints[-1])
            self._phase("previous-flushed")

    def _prune(self, checkpoints: list[Checkpoint], broken: list[tuple[str, dict, str]]) -> None:
        """Removes all but the newest `keep` of this run's `checkpoints`, and
        this run's sidecars whose model file a crash left short or missing."""
        doomed = checkpoints[: max(0, len(checkpoints) - self.keep)]
        kept = checkpoints[len(doomed):]
        if doomed and not any(c.sequence in self._flushed for c in kept):
            # Never delete a checkpoint before a newer one is surely on disk
            # (with keep=1, that is the new one).
            self._flush(kept[-1])
        for old in doomed:
            self._remove_checkpoint(old.sidecar.name, old.path.name, shorter_than=None)
        for sidecar, info, _why in broken:
            if (info.get("run") or DEFAULT_RUN) == self.run:
                self._remove_checkpoint(sidecar, info["file"], shorter_than=info["size"])

    def _remove_checkpoint(self, sidecar: str, model_file: str, shorter_than: int | None) -> None:
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
        try:
            st = os.stat(model_file, dir_fd=self._dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        ours = st is not None and stat.S_ISREG(st.st_mode) and (shorter_than is None or st.st_size < shorter_than)
        if ours:
            self._record_intent({"file": model_file, "inode": st.st_ino, "size": st.st_size})
        os.unlink(sidecar, dir_fd=self._dir_fd)  # uncommit first
        self._phase("uncommitted")
        if ours:
            os.unlink(model_file, dir_fd=self._dir_fd)
            self._record_intent(None)

    def _flush(self, checkpoint: Checkpoint) -> None:
        """Makes `checkpoint` durable: its two files and their names in the folder."""
        if checkpoint.sequence in self._flushed:
            return
        _fsync_file(checkpoint.path)
        _fsync_file(checkpoint.sidecar)
        _fsync_dir(self.directory)
        self._flushed.add(checkpoint.sequence)

    # Resuming ---------------------------------------------------------------

    def restore_latest(self, model, on_skip: Callable[[SkippedCheckpoint], None] | None = None) -> Restored:
        """Loads this run's newest checkpoint that loads into `model`.

        Newer ones that do not load (a corrupt ``.keras`` file, a model file
        left short, a sidecar that is not valid) are skipped and reported.
        If none loads, `model` keeps the weights it had.

        Args:
            model: A built, compiled Keras model of the run's architecture.
            on_skip: Called with each skipped checkpoint, newest first, as
                it is skipped.

        Returns:
            The checkpoint loaded (or None) and the ones skipped.
        """
        skipped: list[SkippedCheckpoint] = []

        def skip(path: Path, reason: str) -> None:
            skipped.append(SkippedCheckpoint(path, reason))
            if on_skip is not None:
                on_skip(skipped[-1])

        scan = self._scan()
        candidates = [c for c in scan.checkpoints if c.run == self.run]
        newest = candidates[-1].sequence if candidates else 0
        unusable = [(info["sequence"], self.directory / info["file"], f"{name}: {why}") for name, info, why in scan.broken
                    if (info.get("run") or DEFAULT_RUN) == self.run]
        unusable += [(int(_OUR_NAME.match(name)["seq"]), self.directory / name, why) for name, why in scan.rejected]
        for sequence, path, why in sorted(unusable, key=lambda item: -item[0]):
            if sequence > newest:  # newer than any complete one: what a resume would have wanted
                skip(path, why)
        saved = None
        for checkpoint in reversed(candidates):
            saved = saved or copy_variables(model)
            try:
                restore_weights(model, checkpoint)
            except CheckpointError as error:
                skip(checkpoint.path, str(error))
                assign_variables(saved)
                continue
            return Restored(checkpoint, skipped)
        return Restored(None, skipped)


def restore_weights(model, checkpoint: Checkpoint) -> None:
    """Loads a checkpoint's weights and optimizer state into `model`.

    The optimizer is built first: Keras silently drops optimizer state
    loaded into an optimizer that is not built yet.

    Args:
        model: A built, compiled Keras model of the same architecture.
        checkpoint: What to load.

    Raises:
        CheckpointError: If the file cannot be loaded into this model.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    try:
        model.load_weights(checkpoint.path)
    except Exception as error:  # Keras raises ValueError, OSError, zipfile errors, ...
        raise CheckpointError(
            f"Could not load {checkpoint.path} into model {model.name!r}: {error}"
        ) from error


# Helpers --------------------------------------------------------------------


def copy_variables(model) -> list[tuple[Any, Any]]:
    """Every variable of `model` and its optimizer, with a copy of its value."""
    import numpy as np

    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    variables = list(model.weights) + (list(optimizer.variables) if optimizer is not None else [])
    return [(variable, np.array(variable)) for variable in variables]


def assign_variables(saved: list[tuple[Any, Any]]) -> None:
    """Puts back the values `copy_variables` copied (after a failed load)."""
    for variable, value in saved:
        variable.assign(value)


def _plain_metrics(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    plain = {}
    for key, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue  # a non-scalar log entry: not a metric to record
        plain[str(key)] = number if math.isfinite(number) else None
    return plain


def _model_file_problem(dir_fd: int, info: Mapping[str, Any]) -> str | None:
    """Why the model file a sidecar names is not the one it describes, or None."""
    try:
        st = os.stat(info["file"], dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return f"its model file {info['file']} is missing"
    except OSError as error:
        return f"its model file {info['file']} cannot be read ({error.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return f"its model file {info['file']} is {_kind(st)}, not a regular file"
    if st.st_size != info["size"]:
        return f"its model file {info['file']} has {st.st_size} bytes; the sidecar says {info['size']}"
    return None


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
