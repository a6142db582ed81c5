"""A loop that trains state of its own outside the model (``sync=``): what ``set`` and ``rollback`` can reach there.

A stateless loop (Keras's ``stateless_call`` and ``stateless_apply`` in a
jitted JAX step) trains arrays it keeps itself and writes them into the
model's variables with ``sync=`` before each checkpoint. What the tool
changes in those variables (``set lr``, a rollback's weights) does not
reach the arrays, and the next ``sync`` writes over it. So:

- with ``reload=`` (a function that reads the model's variables back into
  the loop's arrays), the tool calls it after each change it makes to the
  variables: a resume, a rollback, a ``set``; both commands then act on
  what the loop trains (`SyncedState`, `ReloadingTunables`);
- without it, ``set`` (of any value) and ``rollback`` are refused, saying
  why, and nothing changes (`StatelessSteering`); ``set`` alone still
  reports the values.
"""

from __future__ import annotations

from typing import Any, Callable

from ..boundary.saves import Outcome
from ..boundary.steering import Steering
from ..checkpoint import Checkpoint
from ..protocol import Request, assignments

__all__ = ["ReloadingTunables", "StatelessSteering", "SyncedState", "STATELESS_REFUSAL"]

#: Why a loop with ``sync=`` and no ``reload=`` refuses ``set`` and ``rollback``.
STATELESS_REFUSAL = ("this loop trains state of its own, kept outside the model (sync=), and the next sync writes it "
                     "over the model's variables, so a change made to them would not reach training; give TrainLoop "
                     "reload= (a function that reads the model's variables back into that state) to steer it")


class SyncedState:
    """A state whose values the user keeps elsewhere: `sync` writes them
    back first; after a restore (a resume, a rollback), `reload` reads them
    again from the variables, if given.

    Args:
        inner: What a checkpoint holds (`state.KerasState`, ...).
        sync: The user's ``sync=``.
        reload: The user's ``reload=``, or None.
    """

    def __init__(self, inner, sync: Callable[[], None], reload: Callable[[], None] | None = None):
        self._inner = inner
        self._user_sync = sync
        self._reload = reload
        self.suffix, self.snapshots = inner.suffix, inner.snapshots

    @property
    def steering_refused(self) -> str | None:
        """Why ``set`` and ``rollback`` are refused, or None if they act."""
        return STATELESS_REFUSAL if self._reload is None else None

    def sync(self) -> None:
        self._user_sync()
        self._inner.sync()

    def step(self):
        return self._inner.step()

    def step_later(self, snapshot: Any = None):
        return self._inner.step_later(snapshot)

    def snapshot(self, buffers: Any = None):
        return self._inner.snapshot(buffers)

    def views(self):
        return self._inner.views()

    def live(self):
        return self._inner.live()

    def all_finite(self) -> bool:
        return self._inner.all_finite()

    def restore(self, checkpoint: Checkpoint) -> None:
        self._inner.restore(checkpoint)
        if self._reload is not None:
            self._reload()


class ReloadingTunables:
    """What ``set`` may change (a `boundary.tunables.Tunables`), with the
    user's ``reload=`` called after each change made."""

    def __init__(self, inner, reload: Callable[[], None]):
        self._inner = inner
        self._reload = reload

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def apply(self, changes):
        changed = self._inner.apply(changes)
        self._reload()
        return changed

    def restore(self, values) -> None:
        self._inner.restore(values)
        self._reload()


class StatelessSteering(Steering):
    """`Steering` of a loop whose state the tool cannot reach (see the
    module): ``set KEY=VALUE`` and ``rollback`` (a command's or
    ``on_nan="rollback"``'s) are refused, saying why.

    Args:
        refusal: Why.
        trained: As `Steering`'s.
        tunables: As `Steering`'s.
        run: As `Steering`'s.
        progress: As `Steering`'s.
        say: As `Steering`'s.
    """

    def __init__(self, refusal: str, trained, tunables, run, progress, say: Callable[..., None]):
        super().__init__(trained, tunables, run, progress, say)
        self.refusal = refusal
        self._tell = say

    def set(self, request: Request) -> Outcome:
        if not assignments(request):
            return super().set(request)  # reports the values
        return self._refuse(f"'{request}' refused, nothing changed: {self.refusal}.")

    def rollback(self, request: Request) -> Outcome:
        return self._refuse(f"'{request}' refused, nothing changed: {self.refusal}.")

    def rollback_to(self, checkpoints: list[Checkpoint], by: str, said_by: str | None = None) -> Outcome:
        return self._refuse(f"Rollback ({said_by or by}) refused, nothing changed: {self.refusal}.")

    def _refuse(self, message: str) -> Outcome:
        self.journal.log("error", message)
        self._tell(message)
        return "failed", message
