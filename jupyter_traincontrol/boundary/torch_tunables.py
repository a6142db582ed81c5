"""What ``set`` may change in a custom PyTorch loop: its optimizer's param groups, and the user's tensors.

A PyTorch optimizer keeps its hyperparameters per param group
(``optimizer.param_groups[i]["lr"]``): `TorchTunables` reads the first
group's value and sets every group's. ``beta_1`` and ``beta_2`` are the two
halves of Adam's ``betas``. A learning-rate scheduler (found among the
loop's ``state=`` objects) overwrites the groups' ``lr`` at its ``step()``:
``set lr`` then also sets the scheduler's base learning rate to the value
(``base_lrs``), and says so. The user's tunables are torch tensors the
model reads (``tunables={"dropout_p": p}``), filled in place. The same
interface as `tunables.Tunables`, which the steering uses.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, Mapping

from ..protocol import TUNABLE_ALIASES
from .tunables import Change, TunableError, check_tunable_name

__all__ = ["TorchTunables", "TORCH_HYPERPARAMETERS"]

#: What `set` knows of a PyTorch optimizer, where its param groups have it.
TORCH_HYPERPARAMETERS = ("learning_rate", "weight_decay", "momentum", "beta_1", "beta_2")
_GROUP_KEYS = {"learning_rate": "lr", "weight_decay": "weight_decay", "momentum": "momentum"}


def _check_user(tunables: Mapping[str, Any] | None) -> dict[str, Any]:
    checked = {}
    for name, tensor in (tunables or {}).items():
        check_tunable_name(name, TORCH_HYPERPARAMETERS)
        if not (callable(getattr(tensor, "fill_", None)) and callable(getattr(tensor, "item", None))):
            raise ValueError(f"tunables[{name!r}] is a {type(tensor).__name__}; expected a torch tensor the model reads.")
        checked[name] = tensor
    return checked


class TorchTunables:
    """What ``set`` may change in a PyTorch loop.

    Args:
        optimizer: The torch optimizer, or None.
        schedulers: Learning-rate schedulers stepping that optimizer.
        user: Names to torch tensors the model reads.
    """

    schedule_replaced = False  # a scheduler is never replaced: its base learning rate is set

    def __init__(self, optimizer=None, schedulers=(), user: Mapping[str, Any] | None = None):
        self.optimizer = optimizer
        self.schedulers = list(schedulers)
        self.user = _check_user(user)

    def names(self) -> list[str]:
        """The hyperparameters the first param group has, then the user's tunables."""
        names = []
        if self.optimizer is not None and self.optimizer.param_groups:
            group = self.optimizer.param_groups[0]
            names = [name for name in TORCH_HYPERPARAMETERS
                     if _GROUP_KEYS.get(name) in group or (name.startswith("beta_") and "betas" in group)]
        return names + sorted(self.user)

    def read(self, names: list[str] | None = None) -> dict[str, float | None]:
        return {name: self._read(name) for name in (self.names() if names is None else names)}

    def _read(self, name: str) -> float | None:
        if name in self.user:
            return float(self.user[name].item())
        group = self.optimizer.param_groups[0]
        value = group["betas"][int(name[-1]) - 1] if name.startswith("beta_") else group[_GROUP_KEYS[name]]
        return float(value)

    def describe(self) -> str:
        aliases = {canonical: alias for alias, canonical in TUNABLE_ALIASES.items()}
        names = [f"{name} ({aliases[name]})" if name in aliases else name for name in self.names()]
        return ", ".join(names) or "nothing (no optimizer was given and no tunables)"

    def check(self, changes: Mapping[str, float]) -> None:
        """Checks a whole change; raises `TunableError` saying what is wrong."""
        unknown = [name for name in changes if name not in self.names()]
        if unknown:
            raise TunableError(f"Cannot set {', '.join(unknown)}: not something this loop's "
                               f"{type(self.optimizer).__name__ if self.optimizer is not None else 'state'} has. "
                               f"Can set: {self.describe()}.")
        for name, value in changes.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise TunableError(f"{name} must be a finite number, got {value!r}.")
            if name in ("learning_rate", "weight_decay") and value < 0:
                raise TunableError(f"{name}={value!r}: expected a number of at least 0.")
            if name == "momentum" and not 0 <= value <= 1:
                raise TunableError(f"{name}={value!r}: expected a number from 0 to 1.")
            if name.startswith("beta_") and not 0 <= value < 1:
                raise TunableError(f"{name}={value!r}: expected a number from 0 to below 1.")

    def apply(self, changes: Mapping[str, float]) -> list[Change]:
        """Checks, then sets every param group (and a scheduler's base); all or none."""
        self.check(changes)
        old = self.read(list(changes))
        for name, value in changes.items():
            self._write(name, float(value))
        return [Change(name, old[name], float(value)) for name, value in changes.items()]

    def _write(self, name: str, value: float) -> None:
        if name in self.user:
            self.user[name].fill_(value)
            return
        for group in self.optimizer.param_groups:
            if name.startswith("beta_"):
                betas = list(group["betas"])
                betas[int(name[-1]) - 1] = value
                group["betas"] = tuple(betas)
            else:
                group[_GROUP_KEYS[name]] = value
        if name == "learning_rate":
            for scheduler in self.schedulers:
                scheduler.base_lrs = [value] * len(scheduler.base_lrs)

    @property
    def scheduler_note(self) -> str:
        """What `set lr` also does, for its message."""
        return " (and the scheduler's base learning rate)" if self.schedulers else ""

    def restore(self, values: Mapping[str, float]) -> None:
        """Writes back values `read` returned (after a rollback loaded older ones)."""
        known = set(self.names())
        for name, value in values.items():
            if name in known and value is not None:
                self._write(name, float(value))

    @contextlib.contextmanager
    def as_built(self) -> Iterator[None]:
        yield
