"""What a `TrainLoop`'s checkpoints hold, chosen from its arguments, and what ``set`` may change.

One of: ``model=`` (a Keras model, `state.KerasState`), ``state=``
(PyTorch objects, `state.TorchState`), ``save=``/``load=`` (the user's
functions, `state.CallableState`), or nothing (then ``save`` and ``stop``
answer that there is nothing to checkpoint, and the other commands work).
With ``sync=`` (state the loop keeps outside the model), `stateless`
says what ``set`` and ``rollback`` can reach.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from ..boundary.torch_tunables import TorchTunables
from ..boundary.tunables import Tunables
from ..checkpoint import Checkpoint, CheckpointError
from ..state import KerasState
from ..state.callable_state import CallableState
from ..state.torch_state import TorchState
from .stateless import ReloadingTunables, SyncedState

__all__ = ["build_state", "NoState"]


class NoState:
    """A loop that gave the tool nothing to checkpoint."""

    suffix = ".keras"
    snapshots = False
    _why = "the loop has no state to checkpoint: give TrainLoop model=, state= or save= and load="

    def __init__(self, step: Callable[[], int | None]):
        self._step = step

    def sync(self) -> None:
        pass

    def step(self) -> int | None:
        return self._step()

    def save(self, path) -> None:
        raise CheckpointError(f"Not written: {self._why}.")

    def snapshot(self, buffers: Any = None) -> "NoState":
        return self

    def views(self) -> "NoState":
        return self

    def live(self) -> "NoState":
        return self

    def all_finite(self) -> bool:
        return True

    def restore(self, checkpoint: Checkpoint) -> None:
        raise CheckpointError(f"Cannot load {checkpoint.path.name}: {self._why}.")


def _keras(model, optimizer, tunables, step):
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    if optimizer is not None and getattr(model, "optimizer", None) is not optimizer:
        if getattr(model, "compiled", False):
            raise ValueError(f"model is compiled with {type(model.optimizer).__name__}, but optimizer= is another "
                             f"{type(optimizer).__name__}; give the one that updates the model.")
        model.compile(optimizer=optimizer)  # its checkpoints then hold the optimizer's state
    return KerasState(model, count=step), Tunables(model, tunables, custom_step=True)


def _torch(state, tunables, step):
    import torch

    objects = dict(state)
    optimizers = [value for value in objects.values() if isinstance(value, torch.optim.Optimizer)]
    if len(optimizers) > 1:
        raise ValueError(f"state= holds {len(optimizers)} optimizers; set lr steers one: give the other's "
                         "learning rate through tunables=.")
    schedulers = [value for value in objects.values() if isinstance(value, torch.optim.lr_scheduler.LRScheduler)]
    return TorchState(objects, step), TorchTunables(optimizers[0] if optimizers else None, schedulers, tunables)


def build_state(*, model=None, optimizer=None, state: Mapping[str, Any] | None = None,
                save: Callable[[Path], Any] | None = None, load: Callable[[Path], Any] | None = None,
                tunables: Mapping[str, Any] | None = None, sync: Callable[[], None] | None = None,
                reload: Callable[[], None] | None = None, step: Callable[[], int | None]):
    """The checkpointed state and the tunables of a loop's arguments.

    Raises:
        ValueError: Saying which arguments clash or are missing.
    """
    given = [name for name, value in (("model", model), ("state", state), ("save", save)) if value is not None]
    if len(given) > 1:
        raise ValueError(f"TrainLoop takes one of model=, state= or save=/load=; got {' and '.join(given)}.")
    if (save is None) != (load is None):
        raise ValueError("save= and load= go together: one writes the checkpoint's folder, the other reads it back.")
    if optimizer is not None and model is None:
        raise ValueError("optimizer= is the Keras optimizer of model=; give model= too (a PyTorch optimizer goes in state=).")
    if sync is not None and not callable(sync):
        raise ValueError(f"sync= must be a function, got {type(sync).__name__}.")
    if reload is not None and (sync is None or not callable(reload)):
        raise ValueError(f"reload= goes with sync=: a function that reads the model's variables back into the state "
                         f"sync= writes; got reload={type(reload).__name__} and sync={type(sync).__name__}.")
    if model is not None:
        trained, steerable = _keras(model, optimizer, tunables, step)
    elif state is not None:
        trained, steerable = _torch(state, tunables, step)
    elif save is not None:
        trained, steerable = CallableState(save, load, step), _user_tunables(tunables)
    else:
        trained, steerable = NoState(step), _user_tunables(tunables)
    if sync is not None:
        trained = SyncedState(trained, sync, reload)
    if reload is not None:
        steerable = ReloadingTunables(steerable, reload)
    return trained, steerable


def _user_tunables(tunables: Mapping[str, Any] | None):
    """A loop without a model's optimizer: only its own tunables (Keras variables or torch tensors)."""
    values = list((tunables or {}).values())
    if values and all(callable(getattr(value, "fill_", None)) for value in values):
        return TorchTunables(None, (), tunables)
    return Tunables(None, tunables, custom_step=True)
