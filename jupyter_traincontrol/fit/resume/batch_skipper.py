"""Skipping the batches a resumed epoch already trained: `BatchSkipper`.

Keras restarts every epoch at its first batch. After a resume from a
checkpoint taken in the middle of epoch E at batch K, `BatchSkipper` makes
the first K batches of E pass without training: it swaps
``model.train_function`` for one that only draws the batches from the data
iterator, then puts the real one back. So the optimizer sees exactly the
batches it had not seen, instead of skipping the rest of the epoch or
repeating its start.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

__all__ = ["BatchSkipper", "can_skip_batches", "rebuild_train_function"]


_SUPPORTED_BACKENDS = ("tensorflow", "torch", "jax")


def can_skip_batches(backend: str) -> bool:
    """True if `BatchSkipper` knows how `backend`'s train function draws data."""
    return backend in _SUPPORTED_BACKENDS


class BatchSkipper:
    """Swaps in a train function that skips the next `batches` batches.

    Args:
        model: The Keras model, after `make_train_function` (that is, in
            `on_train_begin` or later).
        batches: Batches to skip.
        logs: The logs to report for skipped batches (the checkpoint's
            metrics).
        backend: The Keras backend name.
        on_done: Called once the last batch to skip was drawn, before the
            first batch that trains.
    """

    def __init__(self, model, batches: int, logs: Mapping[str, Any], backend: str,
                 on_done: Callable[[], None] | None = None):
        if not can_skip_batches(backend):
            raise ValueError(f"Cannot skip batches on backend {backend!r}; expected one of {_SUPPORTED_BACKENDS}.")
        self._model = model
        self._per_call = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
        self._calls_left = math.ceil(batches / self._per_call)
        self._logs = dict(logs)
        self._backend = backend
        self._original = None
        self._on_done = on_done

    @property
    def active(self) -> bool:
        """True while batches remain to be skipped."""
        return self._original is not None

    def install(self) -> None:
        """Replaces the model's train function (if there is anything to skip)."""
        if self._calls_left <= 0 or self._original is not None:
            return
        self._original = self._model.train_function
        self._model.train_function = self._skip

    def wrap(self, train_function) -> None:
        """Makes `train_function` the one put back once the skipping ends
        (the model's was retraced meanwhile)."""
        self._original = train_function

    def uninstall(self) -> None:
        """Puts the real train function back. Idempotent."""
        if self._original is not None:
            self._model.train_function = self._original
            self._original = None

    def _skip(self, *args):
        self._calls_left -= 1
        if self._calls_left <= 0:
            self.uninstall()
            if self._on_done is not None:
                self._on_done()
        if self._backend == "tensorflow":
            (iterator,) = args
            _draw(iterator, self._per_call)
            return dict(self._logs)
        if self._backend == "jax":
            state, iterator = args
            _draw(iterator, self._per_call)
            return dict(self._logs), state
        return dict(self._logs)  # torch: the batch was drawn by the caller


def _draw(iterator, count: int) -> None:
    """Draws `count` batches; at the end of data raises as a train step would."""
    get_next = getattr(iterator, "get_next", None)
    for _ in range(count):
        if get_next is not None:  # a tf.data iterator: raises OutOfRangeError at the end
            get_next()
        else:
            next(iterator)


def rebuild_train_function(model) -> None:
    """Retraces `model`'s train function (at its next call), keeping a
    resume's batch skipper in front of it if one is installed."""
    installed = getattr(model, "train_function", None)
    skipper = getattr(installed, "__self__", None)
    model.make_train_function(force=True)
    if isinstance(skipper, BatchSkipper) and skipper.active:
        skipper.wrap(model.train_function)
        model.train_function = installed
