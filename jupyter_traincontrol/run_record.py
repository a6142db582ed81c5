"""What a run record is: its fields, and the strict reader every reader uses.

A record (``run.json`` in a run's registry folder) is outside data to
whoever reads it: another user's process cannot write it, but it can be
truncated by a crash, hand-edited, or written by a buggy or hostile program
of the same user. `validate_record` accepts a record only if each known
field has the type and range a run writes; anything else is refused with
one sentence saying why, and never raises.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .commands import RunState, shorten

__all__ = ["validate_record", "MAX_RECORD_BYTES"]

MAX_RECORD_BYTES = 4 << 20
_MAX_INT = 2**63 - 1


def _is_int(value: Any, low: int = 0, high: int = _MAX_INT) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _optional(check):
    return lambda value: value is None or check(value)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_metrics(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and (v is None or _is_number(v)) for k, v in value.items())


def _is_list_of(check):
    return lambda value: isinstance(value, list) and all(check(item) for item in value)


def _is_event(value: Any) -> bool:
    return isinstance(value, dict) and _is_number(value.get("time")) and _is_str(value.get("kind")) and _is_str(value.get("message"))


def _is_ack(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and _is_list_of(_is_str)(value.get("ids"))
        and _is_str(value.get("outcome"))
        and _is_str(value.get("message"))
    )


def _is_history_entry(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and (v is None or _is_number(v)) for k, v in value.items())


_FIELDS = {
    "name": _is_str,
    "run_id": _is_str,
    "pid": lambda value: _is_int(value, 1, 2**31 - 1),
    "state": lambda value: value in {state.value for state in RunState},
    "epoch": _optional(_is_int),
    "epochs": _optional(_is_int),
    "step": _optional(_is_int),
    "steps": _optional(_is_int),
    "global_step": _optional(_is_int),
    "started": _optional(_is_number),
    "ended": _optional(_is_number),
    "updated": _optional(_is_number),
    "origin": _optional(_is_str),
    "channel": _optional(lambda value: value in ("fifo", "spool")),
    "fifo": _optional(_is_str),
    "address": _optional(_is_str),
    "checkpoint_dir": _optional(_is_str),
    "checkpoints": _optional(_is_list_of(_is_str)),
    "metrics": _optional(_is_metrics),
    "history": _optional(_is_list_of(_is_history_entry)),
    "events": _optional(_is_list_of(_is_event)),
    "acks": _optional(_is_list_of(_is_ack)),
    "commands": _optional(_is_list_of(_is_str)),
    "error": _optional(_is_str),
    "kernel_id": _optional(_is_str),
    # A multi-process job (`distributed.Job`): this process, their count,
    # each one's last state, and the one whose loss ended the job.
    "process": _optional(_is_int),
    "num_processes": _optional(lambda value: _is_int(value, 1)),
    "processes": _optional(_is_list_of(lambda value: isinstance(value, dict) and _is_int(value.get("process")))),
    "lost_process": _optional(_is_int),
}
_REQUIRED = ("name", "run_id", "pid", "state")


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
    missing = [field for field in _REQUIRED if field not in record]
    if missing:
        return None, f"missing {', '.join(missing)}"
    for field, check in _FIELDS.items():
        if field in record and not check(record[field]):
            return None, f"field {field!r} has an unexpected value {shorten(repr(record[field]), 80)}"
    if record["name"] != folder_name:
        return None, f"its name {shorten(record['name'], 80)!r} is not its folder's ({folder_name!r})"
    return record, ""
