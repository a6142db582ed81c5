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
- `KERAS2`: how ``resume=True`` resumes a ``tf_keras`` model (the one
  resume, `resumption.resume_from_latest`, with this kind). The newest
  checkpoint that loads gives the weights and the optimizer's state
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

from ..state import Keras2State
from .resume.resumption import FitKind

__all__ = ["Keras2Hooks", "KERAS2", "NOTICE", "announce"]

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


def _start_at(model, epoch: int) -> Callable[[], None]:
    """Makes the next ``tf_keras`` `fit` of `model` start at `epoch`; returns what puts the hook back."""
    previous = getattr(model, "_training_state", None)
    object.__setattr__(model, "_training_state", _StartAt(epoch))  # not a tracked attribute

    def put_back() -> None:
        object.__setattr__(model, "_training_state", previous)

    return put_back


#: How a ``tf_keras`` `fit` resumes (`resumption.resume_from_latest`): its
#: own ``.keras`` files, ``tf_keras``'s start hook, TensorFlow's train
#: function skipping the batches already trained, and neither the data
#: order nor the random state restored.
KERAS2 = FitKind(state=Keras2State, start_at=_start_at, backend=lambda: "tensorflow",
                 not_exact="Keras 2 (tf_keras) cannot restore the data order or the random state",
                 resumes_others=False)
