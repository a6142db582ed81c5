"""Resuming a run from its latest checkpoint, in the epoch and at the batch it left.

`resume_from_latest` loads the newest checkpoint of a store into the model
(weights and optimizer state), makes `fit` start at the checkpoint's epoch,
and, for a checkpoint taken in the middle of an epoch, skips the batches
already trained (`batch_skipper.BatchSkipper`). What it changes in the
model is undone by `Resumption.undo` when `fit` ends. With no checkpoint
of its own name, it says so, naming the other runs whose checkpoints the
folder holds and how to resume from one; `resume_from_source` does that
(``resume_from=``: another run's newest checkpoint that loads, or a file).

Before that, the resume rebuilds the epoch's data order: the data's own
state is replayed (`data_order.DataOrder`: iterators of a `tf.data`
pipeline, a `PyDataset`'s epoch hooks), then the global random state as of
the epoch's start is put back (`random_state`), and, for a checkpoint taken
right after an epoch's last batch, what Keras does before the next epoch is
replayed. A seeded run so continues with the same batches in the same order
as an uninterrupted one.

One resume serves both kinds of `fit`; a `FitKind` says what differs:
Keras 3's (`KERAS3`) and Keras 2's (``tf_keras``: `keras2.KERAS2`, which
loads through its own state, starts `fit` through another hook and
restores neither the data order nor the random state).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ...checkpoint import Checkpoint, CheckpointError, CheckpointStore, SkippedCheckpoint, skipping_words
from ...state import KerasState
from ...state import keras_internals, random_state
from .batch_skipper import BatchSkipper, can_skip_batches
from .data_order import DataOrder
from .sources import ResumeSource, ResumeSourceError, describe_others

__all__ = ["FitKind", "KERAS3", "Resumption", "resume_from_latest", "resume_from_source"]


@dataclasses.dataclass(frozen=True)
class FitKind:
    """What differs in resuming one kind of `fit` (Keras 3's, Keras 2's).

    Attributes:
        state: Makes the model's state adapter (``restore``, ``step``):
            `state.KerasState`, `state.Keras2State`.
        start_at: Makes the model's next `fit` start at an epoch (call it
            in ``on_train_begin``); returns what puts the model back.
        backend: The backend whose train function skips batches.
        not_exact: None if the data order and the random state are
            restored; else the sentence saying why they are not.
        resumes_others: Whether another run's checkpoints can be resumed
            from (a resume that found none of its own then names them).
    """

    state: Callable[[Any], Any]
    start_at: Callable[[Any, int], Callable[[], None]]
    backend: Callable[[], str]
    not_exact: str | None = None
    resumes_others: bool = True


def _keras_backend() -> str:
    import keras

    return keras.backend.backend()


#: Keras 3's `fit`: the data order and the random state restored too.
KERAS3 = FitKind(state=KerasState, start_at=keras_internals.start_fit_at_epoch, backend=_keras_backend)


class Resumption:
    """What a resume changed in a model, and the sentence that tells it.

    Attributes:
        epoch: The zero-based epoch `fit` continues in.
        message: One line for the run's log (where it resumed, or that
            there was nothing to resume from).
        resumed: True if a checkpoint was loaded.
        checkpoint: The checkpoint loaded, or None.
        differences: Sentences saying what will differ from an
            uninterrupted run because a data source's position cannot be
            restored (a Python generator, an unseeded shuffle); empty if
            none.
        others: The other runs whose checkpoints the folder holds, when
            none of this run's was found (the message names them).
    """

    def __init__(self, *, epoch: int = 0, message: str, resumed: bool):
        self.epoch = epoch
        self.message = message
        self.resumed = resumed
        self.others: list[str] = []
        self.checkpoint = None
        self.differences: list[str] = []
        self._put_back: Callable[[], None] | None = None  # the model's start epoch, as it was
        self._skipper: BatchSkipper | None = None

    @property
    def skipping(self) -> bool:
        """True while the batches the checkpoint already trained are being drawn."""
        return self._skipper is not None and self._skipper.active

    def undo(self) -> None:
        """Puts back the model's train function and start epoch. Idempotent."""
        if self._skipper is not None:
            self._skipper.uninstall()
            self._skipper = None
        if self._put_back is not None:
            self._put_back()
            self._put_back = None


def resume_from_latest(
    model, store: CheckpointStore, on_skip: Callable[[SkippedCheckpoint], None] | None = None,
    data_order: DataOrder | None = None, on_skipped: Callable[[], None] | None = None, kind: FitKind = KERAS3,
) -> Resumption:
    """Loads the newest checkpoint of `store` that loads into `model`, and
    positions `fit` there.

    Call it from ``on_train_begin``; the returned `Resumption` puts back
    what it changed in the model (`Resumption.undo`).

    Args:
        model: The model being trained, built and compiled.
        store: The run's checkpoints.
        on_skip: Called for each newer checkpoint that did not load, with
            which and why.
        data_order: The fit's `DataOrder`, counting already: its counts in
            the checkpoint are replayed (tf.data iterators, a PyDataset's
            epoch hooks) before the first epoch. None: the data's own
            state is not restored (and the resume says so).
        on_skipped: Called once the batches already trained have all been
            drawn (not called if there are none to skip).
        kind: The kind of `fit` (Keras 3's, or `keras2.KERAS2`).

    Returns:
        The `Resumption` (with nothing changed if no checkpoint loads).
    """
    restored = store.restore_latest(kind.state(model).restore, on_skip=on_skip)
    latest = restored.checkpoint
    if latest is None:
        nothing = Resumption(message=_nothing_loaded(store, restored), resumed=False)
        if not kind.resumes_others:
            return nothing
        others = store.scan()
        nothing.others = sorted({checkpoint.run for checkpoint in others.checkpoints} - {store.run})
        if nothing.others:
            example = nothing.others[-1]
            nothing.message = (
                f"No checkpoint of run {store.run!r} in {store.directory} {_found(restored)}: starting from scratch. The folder "
                f"holds {describe_others(others, but=store.run)}; to continue from one, resume from it: "
                f"ControlCallback(resume_from={example!r}) or %%interruptible_fit --resume-from {example}."
            )
        return nothing
    return _continue_at(model, latest, store.directory.name, data_order, on_skipped, kind)


