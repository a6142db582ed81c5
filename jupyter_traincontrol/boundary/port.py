"""What the boundary layer needs of a run, and of the state being trained.

`RunPort` is the narrow face of a `run.RunLifecycle` that actions, saves
and steering use: its journal, its state, its store, publishing. `Trained`
is what a checkpoint is taken of: a Keras model (`state.KerasState`), or
what a custom loop holds. Both are protocols, so this layer depends on no
front end.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from ..checkpoint import Checkpoint, CheckpointStore
from ..protocol import RunState
from ..run.journal import Journal

__all__ = ["RunPort", "Trained"]


class RunPort(Protocol):
    """The parts of a run the boundary layer uses."""

    name: str | None
    journal: Journal
    store: CheckpointStore | None
    publisher: Any  # the run's ticker: ``add_tick_hook``, ``remove_tick_hook`` (`run.publisher.Publisher`)

    @property
    def state(self) -> RunState:
        """The run's state."""

    def send(self, command: Any, sender: str | None = ...) -> Any:
        """Sends the run a command, like any writer (safe in a signal handler)."""

    def move_to(self, state: RunState | str) -> bool:
        """Moves the run to `state`, logged and published."""

    def publish(self, force: bool = False) -> bool:
        """Writes the run's record."""

    def publish_soon(self) -> None:
        """Has the run's record written now, off this thread."""

    def add_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Notes a checkpoint the run wrote."""


class Trained(Protocol):
    """What a checkpoint is taken of, and restored into."""

    def sync(self) -> None:
        """Brings the state up to date before it is read (once per boundary)."""

    def step(self) -> int | None:
        """The optimizer's step count, or None without an optimizer."""

    def step_later(self, snapshot: Any = None) -> Callable[[], int | None]:
        """`step` as of now, given by the call returned (on any thread,
        later): where the backend keeps the value, read to the host only
        then, or taken from `snapshot` (one `snapshot` just made). Asked
        only of a state whose ``snapshots`` is true (a save in the
        background)."""

    def snapshot(self, buffers: Any) -> Any:
        """A host copy with ``save(path)`` and ``release()``, written later on any thread."""

    def views(self) -> Any:
        """Something with ``save(path)`` that reads the live state without a
        copy, for a writer thread the training thread waits for."""

    def live(self) -> Any:
        """The state itself, with ``save(path)`` (written on the training thread)."""

    def all_finite(self) -> bool:
        """True if every weight is a finite number."""

    def restore(self, checkpoint: Checkpoint) -> None:
        """Loads `checkpoint` (and starts the running metrics over); raises
        `CheckpointError` and changes nothing if it cannot."""
