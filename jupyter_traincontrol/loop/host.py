"""Who a `TrainLoop` belongs to: itself, or the notebook cell whose thread runs it.

Under ``%%interruptible_fit``, one run spans the whole cell: a `TrainLoop`
created on the cell's thread is that run's, with the magic's settings,
its panel and its kernel interrupts. The notebook layer says so by hosting
the loops of the cell's thread (`hosting`); a loop asks `current_host`
when it starts. Elsewhere (a script) there is no host and a loop is a run
of its own.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Protocol

__all__ = ["LoopHost", "current_host", "hosting"]

_lock = threading.Lock()
_hosts: dict[int, "LoopHost"] = {}


class LoopHost(Protocol):
    """What hosts the loops of a thread (a notebook cell's `TrainingRun`).

    Attributes:
        lifecycle: The cell's run, open: the loop drives it, never closes it.
        on_nan: The magic's ``--on-nan``.
        save_in_background: False for ``--sync-saves``.
        save_at_end: False for ``--no-save-at-end``.
        resume_from: The magic's ``--resume-from``, or None.
        autosave: The magic's ``--autosave`` (None: off).
    """

    lifecycle: Any
    on_nan: str
    save_in_background: bool
    save_at_end: bool
    resume_from: str | None
    autosave: float | None

    def take_resume(self) -> bool:
        """True if this driver resumes (only the first of a cell does)."""

    def driver_began(self, driver: Any) -> None:
        """A loop began on the cell's thread (it takes commands and interrupts now)."""

    def driver_ended(self, driver: Any) -> None:
        """The loop ended (its ``ended_by`` says how)."""


def current_host() -> LoopHost | None:
    """The host of the calling thread's loops, or None."""
    return _hosts.get(threading.get_ident())


@contextlib.contextmanager
def hosting(host: LoopHost) -> Iterator[None]:
    """While inside, loops started on the calling thread belong to `host`."""
    ident = threading.get_ident()
    with _lock:
        _hosts[ident] = host
    try:
        yield
    finally:
        with _lock:
            _hosts.pop(ident, None)
