"""A Keras 2 (``tf_keras``) model's training state: `Keras2State`.

The boundary layer handles what it trains through one small object (see
`keras_state.KerasState`, for Keras 3). A ``tf_keras`` model differs in
what matters here:

- Its variables are TensorFlow variables, always up to date (no trainer
  holds them elsewhere): `sync` does nothing.
- There is no host snapshot of it (`ModelSnapshot` walks the model as
  Keras 3's ``model.save`` does, and ``tf_keras`` saves differently), so
  every checkpoint is ``model.save(path)`` on the training thread, between
  two batches: `snapshots` is False, and the saves are not written in the
  background.
- ``model.save("….keras")`` writes the ``.keras`` zip of ``tf_keras`` (the
  model, and the optimizer's variables, ``iterations`` included), which
  ``tf_keras.models.load_model`` opens.
- Loading the optimizer's state needs the optimizer built first: otherwise
  ``tf_keras`` skips it with a warning only, as Keras 3 does.

Nothing here imports ``tf_keras``: everything is asked of the model itself
(and numpy, lazily).

Example:

>>> state = Keras2State(model)                  # doctest: +SKIP
>>> state.live().save("ckpt/model.keras")       # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from ..checkpoint import Checkpoint, CheckpointError, NonFiniteStateError
from .frozen import is_finite

__all__ = ["Keras2State", "is_keras2_model"]


def is_keras2_model(model) -> bool:
    """True if `model` is a Keras 2 (``tf_keras``) model.

    Does not import ``tf_keras``: a model of it exists only once it is imported.
    """
    import sys

    tf_keras = sys.modules.get("tf_keras")
    model_class = getattr(tf_keras, "Model", None) if tf_keras is not None else None
    return isinstance(model_class, type) and isinstance(model, model_class)


class Keras2State:
    """The training state of one ``tf_keras`` model: weights and optimizer variables.

    Args:
        model: The compiled ``tf_keras`` model being trained.
    """

    suffix = ".keras"
    #: No host snapshot: every checkpoint is written on the training thread.
    snapshots = False

    def __init__(self, model):
        self.model = model

    def sync(self) -> None:
        """Nothing to do: a ``tf_keras`` model's variables are always current."""

    def step(self) -> int | None:
        """``optimizer.iterations`` as an int, or None without an optimizer."""
        optimizer = getattr(self.model, "optimizer", None)
        iterations = getattr(optimizer, "iterations", None)
        return None if iterations is None else int(iterations.numpy())

    def snapshot(self, buffers: Any) -> Any:
        """Not available for ``tf_keras``: checkpoints are written with `live`.

        Raises:
            CheckpointError: Always (the save scheduler writes this state on
                the training thread instead).
        """
        raise CheckpointError("a Keras 2 (tf_keras) model has no host snapshot; expected a save on the training thread")

    def views(self) -> "_FiniteKeras2Model":
        """The model itself (there are no views of a ``tf_keras`` model's variables)."""
        return self.live()

    def live(self) -> "_FiniteKeras2Model":
        """The model, written with ``model.save`` on the training thread,
        unless a variable is not finite (then nothing is written)."""
        return _FiniteKeras2Model(self.model)

    def all_finite(self) -> bool:
        """True if every weight is a finite number."""
        import numpy as np

        return all(np.isfinite(variable.numpy()).all() for variable in self.model.weights)

    def restore(self, checkpoint: Checkpoint) -> None:
        """Loads the weights and optimizer state of `checkpoint` (a ``.keras``
        file) and starts the running metrics over; on failure the model is
        as it was.

        Raises:
            CheckpointError: If the checkpoint does not load into this
                model, or holds weights that are not all finite.
        """
        model = self.model
        _build_optimizer(model)
        saved = [(variable, variable.numpy()) for variable in _variables(model)]
        try:
            try:
                model.load_weights(str(checkpoint.path))
            except Exception as error:  # tf_keras raises ValueError, OSError, zipfile errors, ...
                raise CheckpointError(f"Could not load {checkpoint.path} into model {model.name!r}: {error}") from error
            bad = _non_finite(model)
            if bad:
                raise CheckpointError(f"{checkpoint.path.name} holds weights that are not all finite ({', '.join(bad[:3])})")
        except CheckpointError:
            for variable, value in saved:
                variable.assign(value)
            raise
        model.reset_metrics()  # the epoch's running loss restarts here, not from the batches undone


def _build_optimizer(model) -> None:
    """Builds the optimizer's variables, so that a load fills them
    (``tf_keras`` skips the optimizer state of an unbuilt one)."""
    optimizer = getattr(model, "optimizer", None)
    build = getattr(optimizer, "build", None)
    if callable(build) and not getattr(optimizer, "_built", False):  # build is idempotent
        build(model.trainable_variables)


def _variables(model) -> list:
    """The model's weights, then its optimizer's variables (iterations included)."""
    optimizer = getattr(model, "optimizer", None)
    variables = getattr(optimizer, "variables", None)
    if callable(variables) and not isinstance(variables, list):  # a legacy optimizer's method
        variables = variables()
    return list(model.weights) + list(variables or [])


def _non_finite(model) -> list[str]:
    """The names of `model`'s weights and optimizer variables holding a NaN or an infinity."""
    return [variable.name for variable in _variables(model) if not is_finite(variable.numpy())]


class _FiniteKeras2Model:
    """A ``tf_keras`` model whose ``save`` writes nothing unless every variable is finite."""

    suffix = ".keras"

    def __init__(self, model):
        self.model = model

    def save(self, path) -> None:
        bad = _non_finite(self.model)
        if bad:
            raise NonFiniteStateError(bad)
        self.model.save(str(path))
