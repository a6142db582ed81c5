"""What a job uses of its run: `JobRun`, a few members of a `run.RunLifecycle`.

The job layer sees the run only through this protocol, so it imports
neither the run nor `fit`; `fit` wires a `Job` in.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

from ..protocol import Request

__all__ = ["JobRun"]


class JobRun(Protocol):
    """What a job uses of its run (a `run.RunLifecycle`)."""

    name: str | None

    @property
    def state(self) -> Any:
        """The run's state."""

    @property
    def progress(self) -> Any:
        """Its `RunProgress` (epoch, step)."""

    @property
    def journal(self) -> Any:
        """Its journal (``log``)."""

    def rename(self, name: str) -> None:
        """Takes another name before opening."""

    def send(self, command, sender: str | None = None) -> Request:
        """Sends the run a command, in process."""

    def add_record_fields(self, fields: Callable[[], Mapping[str, Any]]) -> None:
        """Adds fields to the run's record."""

    def touch(self) -> None:
        """Marks the record as changed."""
