"""A Keras model's training state, as the boundary layer handles it: `KerasState`.

What the boundary layer does to the state being trained (sync it, take its
step count, copy it to the host, read it in place, check it is finite,
restore a checkpoint into it) is one small object per model, so the same
saves, rollbacks and NaN checks serve a `fit` and a custom loop over a
Keras model. The functions under it are the one home of what touches a
model's variables between two batches:

- `sync_model_state`: on the JAX backend `fit` keeps the state outside the
  model's variables in the middle of an epoch; this brings them up to date
  (a no-op elsewhere, and when already done since the last step). The
  boundary layer calls it once, where commands are taken.
- `optimizer_step`: ``optimizer.iterations`` as an int.
- `restore_weights`: loading a checkpoint into a model, with the optimizer
  built first (Keras silently drops optimizer state loaded into an
  optimizer that is not built).
- `copy_variables`, `assign_variables`: a backup of every variable, and
  putting it back (after a failed load).
- `all_finite`, `non_finite_variables`: whether every weight (and
  optimizer variable) is a finite number; no checkpoint of bad weights is
  ever written or loaded.

Keras and numpy are imported lazily, inside the functions.
"""

from __future__ import annotations

from typing import Any, Callable

from ..checkpoint import Checkpoint, CheckpointError, NonFiniteStateError
from .frozen import Late, copies_in_place, is_finite
from .snapshot import ModelSnapshot, SnapshotBuffers, SnapshotLayout

__all__ = ["KerasState", "sync_model_state", "optimizer_step", "restore_weights", "copy_variables",
           "assign_variables", "all_finite", "non_finite_variables"]


class KerasState:
    """The training state of one Keras model: weights and optimizer variables.

    Keeps the model's save walk (`SnapshotLayout`) from its first snapshot
    on, for the later ones (one `KerasState` per `fit`).

    Args:
        model: The model being trained (with its optimizer, if compiled).
        count: The step count of a model without an optimizer (a custom
            loop's own). Defaults to None.
    """

    suffix = ".keras"
    #: The boundary may copy it (`snapshot`) and write it in the background.
    snapshots = True

    def __init__(self, model, count: "Callable[[], int | None] | None" = None):
        self.model = model
        self._count = count
        self._layout: SnapshotLayout | None = None

    def sync(self) -> None:
        """Brings the variables up to date (JAX keeps them in the trainer during `fit`)."""
        sync = getattr(self.model, "jax_state_sync", None)
        if callable(sync):
            sync()

    def step(self) -> int | None:
        """``optimizer.iterations``; without an optimizer, the loop's own count (or None)."""
        step = optimizer_step(self.model)
        return step if step is not None or self._count is None else self._count()

    def step_later(self, snapshot: ModelSnapshot | None = None) -> Callable[[], int | None]:
        """`step` as of now, brought to the host when called: the training
        thread only freezes ``optimizer.iterations`` (`frozen.Late`), or
        takes its value from `snapshot`, just taken (no second read)."""
        iterations = getattr(getattr(self.model, "optimizer", None), "iterations", None)
        if iterations is None:
            step = self.step()
            return lambda: step
        return (snapshot.late if snapshot is not None else Late)(iterations, int).value

    def snapshot(self, buffers: SnapshotBuffers | None) -> ModelSnapshot:
        """What ``model.save`` writes, as of now, kept while training goes
        on: without a copy on TensorFlow and JAX (`frozen.freeze`), else a
        host copy into `buffers`' arrays."""
        return self._take(buffers if copies_in_place() else None, copy=True)

    def _take(self, buffers: SnapshotBuffers | None, copy: bool) -> ModelSnapshot:
        """`ModelSnapshot.take`, its walk kept for the next one if it may be reused."""
        snapshot = ModelSnapshot.take(self.model, buffers, copy=copy, layout=self._layout)
        if snapshot.layout.reusable:
            self._layout = snapshot.layout
        return snapshot

    def live(self):
        """The model itself, written with ``model.save`` on the training
        thread, unless a variable is not finite (then nothing is written)."""
        return _FiniteOnly(self.model)

    def views(self) -> Any:
        """What the writer writes while the training thread waits: views of
        the variables (`ModelSnapshot` without a copy; its writer skips two
        copies ``model.save`` makes), or the model itself if they cannot be
        taken (``model.save`` then says what is wrong)."""
        try:
            return self._take(None, copy=False)
        except Exception:  # noqa: BLE001 - model.save then says what is wrong, as before
            return _FiniteOnly(self.model)

    def all_finite(self) -> bool:
        """True if every weight is a finite number."""
        return all_finite(self.model)

    def restore(self, checkpoint: Checkpoint) -> None:
        """Loads weights and optimizer state of `checkpoint` and starts the
        running metrics over; on failure the model is as it was.

        Raises:
            CheckpointError: If the checkpoint does not load into this
                model, or holds weights that are not all finite.
        """
        saved = copy_variables(self.model)
        try:
            restore_weights(self.model, checkpoint)
            bad = non_finite_variables(self.model)
            if bad:
                raise CheckpointError(f"{checkpoint.path.name} holds weights that are not all finite ({', '.join(bad[:3])})")
        except CheckpointError:
            assign_variables(saved)
            raise
        self.model.reset_metrics()  # the epoch's running loss restarts here, not from the batches undone


def sync_model_state(model) -> None:
    """Brings the model's variables up to date before they are read or written.

    On the JAX backend, `fit` keeps the state outside the model's variables
    in the middle of an epoch (``Callback.model`` syncs it, a model
    reference held elsewhere does not): a save from that reference would
    write the weights of the epoch's start. After a sync, the trainer takes
    its state from the variables again. Does nothing on other backends.
    """
    sync = getattr(model, "jax_state_sync", None)
    if callable(sync):
        sync()


def optimizer_step(model) -> int | None:
    """The optimizer's step count (``optimizer.iterations``), or None without one."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return None
    iterations = optimizer.iterations
    try:
        return int(iterations.value)  # 2-34 us; convert_to_numpy takes 14-131 us
    except (TypeError, ValueError, AttributeError):
        import keras

        return int(keras.ops.convert_to_numpy(iterations))


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


def all_finite(model) -> bool:
    """True if every weight of `model` is a finite number (its state up to date)."""
    import numpy as np

    return all(np.isfinite(np.asarray(variable)).all() for variable in model.weights)


def non_finite_variables(model) -> list[str]:
    """The paths of `model`'s weights and optimizer variables that hold a
    NaN or an infinity (its state up to date), in order; empty if none."""
    import numpy as np

    optimizer = getattr(model, "optimizer", None)
    variables = list(model.weights) + (list(optimizer.variables) if optimizer is not None and optimizer.built else [])
    return [variable.path for variable in variables if not is_finite(np.asarray(variable))]


class _FiniteOnly:
    """A model whose ``save`` writes nothing unless every variable is finite."""

    def __init__(self, model):
        self.model = model

    def save(self, path) -> None:
        bad = non_finite_variables(self.model)
        if bad:
            raise NonFiniteStateError(bad)
        self.model.save(path)
