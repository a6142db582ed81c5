"""A run's record, built from its parts and checked against `protocol.record.FIELDS`.

The record is what every other process knows of a run (``list --json``,
the REST API, the panels). `build_record` reads the run's parts, never
writes them: its state, journal, history and the progress its driver
reports, its channel and checkpoints, and the fields other parts add
(`extras`: a kernel id, a job's processes).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from ..checkpoint import Checkpoint
from ..protocol import RunState, allowed_commands
from ..protocol.record import conform
from ..protocol.values import finite_metrics
from ..transport.receiver import CommandChannel
from .history import RunHistory
from .journal import Journal
from .progress import RunProgress

__all__ = ["build_record", "RecordFields"]

#: Adds fields to a run's record (each a declared field).
RecordFields = Callable[[], Mapping[str, Any]]


def build_record(*, state: RunState, origin: str, channel: CommandChannel | None, checkpoint_dir: str | None,
                 checkpoints: list[Checkpoint], run_id: str, progress: RunProgress, history: RunHistory,
                 journal: Journal, error: str | None, started: float | None, ended: float | None,
                 end_reason: str | None = None, stopped_by: str | None = None,
                 extras: Iterable[RecordFields] = ()) -> dict[str, Any]:
    """The record of a run (without the registry's own fields: name, run id, pid, time).

    Raises:
        UndeclaredFieldError: If a part adds a field no reader knows.
    """
    record: dict[str, Any] = {}
    for fields in extras:
        record.update(fields())
    record.update({
        "state": str(state),
        "commands": [str(command) for command in allowed_commands(state)],
        "origin": origin,
        "channel": channel.kind if channel is not None else None,
        "fifo": channel.address if channel is not None and channel.kind == "fifo" else None,
        "address": channel.address if channel is not None else None,
        "checkpoint_dir": checkpoint_dir,
        "checkpoints": [str(checkpoint.path) for checkpoint in checkpoints],
        "checkpoints_this_run": sum(1 for checkpoint in checkpoints if checkpoint.info.get("run_id") == run_id),
        "epoch": progress.epoch,
        "epochs": progress.epochs,
        "step": progress.step,
        "steps": progress.steps,
        "global_step": progress.global_step,
        "metrics": finite_metrics(progress.metrics),
        "tunables": dict(progress.tunables),
        **history.as_record(),
        **journal.as_record(),
        "error": error,
        "started": started,
        "ended": ended,
        "end_reason": end_reason,
        "stopped_by": stopped_by,
    })
    return dict(conform(record))
