"""What decides a `fit`'s data order besides the global random state, counted
so that a resume can rebuild it.

Two kinds of input keep their own state between epochs:

- A `tf.data` pipeline with a seeded ``shuffle`` (``reshuffle_each_iteration``
  by default) or ``Dataset.random`` draws new seeds each time an iterator of
  it is created, so the order of an epoch depends on how many iterators of
  the dataset were created before it (Keras creates one or two an epoch,
  depending on the backend). Creating an iterator draws the seeds; nothing
  else does (checked on TF 2.21: iterators created and dropped unread
  advance the order as read ones do). Random ops with an op seed in a
  ``map`` start over with each iterator.
- A `keras.utils.PyDataset` that shuffles in its own ``on_epoch_begin`` or
  ``on_epoch_end`` with its own generator.

`DataOrder` counts both while `fit` runs (from ``on_train_begin``): the
iterators created of the training dataset, and the calls of the
`PyDataset`'s epoch hooks, in order. A checkpoint keeps those counts as of the
epoch a resume continues in (`DataOrder.state`). A resumed `fit` replays them
before its first epoch (`DataOrder.replay`): it creates and drops as many
iterators, and calls the hooks in the same order, so the resumed epoch's
order is the uninterrupted run's. A checkpoint taken right after an epoch's
last batch also replays what Keras does between that batch and the next
epoch (the iterator it opens for the next epoch, the adapter's
``on_epoch_end``). On torch, every data-loader iterator Keras creates
draws a seed from the global torch generator, validation's too: a
checkpoint before the epoch's validation is over counts the validation
iterators still to come (two a validation: one to read, one opened at its
end; one once validation has begun), and a resume draws as many.

What cannot be restored is said (`DataOrder.limitations`): a plain Python
generator (its position is in the generator), a `tf.data` shuffle without
any seed, input of a kind not known here, and ``steps_per_epoch`` given
(Keras then carries an iterator from one epoch into the next).

State of version 1, in the checkpoint's ``resume_state["data"]``:
``{"version": 1, "iterators": N, "hooks": "be..." or null (too many),
"tail": bool, "loader_draws": N}``.
"""

from __future__ import annotations

import threading
from typing import Any

from ...state import keras_internals
from ...system.frames import find_caller

__all__ = ["DataOrder"]

_MAX_HOOK_CALLS = 8_000  # hook calls a sidecar keeps (4,000 epochs); more: the resume says it is inexact


