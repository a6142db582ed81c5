"""Checkpoints that are never half-written, and restoring from them.

A checkpoint is a ``.keras`` file (architecture, weights and optimizer state;
`keras.models.load_model` opens it in any process) plus a small JSON sidecar
saying where training was: epoch, global step, step in the epoch, the last
metrics, why it was taken and when.

Both are written inside a hidden ``.partial-*`` folder and renamed into
place: first the model, then the sidecar. The sidecar is the commit mark: a
``.keras`` file without its sidecar is not a checkpoint. So a process killed
at any moment leaves the previous checkpoint whole, and nothing half-written
is ever listed.

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

Example:

>>> store = CheckpointStore("checkpoints/run-1", keep=3)   # doctest: +SKIP
>>> store.save(model, TrainingPosition(epoch=2, step_in_epoch=10), reason="save")  # doctest: +SKIP
>>> store.latest().path                                   # doctest: +SKIP
PosixPath('checkpoints/run-1/ckpt-000001-epoch0002-step000010.keras')
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Mapping

from .private_fs import read_json
from .processes import process_alive

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointStore",
    "TrainingPosition",
    "restore_weights",
    "SIDECAR_FORMAT",
]

SIDECAR_FORMAT = 1
_NAME = re.compile(r"^ckpt-(?P<seq>\d{6,})-epoch(?P<epoch>\d+)-step(?P<step>\d+)\.json$")
_ANY_SEQUENCE = re.compile(r"^ckpt-(\d{6,})-")
_PARTIAL_PREFIX = ".partial-"
#: Reasons of checkpoints that end a run: flushed to disk before `save` returns.
_FLUSH_AT_ONCE = frozenset({"stop", "interrupt"})


class CheckpointError(OSError):
    """A checkpoint could not be written or read."""


@dataclasses.dataclass(frozen=True)
class TrainingPosition:
    """Where training stands, in Keras's terms.

    Attributes:
        epoch: Zero-based index of the epoch in progress (as `initial_epoch`).
        step_in_epoch: Batches of that epoch already trained.
        steps_per_epoch: Batches in an epoch, or None while unknown.
        global_step: Optimizer steps taken in all (`optimizer.iterations`).
        epoch_complete: True once every batch of `epoch` is trained.
    """

    epoch: int
    step_in_epoch: int
    steps_per_epoch: int | None = None
    global_step: int = 0
    epoch_complete: bool = False

    @property
    def resume_epoch(self) -> int:
        """The epoch a resumed `fit` continues in."""
        return self.epoch + 1 if self.epoch_complete else self.epoch

    @property
    def resume_step(self) -> int:
        """Batches of `resume_epoch` already trained."""
        return 0 if self.epoch_complete else self.step_in_epoch


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk.

    Attributes:
        path: The ``.keras`` file.
        info: The sidecar's content.
    """

    path: Path
    info: Mapping[str, Any]

    @property
    def sidecar(self) -> Path:
        """The JSON sidecar next to `path`."""
        return self.path.with_suffix(".json")

    @property
    def sequence(self) -> int:
        """Position in the store's order: larger is newer."""
        return int(self.info["sequence"])

    @property
    def position(self) -> TrainingPosition:
        """Where training stood when the checkpoint was taken."""
        return TrainingPosition(
            epoch=int(self.info["epoch"]),
            step_in_epoch=int(self.info["step_in_epoch"]),
            steps_per_epoch=self.info.get("steps_per_epoch"),
            global_step=int(self.info["global_step"]),
            epoch_complete=bool(self.info["epoch_complete"]),
        )


