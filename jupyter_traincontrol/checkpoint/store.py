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
checks all of it, strictly). A run lists and resumes from the
checkpoints of its own name only, and removes only those of its own line:
the checkpoints it wrote, and, once it resumed one (`restore_latest`),
those of the runs it continues (`Checkpoint.lineage`). An earlier run of
the same name that this run did not resume keeps its checkpoints (its
``end`` checkpoint too); nothing else in the folder is ever removed or
renamed.

Writing: the commit protocol (`Committer`). Both files are written inside
a hidden ``.partial-RUNID-SEQ`` folder and renamed into place: first the
model, then the sidecar. The sidecar is the commit mark: a model file
without its sidecar is not a checkpoint. Before it stages anything, a save
records its intent (the staging folder's and the model file's names, then
the staged file's inode and size) in the folder's lock file
(`CheckpointFolder.record_intent`); a later holder uses that record, and
only that, to remove what a killed save left. So a process killed at any
moment leaves the previous checkpoint whole, and nothing half-written is
ever listed.

Flushing to disk (fsync) guards against a machine crash or power cut, not
against a killed process, and it holds the training thread for as long as
the disk needs to write the whole file. So a checkpoint taken while training
goes on (reason ``save``) is not flushed when it is written: the kernel
writes it back on its own (within about 30 s on Linux). A save that is
going to remove the oldest checkpoint (beyond `keep`, sidecar first) first
flushes the newest one, written a save earlier and by then usually on disk
already, so that is cheap; with ``keep=1``, the new one is flushed before the
old one goes. A checkpoint that ends a run (reason ``stop``, ``interrupt`` or
``end``, a `fit` that ran to its end) is flushed at once, and so is an
``autosave`` (it is there for a crash). The sidecar records the model file's
size, so a file that a crash left short or empty is not listed. Together: a
power cut may lose the ``save`` checkpoints of the last half minute, never
an older one nor the one a run ended with, and never leaves a broken one
listed.

The folder lock: a live run holds its folder with an OS lock (`fcntl.flock`
on ``.traincontrol.lock``, which names the holder), released by the kernel
when the process dies. A second store on the same folder, in this process
or another, fails with `CheckpointDirBusyError`. While it holds the folder,
the store works through a descriptor of it opened once, and a save fails
clearly if the path now leads to another folder. A folder the store made
and leaves holding nothing but its lock file is removed as it lets go.

Example:

>>> store = CheckpointStore("checkpoints/run-1", keep=3, run="run-1")   # doctest: +SKIP
>>> with store:                                                          # doctest: +SKIP
...     store.save(model, TrainingPosition(epoch=2, step_in_epoch=10), reason="save")
>>> store.latest().path                                                  # doctest: +SKIP
PosixPath('checkpoints/run-1/ckpt-000001-epoch0003-step000010.keras')
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any, Callable, Mapping

from ..system.private_fs import exists_at
from .folder import LOCK_FILE, OUR_NAME, STAGING_PREFIX, CheckpointFolder, Scan, scan
from .records import (
    Checkpoint,
    CheckpointDirError,
    CheckpointError,
    Restored,
    SkippedCheckpoint,
    TrainingPosition,
)
from .sidecar import DEFAULT_RUN, build_sidecar, part_size, remove_part, sidecar_of

__all__ = ["CheckpointStore", "Committer", "AUTOSAVE_REASON", "AUTOSAVES_KEPT", "LOCK_FILE", "retained"]

logger = logging.getLogger("jupyter_traincontrol")

#: The sidecar reason of a checkpoint taken by the autosave timer.
AUTOSAVE_REASON = "autosave"
#: How many of a run's newest autosaves are kept, beside its `keep` others.
AUTOSAVES_KEPT = 2

#: Reasons of checkpoints that end a run: flushed to disk before `save` returns.
_FLUSH_AT_ONCE = frozenset({"stop", "interrupt", "end", AUTOSAVE_REASON})


class CheckpointStore:
    """The checkpoints of one run, in one folder.

    Args:
        directory: Folder of the checkpoints; created (mode 0700, and any
            missing parent too) when the store first takes it.
        keep: How many of the run's newest checkpoints to keep (of its own
            line: see `lineage`). Defaults to 3. Autosaves are kept apart,
            the newest `AUTOSAVES_KEPT` of them: they never push out a
            checkpoint the user asked for.
        run: The run's name: the store lists, prunes and resumes from the
            checkpoints of this name only. Defaults to ``"run"``.
        run_id: The run instance's id, written in each sidecar (the run's
            record carries the same). Defaults to a new one.
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
        close_removed: Closes the descriptor of a folder the store made and
            removed as it let it go empty (see `CheckpointFolder`). Defaults
            to `os.close`.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        keep: int = 3,
        *,
        run: str | None = None,
        run_id: str | None = None,
        private: bool = False,
        on_phase: Callable[[str], None] | None = None,
        close_removed: Callable[[int], None] = os.close,
    ):
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"keep must be a whole number of at least 1, got {keep!r}.")
        self.folder = CheckpointFolder(directory, run=run, run_id=run_id, private=private, on_phase=on_phase,
                                       close_removed=close_removed)
        self.keep = keep
        self._committer = Committer(self.folder, keep)
        self._known: list[Checkpoint] = []  # as of the last scan or save
        self._line = self.folder.run_id  # the line it counts, prunes and writes: its own until it resumes
        self._looked_for_resume = False

    # The folder -------------------------------------------------------------

    @property
    def directory(self) -> Path:
        """The folder (absolute)."""
        return self.folder.directory

    @property
    def run(self) -> str:
        """The run whose checkpoints these are."""
        return self.folder.run

    @property
    def run_id(self) -> str:
        """The run instance's id, in each sidecar it writes."""
        return self.folder.run_id

    @property
    def held(self) -> bool:
        """True while the store holds its folder (between `acquire` and `release`)."""
        return self.folder.held

    @property
    def on_phase(self) -> Callable[[str], None] | None:
        """Told each phase of a save as it completes (see the class's docstring)."""
        return self.folder.on_phase

    @on_phase.setter
    def on_phase(self, hook: Callable[[str], None] | None) -> None:
        self.folder.on_phase = hook

    @property
    def phase(self) -> Callable[[str], None]:
        """Tells `on_phase`, if any, that a phase has just completed: ``phase(name)``."""
        return self.folder.phase

    def acquire(self) -> "CheckpointStore":
        """Takes the folder (see `CheckpointFolder.acquire`). Returns self."""
        self.folder.acquire()
        return self

    def release(self) -> None:
        """Lets the folder go. Idempotent."""
        self.folder.release()

    def __enter__(self) -> "CheckpointStore":
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()

    # Listing ----------------------------------------------------------------

    def scan(self) -> Scan:
        """One pass over the folder (every run's checkpoints, and what is broken)."""
        return scan(self.directory, self.folder.dir_fd)

    def list(self) -> list[Checkpoint]:
        """Returns this run's complete checkpoints, oldest first (read from the folder now)."""
        self._known = self.scan().of_run(self.run)
        return list(self._known)

    @property
    def known(self) -> list[Checkpoint]:
        """This run's complete checkpoints as of the last `list` or `save`
        (no look at the folder: cheap, for records and panels)."""
        return list(self._known)

    def latest(self) -> Checkpoint | None:
        """Returns this run's newest complete checkpoint, or None."""
        checkpoints = self.list()
        return checkpoints[-1] if checkpoints else None

    # The run's line -----------------------------------------------------------

    @property
    def lineage(self) -> str:
        """The line this run counts and prunes with `keep`, and writes in its
        sidecars: its own `run_id` until it continues another checkpoint's
        line (`continue_line`)."""
        return self._line

    @property
    def looked_for_resume(self) -> bool:
        """True once `restore_latest` ran, whatever it found."""
        return self._looked_for_resume

    def continue_line(self, checkpoint: Checkpoint) -> None:
        """This run continues `checkpoint` (it resumed from it): from now on
        it counts and prunes the checkpoints of `checkpoint`'s line (the
        resumed run's and its ancestors'), and its own carry that line on,
        so that resume after resume keeps `keep` of them, not all.

        `restore_latest` calls it for the checkpoint it loads.

        Raises:
            ValueError: If `checkpoint` is another run's (its name), or of
                another folder.
        """
        if checkpoint.run != self.run or checkpoint.path.parent != self.directory:
            raise ValueError(f"Run {self.run!r} in {self.directory} cannot continue the line of "
                             f"{checkpoint.path} (run {checkpoint.run!r}); expected one of its own checkpoints.")
        self._line = checkpoint.lineage

    def continue_own_line(self, lineage: str) -> None:
        """This run is the next of one object's runs (a `ControlCallback`
        given to `fit` after `fit`): it counts, prunes and carries on the
        line of that object's earlier run, `lineage`, as if it had resumed."""
        self._line = lineage

    def earlier(self, checkpoints: list[Checkpoint] | None = None) -> list[Checkpoint]:
        """The complete checkpoints of this run's name that are not of its
        line (earlier runs it did not resume), oldest first; they stay.

        Args:
            checkpoints: This run's checkpoints as already listed (`known`);
                None: the folder is read now.
        """
        return [checkpoint for checkpoint in (self.list() if checkpoints is None else checkpoints)
                if checkpoint.lineage != self._line]

    # Saving -----------------------------------------------------------------

    def save(
        self,
        source,
        position: TrainingPosition,
        *,
        reason: str,
        metrics: Mapping[str, Any] | None = None,
        run: str | None = None,
        resume_state: Mapping[str, Any] | None = None,
        tunables: Mapping[str, float] | None = None,
    ) -> Checkpoint:
        """Writes a checkpoint atomically and prunes this run's old ones (of its `lineage`).

        When this returns, the checkpoint is complete and listed; it is on
        disk for good (flushed) at once if `reason` ends the run (``stop``,
        ``interrupt``, ``end``), otherwise once the kernel has written it back or the
        next save flushes it (see the module's docstring). A store that does
        not hold its folder takes it for the save and lets it go after.

        Args:
            source: What to write: anything with ``save(path)`` that writes
                the checkpoint's model part at `path`: a ``.keras`` file (a
                Keras model, a `ModelSnapshot`), or what its ``suffix``
                attribute says (``.pt``, a ``.ckpt`` folder).
            position: Where training stands.
            reason: Why: ``"save"``, ``"stop"``, ``"interrupt"``, ...
            metrics: The latest metrics, stored in the sidecar (non-finite
                values as null).
            run: The run's name; if given, it must be the store's `run`.
            resume_state: What an exact resume needs besides the weights
                (`random_state.capture`), kept in the sidecar.
            tunables: The values steered so far (``set``, the NaN policy),
                kept in the sidecar; a resume sets them again.

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
            return self._save(source, position, reason, metrics, resume_state, tunables)
        with self:
            return self._save(source, position, reason, metrics, resume_state, tunables)

    def _save(self, source, position: TrainingPosition, reason: str, metrics, resume_state, tunables) -> Checkpoint:
        folder, committer = self.folder, self._committer
        folder.check_unchanged()
        try:
            found = scan(self.directory, folder.dir_fd)
            previous = found.of_run(self.run)
            line = [checkpoint for checkpoint in previous if checkpoint.lineage == self._line]  # the ones it prunes
            committer.flush_previous(line, reason)
            suffix = getattr(source, "suffix", ".keras")
            sequence, stem = self._free_name(found.top_sequence, position, suffix)
            info = build_sidecar(run=self.run, run_id=self.run_id, sequence=sequence, file=f"{stem}{suffix}",
                                 position=position, reason=reason, metrics=metrics, tunables=tunables,
                                 resume_state=resume_state, lineage=self._line)
            committer.write(source, info)
        except CheckpointDirError:
            raise
        except Exception as error:  # the disk, or the source's own save (a model Keras cannot serialize)
            newest = self.latest()
            kept = f"the previous checkpoint {newest.path.name} is kept" if newest else "there is no earlier checkpoint"
            why = (error.strerror or error) if isinstance(error, OSError) else f"{type(error).__name__}: {error}"
            raise CheckpointError(f"Could not write a checkpoint in {self.directory}: {why}; {kept}.") from error
        checkpoint = Checkpoint(path=self.directory / info["file"], info=info)
        self._known = [*previous, checkpoint]
        try:
            if reason in _FLUSH_AT_ONCE:
                committer.flush(checkpoint)
                folder.phase("flushed")
            doomed = committer.prune([*line, checkpoint], found.broken)
            self._known = [known for known in self._known if known not in doomed]
            folder.phase("pruned")
        except OSError as error:
            raise CheckpointError(
                f"Wrote {checkpoint.path.name}, but could not flush or remove older checkpoints in "
                f"{self.directory}: {error.strerror or error}; older checkpoints may remain."
            ) from error
        return checkpoint

    def _free_name(self, top_sequence: int, position: TrainingPosition, suffix: str) -> tuple[int, str]:
        """The next sequence number and a stem whose two names are both free.

        File names count epochs from 1, as the UI does.
        """
        sequence = top_sequence
        while True:
            sequence += 1
            stem = f"ckpt-{sequence:06d}-epoch{position.epoch + 1:04d}-step{position.step_in_epoch:06d}"
            if not any(exists_at(self.folder.dir_fd, stem + end) for end in (suffix, ".json")):
                return sequence, stem

    # Resuming ---------------------------------------------------------------

    def restore_latest(self, load: Callable[[Checkpoint], None],
                       on_skip: Callable[[SkippedCheckpoint], None] | None = None) -> Restored:
        """Loads this run's newest checkpoint that loads, with `load`, and
        continues its line (`continue_line`).

        Newer ones that do not load (a corrupt model file, a model file left
        short, a sidecar that is not valid) are skipped and reported.

        Args:
            load: Loads a checkpoint into what is being trained; raises
                `CheckpointError` (and leaves it as it was) if it cannot.
            on_skip: Called with each skipped checkpoint, newest first, as
                it is skipped.

        Returns:
            The checkpoint loaded (or None) and the ones skipped.
        """
        skipped: list[SkippedCheckpoint] = []
        self._looked_for_resume = True

        def skip(path: Path, reason: str) -> None:
            skipped.append(SkippedCheckpoint(path, reason))
            if on_skip is not None:
                on_skip(skipped[-1])

        found = self.scan()
        candidates = found.of_run(self.run)
        newest = candidates[-1].sequence if candidates else 0
        unusable = [(info["sequence"], self.directory / info["file"], f"{name}: {why}") for name, info, why in found.broken
                    if (info.get("run") or DEFAULT_RUN) == self.run]
        unusable += [(int(OUR_NAME.match(name)["seq"]), self.directory / name, why) for name, why in found.rejected]
        for sequence, path, why in sorted(unusable, key=lambda item: -item[0]):
            if sequence > newest:  # newer than any complete one: what a resume would have wanted
                skip(path, why)
        for checkpoint in reversed(candidates):
            try:
                load(checkpoint)
            except CheckpointError as error:
                skip(checkpoint.path, str(error))
                continue
            self.continue_line(checkpoint)
            return Restored(checkpoint, skipped)
        return Restored(None, skipped)


# The commit protocol -------------------------------------------------------------------------------------------------


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