class DataOrder:
    """Counts what orders a fit's training data, and replays it on resume.

    Args:
        epoch_iterator: The Keras ``EpochIterator`` of the training data
            (`find` takes it from the running `fit`).
        trainer: The model whose `fit` runs (asked whether an epoch
            validates). Defaults to None.
        validation_freq: `fit`'s ``validation_freq``, or None without
            validation data. Defaults to None.
    """

    def __init__(self, epoch_iterator, trainer=None, validation_freq=None):
        self._epoch_iterator = epoch_iterator
        self._trainer = trainer  # the model whose fit runs, and how often it validates
        self._validation_freq = validation_freq
        self._adapter = getattr(epoch_iterator, "data_adapter", None)
        self._dataset = _tf_dataset(epoch_iterator, self._adapter)
        self._py_dataset = getattr(self._adapter, "py_dataset", None)
        self.iterators = 0
        self.hooks: list[str] = []
        self._at_epoch_start: tuple[int, int] = (0, 0)
        self._undo: list = []

    @classmethod
    def find(cls) -> "DataOrder | None":
        """The `DataOrder` of the `fit` on this thread's stack, or None if
        no Keras ``fit`` frame with an ``epoch_iterator`` is found."""
        EpochIterator = keras_internals.epoch_iterator_class()
        if EpochIterator is None:  # pragma: no cover - another Keras layout
            return None
        frame = find_caller(lambda frame: frame.f_code.co_name == "fit"
                            and isinstance(frame.f_locals.get("epoch_iterator"), EpochIterator))
        if frame is None:
            return None
        found = frame.f_locals
        validates = found.get("validation_data") is not None
        return cls(found["epoch_iterator"], found.get("self"), found.get("validation_freq", 1) if validates else None)

    # Counting -----------------------------------------------------------------

    def attach(self) -> None:
        """Starts counting. `detach` undoes it."""
        if self._undo:
            return
        if self._dataset is not None:
            self._undo.append(_IteratorCounts.track(self._dataset, self._count_iterator))
        if self._py_dataset is not None:
            for name, mark in (("on_epoch_begin", "b"), ("on_epoch_end", "e")):
                self._undo.append(_wrap_hook(self._py_dataset, name, lambda mark=mark: self.hooks.append(mark)))

    def detach(self) -> None:
        """Stops counting and puts every hook back. Idempotent."""
        while self._undo:
            self._undo.pop()()

    def _count_iterator(self) -> None:
        self.iterators += 1

    def epoch_began(self) -> None:
        """Marks the counts as of the epoch beginning now (``on_epoch_begin``)."""
        self._at_epoch_start = (self.iterators, len(self.hooks))

    def state(self, *, at_epoch_start: bool, tail: bool, epoch: int, in_validation: bool = False) -> dict[str, Any]:
        """The counts a checkpoint keeps.

        Args:
            at_epoch_start: Counts as of the epoch in progress's start (the
                resume continues in it); else as of now.
            tail: The checkpoint follows an epoch's last batch: a resume
                replays what Keras does before the next epoch.
            epoch: The epoch in progress (zero-based).
            in_validation: The checkpoint is taken during its validation.
        """
        iterators, hooks = self._at_epoch_start if at_epoch_start else (self.iterators, len(self.hooks))
        tail = bool(tail) and not at_epoch_start
        draws = 0
        if not at_epoch_start and _backend() == "torch":
            if in_validation:
                draws = 1  # the iterator validation opens at its end
            elif tail and self._validates(epoch):
                draws = 2
        calls = "".join(self.hooks[:hooks]) if hooks <= _MAX_HOOK_CALLS else None
        return {"version": 1, "iterators": iterators, "hooks": calls, "tail": tail, "loader_draws": draws}

    def _validates(self, epoch: int) -> bool:
        if self._validation_freq is None:
            return False
        should_eval = getattr(self._trainer, "_should_eval", None)
        return bool(should_eval(epoch, self._validation_freq)) if should_eval is not None else True

    # Resuming -----------------------------------------------------------------

    def replay(self, state: Any) -> str | None:
        """Replays a checkpoint's counts before the first epoch of a resumed
        `fit` (from ``on_train_begin``, with counting attached).

        Returns:
            None, or one sentence saying what could not be replayed.
        """
        if not isinstance(state, dict) or state.get("version") != 1:
            return "the checkpoint does not say how far the data pipeline had gone: the data order may differ"
        iterators, hooks = state.get("iterators"), state.get("hooks")
        if hooks is None and self._py_dataset is not None:
            return (f"the PyDataset's epoch hooks were called more than {_MAX_HOOK_CALLS} times before the checkpoint "
                    "(too many to keep): its data order may differ")
        hooks = hooks or ""
        if type(iterators) is not int or iterators < 0 or not isinstance(hooks, str) or set(hooks) - {"b", "e"}:
            return "the checkpoint's data pipeline counts are malformed: the data order may differ"
        if self._dataset is not None:
            for _ in range(iterators):
                iter(self._dataset)  # draws the shuffle seeds as the dropped iterator did
        if self._py_dataset is not None:
            for mark in hooks:
                getattr(self._py_dataset, "on_epoch_begin" if mark == "b" else "on_epoch_end")()
        return None

    def replay_epoch_end(self) -> None:
        """Does what Keras does between an epoch's last batch and the next
        epoch's first: opens (and drops) the next epoch's iterator, which
        draws seeds (tf.data) or the global generator (torch's data loader),
        and calls the adapter's ``on_epoch_end``."""
        iterator = self._epoch_iterator
        batches = getattr(iterator, "_num_batches", None)
        steps = getattr(iterator, "steps_per_epoch", None)
        if batches and (steps is None or steps >= batches):
            iter(iterator._get_iterator())
        if self._adapter is not None:
            self._adapter.on_epoch_end()

    @staticmethod
    def replay_loader_draws(state: Any) -> None:
        """Draws from the global torch generator as the data-loader
        iterators of a checkpoint's ``loader_draws`` did."""
        draws = state.get("loader_draws", 0) if isinstance(state, dict) else 0
        if type(draws) is int and 0 < draws <= 16 and _backend() == "torch":
            import torch

            for _ in range(draws):  # as `torch.utils.data.DataLoader`'s iterator draws its base seed
                torch.empty((), dtype=torch.int64).random_()

    def limitations(self) -> list[str]:
        """Sentences naming the sources whose position a resume cannot
        restore, and what will differ."""
        adapter = type(self._adapter).__name__ if self._adapter is not None else "none"
        if adapter == "GeneratorDataAdapter":
            return ["the training data is a Python generator: its position cannot be restored, so the resumed "
                    "epochs take batches from wherever the new generator starts (the data order differs from an "
                    "uninterrupted run)"]
        if adapter not in ("ArrayDataAdapter", "TFDatasetAdapter", "PyDatasetAdapter"):
            return [f"the training data comes through Keras's {adapter}: its order is restored only if it is drawn "
                    "from the global random state (numpy, Python, the backend's)"]
        limits = []
        if adapter == "TFDatasetAdapter" and _unseeded_shuffles(self._dataset):
            limits.append("the training tf.data pipeline shuffles without a seed (neither `shuffle(seed=...)` nor a "
                          "global seed): the data order of the resumed epochs differs from an uninterrupted run")
        if getattr(self._epoch_iterator, "steps_per_epoch", None) is not None:
            limits.append("with `steps_per_epoch` given, Keras carries the data iterator from one epoch to the "
                          "next, which a resume does not rebuild: the data order of the resumed epochs may differ")
        return limits


