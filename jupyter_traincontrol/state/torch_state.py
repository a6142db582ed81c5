"""PyTorch state as a checkpoint holds it: objects with ``state_dict`` / ``load_state_dict``.

`TorchState` is what the boundary layer handles for a custom PyTorch loop
(``TrainLoop(state={"model": net, "optimizer": opt, "scheduler": sched})``):
a checkpoint is one ``.pt`` file, ``torch.save`` of ``{name: state_dict}``,
loaded back with ``torch.load(..., weights_only=True)`` (tensors and plain
containers only: no code runs at load) and each object's
``load_state_dict``. A snapshot copies every tensor at the boundary, one
on a CUDA device there and others to host memory (the background writer
then brings them to the host and writes the file while training goes on);
no checkpoint holding a NaN or an infinity is written or loaded.

torch is imported lazily.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping

from ..checkpoint import Checkpoint, CheckpointError, NonFiniteStateError
from .frozen import torch_on_host

__all__ = ["TorchState", "check_torch_state"]


def check_torch_state(state: Any) -> dict[str, Any]:
    """Checks ``state=``: a dict of names to objects with ``state_dict()``
    and ``load_state_dict()``. Returns a copy.

    Raises:
        ValueError: Saying which entry is not such an object.
    """
    if not isinstance(state, Mapping) or not state:
        raise ValueError(f"state must be a non-empty dict of names to objects with state_dict() and "
                         f"load_state_dict() (a module, an optimizer, a scheduler), got {type(state).__name__}.")
    for name, value in state.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"state's names must be non-empty strings, got {name!r}.")
        if not (callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))):
            raise ValueError(f"state[{name!r}] is a {type(value).__name__}; expected an object with state_dict() and "
                             "load_state_dict() (a torch.nn.Module, an optimizer, a scheduler, a GradScaler).")
    return dict(state)


def _tensors(value: Any):
    """Every tensor inside a state dict (nested dicts, lists, tuples)."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _each_tensor(value: Any, change: Callable[[Any], Any]) -> Any:
    """A copy of a state dict with `change` made of every tensor (nested
    dicts, lists, tuples); other values deep-copied."""
    import torch

    if isinstance(value, torch.Tensor):
        return change(value.detach())
    if isinstance(value, Mapping):
        return {key: _each_tensor(item, change) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_each_tensor(item, change) for item in value)
    return copy.deepcopy(value)


def _on_host(value: Any) -> Any:
    """A state dict with every tensor copied to host memory."""
    return _each_tensor(value, lambda tensor: tensor.to("cpu", copy=True))


def _kept(tensor: Any) -> Any:
    """A tensor's value now, which later steps do not change: on a CUDA
    device a copy there (queued: the training thread does not wait for
    it), else a host copy."""
    return tensor.clone() if tensor.is_cuda else tensor.to("cpu", copy=True)


def _non_finite(states: Mapping[str, Any]) -> list[str]:
    import torch

    return [name for name, state in states.items()
            if any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in _tensors(state))]


class _StateDicts:
    """State dicts to write as one ``.pt`` file (``save(path)``, as a model's)."""

    suffix = ".pt"

    def __init__(self, states: dict[str, Any]):
        self.states = states

    def save(self, path) -> None:
        """Writes the ``.pt`` file; a tensor kept on a device comes to the
        host first (on the caller's thread: the writer's)."""
        import torch

        states = self.states
        if any(tensor.is_cuda for tensor in _tensors(states)):
            states = _each_tensor(states, torch_on_host)
        bad = _non_finite(states)
        if bad:
            raise NonFiniteStateError(bad)
        torch.save(states, path)

    def release(self) -> None:
        self.states = {}


class TorchState:
    """The state of a custom PyTorch loop, for checkpoints.

    Args:
        objects: Names to objects with ``state_dict``/``load_state_dict``.
        step: Returns the loop's step count (its own: PyTorch optimizers keep none).
    """

    suffix = ".pt"
    #: The boundary may copy it and write it in the background.
    snapshots = True

    def __init__(self, objects: Mapping[str, Any], step: Callable[[], int | None]):
        self.objects = check_torch_state(objects)
        self._step = step

    def sync(self) -> None:
        """Nothing to sync: PyTorch state lives in the objects."""

    def step(self) -> int | None:
        return self._step()

    def step_later(self, snapshot: Any = None) -> Callable[[], int | None]:
        """`step` now: the loop counts it in Python (`snapshot` is not needed)."""
        step = self.step()
        return lambda: step

    def snapshot(self, buffers: Any = None) -> _StateDicts:
        """A copy of every state dict: a tensor on a CUDA device copied there
        (queued), others to the host (the training thread holds for those)."""
        return _StateDicts({name: _each_tensor(obj.state_dict(), _kept) for name, obj in self.objects.items()})

    def views(self) -> _StateDicts:
        """The live state dicts, for a write the training thread waits for."""
        return _StateDicts({name: obj.state_dict() for name, obj in self.objects.items()})

    def live(self) -> _StateDicts:
        return self.views()

    def all_finite(self) -> bool:
        return not _non_finite({name: obj.state_dict() for name, obj in self.objects.items()})

    def restore(self, checkpoint: Checkpoint) -> None:
        """Loads `checkpoint` into every object; on failure all are as they were.

        Raises:
            CheckpointError: If the file does not load, lacks one of the
                objects, or holds values that are not finite.
        """
        import torch

        try:
            saved = torch.load(checkpoint.path, weights_only=True, map_location="cpu")
        except Exception as error:  # pickle errors, a short file, ...
            raise CheckpointError(f"Could not load {checkpoint.path}: {error}") from error
        missing = sorted(set(self.objects) - set(saved)) if isinstance(saved, dict) else sorted(self.objects)
        if missing:
            raise CheckpointError(f"{checkpoint.path.name} holds no state for {', '.join(missing)}.")
        bad = _non_finite(saved)
        if bad:
            raise CheckpointError(f"{checkpoint.path.name} holds values that are not all finite ({', '.join(bad)})")
        before = {name: _on_host(obj.state_dict()) for name, obj in self.objects.items()}
        try:
            for name, obj in self.objects.items():
                obj.load_state_dict(saved[name])
        except Exception as error:
            for name, obj in self.objects.items():
                obj.load_state_dict(before[name])
            raise CheckpointError(f"Could not load {checkpoint.path.name} into {name!r}: {error}") from error
