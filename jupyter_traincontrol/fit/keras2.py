"""Keras 2 (``tf_keras``): what its `fit` needs of `ControlCallback`, and what it cannot do.

`ControlCallback` is a Keras 3 callback. The `fit` of ``tf_keras`` (``import
tf_keras``, or ``tf.keras`` with ``TF_USE_LEGACY_KERAS=1``) takes it as
well, with what this module adds:

- `Keras2Hooks`: what ``tf_keras``'s ``CallbackList`` asks of each callback
  besides its hooks: which batch hooks it implements, whether it takes the
  batch's logs as tensors (it does not: ``tf_keras`` converts them to
  numbers for it, once per batch, as for any callback not written for
  tensors; the NaN check reads the loss as a number) and whether only a
  chief worker runs it.
- `NOTICE`: what Keras 2 cannot do that Keras 3 can, said in one line as
  each `fit` starts (`announce`): the run's log (a warning) and the
  callback's verbose line.
- `resume_from_latest`: ``resume=True`` for a ``tf_keras`` model. The
  newest checkpoint that loads gives the weights and the optimizer's state
  (``iterations`` included); `fit` starts at its epoch through the hook
  ``tf_keras``'s `fit` asks right after ``on_train_begin`` (the one its
  ``BackupAndRestore`` uses), and a checkpoint taken in the middle of an
  epoch has the batches it already trained drawn and not trained
  (`batch_skipper.BatchSkipper`: ``tf_keras``'s train function takes the
  data iterator as Keras 3's does on TensorFlow). What Keras 3 restores
  besides (the data's own order, the random state) is not: the resumed
  epoch's remaining batches come in whatever order the data gives them
  now, and the resume says so.

Checkpoints are ``tf_keras``'s own ``.keras`` files, written by
``model.save`` on the training thread (`state.Keras2State`).

Example:

>>> import tf_keras                                                    # doctest: +SKIP
>>> model.fit(x, y, epochs=5, callbacks=[ControlCallback(name="k2")])  # doctest: +SKIP
[traincontrol] Keras 2 (tf_keras) cannot save in the background or restore the data order and random state: ...
"""

from __future__ import annotations

from typing import Callable

import keras

from ..checkpoint import Checkpoint, CheckpointStore, SkippedCheckpoint, skipping_words
from ..state import Keras2State
from .resume.batch_skipper import BatchSkipper
from .resume.resumption import nothing_loaded

__all__ = ["Keras2Hooks", "Keras2Resumption", "NOTICE", "announce", "resume_from_latest"]

#: What Keras 2 cannot do that Keras 3 can, said once as each `fit` starts.
NOTICE = ("Keras 2 (tf_keras) cannot save in the background or restore the data order and random state: "
          "checkpoints are written on the training thread, and a resume continues at the checkpoint's epoch "
          "and batch with the data in its current order.")

_TRAIN_BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")
_TEST_BATCH_HOOKS = ("on_test_batch_begin", "on_test_batch_end")
_PREDICT_BATCH_HOOKS = ("on_predict_batch_begin", "on_predict_batch_end")


class Keras2Hooks:
    """What ``tf_keras``'s ``CallbackList`` asks of a callback, for a Keras 3 one.

    A mixin in front of ``keras.callbacks.Callback``: ``tf_keras`` calls only
    the batch hooks a callback overrides, hands tensors only to callbacks
    that say they take them, and runs on every worker a callback that is not
    marked chief-only.
    """

    #: The batch's logs arrive as numbers, converted by ``tf_keras``.
    _supports_tf_logs = False
    #: Every worker runs it (tf_keras's multi-worker training).
    _chief_worker_only = None

    def _implements_train_batch_hooks(self) -> bool:
        return _overrides(self, _TRAIN_BATCH_HOOKS)

    def _implements_test_batch_hooks(self) -> bool:
        return _overrides(self, _TEST_BATCH_HOOKS)

    def _implements_predict_batch_hooks(self) -> bool:
        return _overrides(self, _PREDICT_BATCH_HOOKS)


def _overrides(callback, hooks: tuple[str, ...]) -> bool:
    """True if `callback`'s class overrides one of Keras's `hooks`."""
    base = keras.callbacks.Callback
    return any(getattr(type(callback), hook, None) is not getattr(base, hook, None) for hook in hooks)