class CheckpointStore:
    """The checkpoints of one run, in one folder.

    Args:
        directory: Folder of the checkpoints; created on first save.
        keep: How many of the newest checkpoints to keep. Defaults to 3.
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 3):
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"keep must be a whole number of at least 1, got {keep!r}.")
        self.directory = Path(directory).absolute()
        self.keep = keep
        self._flushed: set[int] = set()  # sequences this store flushed to disk

    def list(self) -> list[Checkpoint]:
        """Returns the complete checkpoints, oldest first."""
        found = []
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        for name in names:
            match = _NAME.match(name)
            if not match:
                continue
            sidecar = self.directory / name
            model_file = sidecar.with_suffix(".keras")
            info = read_json(sidecar)
            if not isinstance(info, dict) or not _has_size(model_file, info.get("size")):
                continue
            info.setdefault("sequence", int(match["seq"]))
            found.append(Checkpoint(path=model_file, info=info))
        return sorted(found, key=lambda checkpoint: checkpoint.sequence)

    def latest(self) -> Checkpoint | None:
        """Returns the newest complete checkpoint, or None."""
        checkpoints = self.list()
        return checkpoints[-1] if checkpoints else None

    def save(
        self,
        model,
        position: TrainingPosition,
        *,
        reason: str,
        metrics: Mapping[str, Any] | None = None,
        run: str | None = None,
    ) -> Checkpoint:
        """Writes a checkpoint atomically and prunes old ones.

        When this returns, the checkpoint is complete and listed; it is on
        disk for good (flushed) at once if `reason` ends the run (``stop``,
        ``interrupt``), otherwise once the kernel has written it back or the
        next save flushes it (see the module's docstring).

        Args:
            model: The Keras model (optimizer state is included).
            position: Where training stands.
            reason: Why: ``"save"``, ``"stop"``, ``"interrupt"``, ...
            metrics: The latest metrics, stored in the sidecar.
            run: The run's name, stored in the sidecar.

        Returns:
            The new checkpoint.

        Raises:
            CheckpointError: If writing failed (a full disk, say). The
                previous checkpoints are untouched and nothing partial stays.
                Also if the checkpoint was written but flushing or removing
                older ones failed; the message says which.
        """
        try:
            os.makedirs(self.directory, exist_ok=True)
            previous = self.list()
            self._flush_previous(previous)
            self._remove_partials()
            sequence = self._next_sequence()
            stem = f"ckpt-{sequence:06d}-epoch{position.epoch:04d}-step{position.step_in_epoch:06d}"
            info = {
                "format": SIDECAR_FORMAT,
                "sequence": sequence,
                "file": f"{stem}.keras",
                "epoch": position.epoch,
                "step_in_epoch": position.step_in_epoch,
                "steps_per_epoch": position.steps_per_epoch,
                "epoch_complete": position.epoch_complete,
                "global_step": position.global_step,
                "resume_epoch": position.resume_epoch,
                "resume_step": position.resume_step,
                "metrics": _plain_metrics(metrics or {}),
                "reason": reason,
                "run": run,
                "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            }
            partial = Path(tempfile.mkdtemp(prefix=f"{_PARTIAL_PREFIX}{os.getpid()}-", dir=self.directory))
            try:
                staged_model = partial / "model.keras"
                model.save(staged_model)
                info["size"] = os.path.getsize(staged_model)
                staged_info = partial / "info.json"
                staged_info.write_text(_json_text(info), encoding="utf-8")
                final = self.directory / f"{stem}.keras"
                os.replace(staged_model, final)
                os.replace(staged_info, final.with_suffix(".json"))  # the commit
            finally:
                _remove_staging(partial)
        except OSError as error:
            newest = self.latest()
            kept = f"the previous checkpoint {newest.path.name} is kept" if newest else "there is no earlier checkpoint"
            raise CheckpointError(
                f"Could not write a checkpoint in {self.directory}: {error.strerror or error}; {kept}."
            ) from error
        checkpoint = Checkpoint(path=final, info=info)
        try:
            if reason in _FLUSH_AT_ONCE:
                self._flush(checkpoint)
            self._prune([*previous, checkpoint])
        except OSError as error:
            raise CheckpointError(
                f"Wrote {final.name}, but could not flush or remove older checkpoints in "
                f"{self.directory}: {error.strerror or error}; older checkpoints may remain."
            ) from error
        return checkpoint

    def _next_sequence(self) -> int:
        numbers = [int(m[1]) for m in map(_ANY_SEQUENCE.match, os.listdir(self.directory)) if m]
        return max(numbers, default=0) + 1

    def _flush_previous(self, checkpoints: list[Checkpoint]) -> None:
        """Flushes the newest of `checkpoints` if this save is going to prune.

        Done first, before this save changes the folder: a checkpoint written
        a while ago is then usually on disk already, and on a journaling file
        system flushing it forces no journal commit (which, on a busy disk,
        can take seconds).
        """
        if self.keep > 1 and len(checkpoints) >= self.keep:
            self._flush(checkpoints[-1])

    def _prune(self, checkpoints: list[Checkpoint]) -> None:
        """Removes all but the newest `keep` of `checkpoints` (all there are)."""
        doomed = checkpoints[: max(0, len(checkpoints) - self.keep)]
        kept = checkpoints[len(doomed):]
        if doomed and not any(c.sequence in self._flushed for c in kept):
            # Never delete a checkpoint before a newer one is surely on disk
            # (with keep=1, that is the new one).
            self._flush(kept[-1])
        for old in doomed:
            old.sidecar.unlink(missing_ok=True)  # uncommit first
            old.path.unlink(missing_ok=True)
        self._remove_orphans()

    def _flush(self, checkpoint: Checkpoint) -> None:
        """Makes `checkpoint` durable: its two files and their names in the folder."""
        if checkpoint.sequence in self._flushed:
            return
        _fsync_file(checkpoint.path)
        _fsync_file(checkpoint.sidecar)
        _fsync_dir(self.directory)
        self._flushed.add(checkpoint.sequence)

    def _remove_orphans(self) -> None:
        """Removes model files whose sidecar never landed (a killed save), and
        sidecars whose model file is missing or short (a crash)."""
        committed = {c.path.name for c in self.list()}  # as now on disk, whoever wrote them
        for name in os.listdir(self.directory):
            if name.startswith("ckpt-") and name.endswith(".keras"):
                orphan = name not in committed
            else:
                orphan = bool(_NAME.match(name)) and name[: -len(".json")] + ".keras" not in committed
            if orphan:
                (self.directory / name).unlink(missing_ok=True)

    def _remove_partials(self) -> None:
        """Removes staging folders left by processes that died mid-save."""
        for name in os.listdir(self.directory):
            if not name.startswith(_PARTIAL_PREFIX):
                continue
            pid_text = name[len(_PARTIAL_PREFIX):].split("-", 1)[0]
            if pid_text.isdigit() and process_alive(int(pid_text)) and int(pid_text) != os.getpid():
                continue  # another live process is saving here
            shutil.rmtree(self.directory / name, ignore_errors=True)


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
    except Exception as error:  # Keras raises ValueError, OSError, ...
        raise CheckpointError(
            f"Could not load {checkpoint.path} into model {model.name!r}: {error}"
        ) from error


def _plain_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    plain = {}
    for key, value in metrics.items():
        try:
            plain[str(key)] = float(value)
        except (TypeError, ValueError):
            continue  # a non-scalar log entry: not a metric to record
    return plain


def _remove_staging(folder: Path) -> None:
    """Removes a staging folder: empty after a save, so rmdir is enough then."""
    try:
        os.rmdir(folder)
    except OSError:  # not empty: the save failed half-way
        shutil.rmtree(folder, ignore_errors=True)


def _has_size(path: Path, size: Any) -> bool:
    """True if `path` is a file of `size` bytes (any size if `size` is None)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (size is None or st.st_size == size)


def _json_text(info: Mapping[str, Any]) -> str:
    return json.dumps(info, indent=1, sort_keys=True)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