def _nothing_loaded(store: CheckpointStore, restored) -> str:
    """The sentence of a resume that loaded nothing from `store` (`restored`:
    its `restore_latest`, with the checkpoints it skipped)."""
    return f"No checkpoint in {store.directory} {_found(restored)}: starting from scratch."


def _found(restored) -> str:
    return f"loads ({len(restored.skipped)} skipped)" if restored.skipped else "yet"


def resume_from_source(
    model, source: ResumeSource, on_skip: Callable[[SkippedCheckpoint], None] | None = None,
    data_order: DataOrder | None = None, on_skipped: Callable[[], None] | None = None,
) -> Resumption:
    """Loads the newest checkpoint of `source` (another run's, or one file)
    that loads into `model`, and positions `fit` there, as
    `resume_from_latest` does.

    Raises:
        ResumeSourceError: If none of them loads; the message says why.
    """
    load = KerasState(model).restore
    tried = []
    for checkpoint in reversed(source.checkpoints):
        try:
            load(checkpoint)
        except CheckpointError as error:
            tried.append(f"{checkpoint.path.name}: {error}")
            if on_skip is not None:
                on_skip(SkippedCheckpoint(checkpoint.path, str(error)))
            continue
        resumption = _continue_at(model, checkpoint, source.directory.name, data_order, on_skipped)
        resumption.message = resumption.message.replace("Resumed from ", f"Resumed from run {source.run!r}'s ", 1)
        return resumption
    raise ResumeSourceError(f"Cannot resume from run {source.run!r}: none of its checkpoints in {source.directory} "
                            f"loads ({'; '.join(tried)}).")


def _continue_at(model, latest: Checkpoint, folder_name: str, data_order: DataOrder | None,
                 on_skipped: Callable[[], None] | None = None, kind: FitKind = KERAS3) -> Resumption:
    """Positions `fit` at loaded checkpoint `latest`: its epoch, its batch, and
    (`kind` allowing) its random state and data order."""
    position = latest.position
    resumption = Resumption(epoch=position.resume_epoch, message="", resumed=True)
    resumption.checkpoint = latest
    resumption._put_back = kind.start_at(model, position.resume_epoch)
    saved = latest.info.get("resume_state")
    skipped = ""
    if position.resume_step:
        backend = kind.backend()
        if can_skip_batches(backend):
            def all_drawn():
                random_state.restore_now(saved)
                if on_skipped is not None:
                    on_skipped()

            resumption._skipper = BatchSkipper(model, position.resume_step, latest.info.get("metrics") or {}, backend,
                                               on_done=all_drawn)
            resumption._skipper.install()
            skipped = skipping_words(position.resume_step, "batch")
        else:
            skipped = f"; backend {backend!r} repeats its first {position.resume_step} batches"
    if kind.not_exact is not None:
        inexact = [kind.not_exact]
    else:
        inexact = [reason for reason in _restore_random_and_data(model, saved, position.resume_epoch, data_order)
                   if reason]
        if data_order is not None:
            resumption.differences = [f"Resume of {folder_name!r} is not exact: {limit}."
                                      for limit in data_order.limitations()]
    resumption.message = (
        f"Resumed from {latest.path}: epoch {position.resume_epoch + 1}{skipped}; "
        f"optimizer step {kind.state(model).step()}"
        + (f". Not exact: {'; '.join(inexact)}." if inexact else "; random state and data order restored.")
    )
    return resumption


def _restore_random_and_data(model, saved: Any, epoch: int, data_order: DataOrder | None) -> list[str | None]:
    """Puts back what orders the resumed epoch's data, in the order the
    uninterrupted run reached it: the data sources' own state first (a
    PyDataset's hooks may draw from the global state, which is then set),
    the global random state as of the epoch's start, and, for a checkpoint
    right after an epoch's last batch, what Keras does before the next
    epoch (it draws from the global state too: torch's data loader)."""
    data = saved.get("data") if isinstance(saved, dict) else None
    reasons: list[str | None] = []
    if data_order is None:
        reasons.append("the training data was not found in the running fit: its own order is not restored")
    elif data is not None or isinstance(saved, dict) and saved.get("version") == random_state.RESUME_STATE_VERSION:
        reasons.append(data_order.replay(data))
    reasons.append(random_state.restore(model, saved, epoch))
    if data_order is not None and isinstance(data, dict):
        if data.get("tail") is True:
            data_order.replay_epoch_end()
        data_order.replay_loader_draws(data)
    return reasons