def _backend() -> str:
    import keras

    return keras.backend.backend()


def _tf_dataset(epoch_iterator, adapter):
    """The tf.data dataset whose iterators Keras creates, or None."""
    try:
        import tensorflow as tf
    except ImportError:
        return None
    for candidate in (getattr(epoch_iterator, "_distributed_dataset", None), getattr(adapter, "_dataset", None)):
        if isinstance(candidate, tf.data.Dataset):
            return candidate
    return None


def _unseeded_shuffles(dataset) -> bool:
    seen, todo = set(), [dataset]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        seeds = (getattr(node, "_seed", None), getattr(node, "_seed2", None))
        if all(seed is not None for seed in seeds) and all(int(seed) == 0 for seed in seeds):
            return True
        try:
            todo.extend(node._inputs())
        except (NotImplementedError, AttributeError, TypeError):
            pass
    return False


def _wrap_hook(owner, name: str, before):
    """Makes ``owner.name()`` call `before` first; returns the undo."""
    original = getattr(owner, name)
    had_own = name in vars(owner)

    def hook(*args, **kwargs):
        before()
        return original(*args, **kwargs)

    setattr(owner, name, hook)

    def undo():
        if vars(owner).get(name) is hook:
            if had_own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)

    return undo


class _IteratorCounts:
    """Counts ``iter(dataset)`` for tracked tf.data datasets.

    Python looks ``__iter__`` up on the type, so counting means patching the
    dataset's class; the patch passes every other dataset through unchanged
    and is removed when the last tracked dataset of that class is untracked.
    """

    _lock = threading.Lock()
    _patches: dict[type, tuple[Any, bool, dict[int, list]]] = {}

    @classmethod
    def track(cls, dataset, on_iter):
        kind = type(dataset)
        with cls._lock:
            if kind not in cls._patches:
                original, had_own = kind.__iter__, "__iter__" in vars(kind)
                counters: dict[int, list] = {}

                def counted_iter(self):
                    for callback in counters.get(id(self), ()):
                        callback()
                    return original(self)

                kind.__iter__ = counted_iter
                cls._patches[kind] = (original, had_own, counters)
            counters = cls._patches[kind][2]
            counters.setdefault(id(dataset), []).append(on_iter)

        def untrack():
            with cls._lock:
                original, had_own, counters = cls._patches[kind]
                callbacks = counters.get(id(dataset), [])
                if on_iter in callbacks:
                    callbacks.remove(on_iter)
                if not callbacks:
                    counters.pop(id(dataset), None)
                if not counters:
                    del cls._patches[kind]
                    if had_own:
                        kind.__iter__ = original
                    else:
                        del kind.__iter__

        return untrack