def announce(journal) -> None:
    """Says `NOTICE` once: a warning in the run's log, which reaches stderr
    through `logging` (a verbose line too would print it twice)."""
    journal.log("warning", NOTICE)


class _StartAt:
    """What ``tf_keras``'s `fit` asks, after ``on_train_begin``, for the epoch
    and batch to start at (``model._training_state``, as ``BackupAndRestore``
    sets it). The batch is always 0: ``tf_keras`` would count a later one as
    trained without drawing its data, so batches are skipped by drawing them."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch, mode=None):
        return self.epoch, 0


class Keras2Resumption:
    """What a resume changed in a ``tf_keras`` model, and the sentence that
    tells it (the same face as `resume.resumption.Resumption`).

    Attributes:
        epoch: The zero-based epoch `fit` continues in.
        message: One line for the run's log.
        resumed: True if a checkpoint was loaded.
        checkpoint: The checkpoint loaded, or None.
        differences: Sentences saying what will differ from an
            uninterrupted run (said in the run's log as warnings).
        others: Always empty: a Keras 2 resume names no other runs.
    """

    def __init__(self, model, *, epoch: int = 0, message: str, resumed: bool, checkpoint: Checkpoint | None = None):
        self._model = model
        self.epoch = epoch
        self.message = message
        self.resumed = resumed
        self.checkpoint = checkpoint
        self.differences: list[str] = []
        self.others: list[str] = []
        self._skipper: BatchSkipper | None = None
        self._previous_state: tuple | None = None  # the model's ``_training_state`` before, while ours is set

    @property
    def skipping(self) -> bool:
        """True while the batches the checkpoint already trained are being drawn."""
        return self._skipper is not None and self._skipper.active

    def start_at(self, epoch: int) -> None:
        """Makes the next `fit` of the model start at `epoch` (call it in ``on_train_begin``)."""
        if self._previous_state is None:
            self._previous_state = (getattr(self._model, "_training_state", None),)
        object.__setattr__(self._model, "_training_state", _StartAt(epoch))  # not a tracked attribute

    def skip(self, batches: int, logs: dict, on_done: Callable[[], None] | None) -> None:
        """Draws the first `batches` batches of the resumed epoch without training them."""
        self._skipper = BatchSkipper(self._model, batches, logs, "tensorflow", on_done=on_done)
        self._skipper.install()

    def undo(self) -> None:
        """Puts back the model's train function and start hook. Idempotent."""
        if self._skipper is not None:
            self._skipper.uninstall()
            self._skipper = None
        if self._previous_state is not None:
            object.__setattr__(self._model, "_training_state", self._previous_state[0])
            self._previous_state = None


def resume_from_latest(model, store: CheckpointStore, on_skip: Callable[[SkippedCheckpoint], None] | None = None,
                       data_order=None, on_skipped: Callable[[], None] | None = None) -> Keras2Resumption:
    """Loads the newest checkpoint of `store` that loads into the ``tf_keras``
    `model`, and positions its `fit` there (call it from ``on_train_begin``).

    Args:
        model: The ``tf_keras`` model being trained, compiled.
        store: The run's checkpoints.
        on_skip: Called for each newer checkpoint that did not load, with
            which and why.
        data_order: Unused: the data order of a ``tf_keras`` `fit` is not
            restored. Accepted for the same call as Keras 3's resume.
        on_skipped: Called once the batches already trained have all been
            drawn (at once if there are none to skip).

    Returns:
        The `Keras2Resumption` (with nothing changed if no checkpoint loads).
    """
    restored = store.restore_latest(Keras2State(model).restore, on_skip=on_skip)
    latest = restored.checkpoint
    if latest is None:
        return Keras2Resumption(model, message=nothing_loaded(store, restored), resumed=False)
    position = latest.position
    resumption = Keras2Resumption(model, epoch=position.resume_epoch, message="", resumed=True, checkpoint=latest)
    resumption.start_at(position.resume_epoch)
    skipped = ""
    if position.resume_step:
        resumption.skip(position.resume_step, latest.info.get("metrics") or {}, on_skipped)
        skipped = skipping_words(position.resume_step, "batch")
    elif on_skipped is not None:
        on_skipped()
    resumption.message = (
        f"Resumed from {latest.path}: epoch {position.resume_epoch + 1}{skipped}; "
        f"optimizer step {Keras2State(model).step()}. Not exact: Keras 2 (tf_keras) cannot restore the "
        "data order or the random state."
    )
    return resumption
