"""A run record: its fields, declared once, for the run that writes it and every reader.

A record (``run.json`` in a run's registry folder) is what the CLI, the
Jupyter server, the panels and other processes know of a run. `FIELDS`
declares each field: its name, what a valid value is, and what it means.
The run checks what it writes against it (`conform`), and every reader
checks what it reads (`validate_record`): a record is outside data to
whoever reads it (it can be truncated by a crash, hand-edited, or written
by a buggy or hostile program of the same user), so a field with a value a
run never writes makes the whole record refused, with one sentence saying
why; the reader never raises.

Example:

>>> validate_record('{"name": "a", "run_id": "x", "pid": 7, "state": "running"}', "a")[1]
''
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable, Mapping

from .commands import shorten
from .states import END_REASONS, RunState

__all__ = ["Field", "FIELDS", "REQUIRED", "MAX_RECORD_BYTES", "validate_record", "conform", "UndeclaredFieldError"]

MAX_RECORD_BYTES = 4 << 20
_MAX_INT = 2**63 - 1
_STATES = frozenset(state.value for state in RunState)


def _is_int(value: Any, low: int = 0, high: int = _MAX_INT) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number_or_null(value: Any) -> bool:
    return value is None or _is_number(value)


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(check(item) for item in value)


def _is_numbers(value: Any) -> bool:
    """``{name: number or null}``: metrics, an epoch's logs, tunables."""
    return isinstance(value, dict) and all(isinstance(k, str) and _number_or_null(v) for k, v in value.items())


def _is_event(value: Any) -> bool:
    return isinstance(value, dict) and _is_number(value.get("time")) and _is_str(value.get("kind")) and _is_str(value.get("message"))


def _is_ack(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and _is_list_of(_is_str)(value.get("ids"))
        and _is_str(value.get("outcome"))
        and _is_str(value.get("message"))
    )


def _is_point(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and _is_int(value[0]) and _number_or_null(value[1])


def _is_change(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and _is_str(value.get("name"))
        and _is_str(value.get("by"))
        and _is_number(value.get("time"))
        and _number_or_null(value.get("old"))
        and _number_or_null(value.get("new"))
    )


def _is_process(value: Any) -> bool:
    return isinstance(value, dict) and _is_int(value.get("process"))


@dataclasses.dataclass(frozen=True)
class Field:
    """One field of a run record.

    Attributes:
        name: The key.
        check: True for a value a run writes.
        doc: What it means, for people (and the reference docs).
        required: Every record has it.
    """

    name: str
    check: Callable[[Any], bool]
    doc: str
    required: bool = False


_DECLARED = (
    Field("name", _is_str, "the run's name (its registry folder's)", required=True),
    Field("run_id", _is_str, "this instance of the run (its checkpoints' sidecars carry the same id)", required=True),
    Field("pid", lambda v: _is_int(v, 1, 2**31 - 1), "the process the run lives in", required=True),
    Field("state", lambda v: v in _STATES, "starting, running, paused, stopping, stopped, aborted, finished or failed",
          required=True),
    Field("updated", _optional(_is_number), "when the record was written (seconds since the epoch)"),
    Field("started", _optional(_is_number), "when the run began"),
    Field("ended", _optional(_is_number), "when it ended, or null"),
    Field("end_reason", _optional(lambda v: v in END_REASONS),
          "how it ended, once it has: finished, callback, command, interrupt, kernel-restart, error, nan or process-gone"),
    Field("stopped_by", _optional(_is_str), "for end reason callback: the class of the callback that ended fit"),
    Field("origin", _optional(_is_str), "where it lives: a script's name, or notebook"),
    Field("commands", _optional(_is_list_of(_is_str)), "the commands that make sense in its state"),
    Field("channel", _optional(lambda v: v in ("fifo", "spool")), "how it takes commands, while it listens"),
    Field("fifo", _optional(_is_str), "its FIFO, while it listens"),
    Field("address", _optional(_is_str), "where senders write (the FIFO, or a spool folder)"),
    Field("checkpoint_dir", _optional(_is_str), "its checkpoint folder"),
    Field("checkpoints", _optional(_is_list_of(_is_str)), "its complete checkpoints, oldest first"),
    Field("checkpoints_this_run", _optional(_is_int), "how many of those this instance wrote"),
    Field("epoch", _optional(_is_int), "the epoch in progress, from 1 (0 before the first)"),
    Field("epochs", _optional(_is_int), "the epochs asked for, if known"),
    Field("step", _optional(_is_int), "batches done in the epoch in progress"),
    Field("steps", _optional(_is_int), "batches an epoch has, once known"),
    Field("global_step", _optional(_is_int), "the optimizer's step count, as of its last checkpoint, resume or rollback"),
    Field("metrics", _optional(_is_numbers), "the latest logs (null for NaN)"),
    Field("history", _optional(_is_list_of(_is_numbers)), "each epoch's final logs, with its epoch and batch"),
    Field("loss_curve", _optional(_is_list_of(_is_point)), "the loss per batch, [batch, loss], in at most 300 points"),
    Field("tunables", _optional(_is_numbers), "what set can change, and the current values (null: off)"),
    Field("changes", _optional(_is_list_of(_is_change)), "what was steered: by whom, old and new value, where"),
    Field("events", _optional(_is_list_of(_is_event)), "the run's log: commands, checkpoints, rejected input"),
    Field("acks", _optional(_is_list_of(_is_ack)), "what became of requests with an id: ids, outcome, message"),
    Field("error", _optional(_is_str), "the traceback of a failed run"),
    Field("kernel_id", _optional(_is_str), "the Jupyter kernel the run lives in"),
    # A multi-process job: this process, their count, each one's last state,
    # and the one whose loss ended the job.
    Field("process", _optional(_is_int), "in a job: this process's index"),
    Field("num_processes", _optional(lambda v: _is_int(v, 1)), "in a job: how many processes it has"),
    Field("processes", _optional(_is_list_of(_is_process)), "in a job: each process's state and step"),
    Field("lost_process", _optional(_is_int), "in a job: the process whose loss ended it"),
)

#: Every field of a record, by name.
FIELDS: Mapping[str, Field] = {field.name: field for field in _DECLARED}
#: The fields every record has.
REQUIRED = tuple(field.name for field in _DECLARED if field.required)


class UndeclaredFieldError(ValueError):
    """A run was about to write a field `FIELDS` does not declare."""


def conform(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """The writer's check: every key of `record` is a declared field.

    Returns:
        `record`.

    Raises:
        UndeclaredFieldError: Naming the fields no reader would know.
    """
    unknown = sorted(set(record) - FIELDS.keys())
    if unknown:
        raise UndeclaredFieldError(f"Record fields {', '.join(unknown)} are not declared in protocol.record.FIELDS.")
    return record


def validate_record(text: str, folder_name: str) -> tuple[dict[str, Any] | None, str]:
    """Checks a record as read from disk.

    Args:
        text: The file's content.
        folder_name: The name of the folder it was in (the run's name).

    Returns:
        ``(record, "")`` for a valid record, ``(None, why)`` otherwise. It
        never raises.
    """
    if len(text) > MAX_RECORD_BYTES:
        return None, f"larger than {MAX_RECORD_BYTES} bytes"
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as error:
        return None, f"not JSON ({shorten(str(error), 80)})"
    if not isinstance(record, dict):
        return None, f"expected a JSON object, got {type(record).__name__}"
    missing = [name for name in REQUIRED if name not in record]
    if missing:
        return None, f"missing {', '.join(missing)}"
    for name, field in FIELDS.items():
        if name in record and not field.check(record[name]):
            return None, f"field {name!r} has an unexpected value {shorten(repr(record[name]), 80)}"
    if record["name"] != folder_name:
        return None, f"its name {shorten(record['name'], 80)!r} is not its folder's ({folder_name!r})"
    return record, ""
