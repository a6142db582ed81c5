"""Words and HTML of the notebook panel: numbers, paths, metrics, the log, and how a run ended.

Pure functions (no widgets, no run): `ControlPanel` puts what they return
into its widgets. Numbers follow one rule with the JupyterLab side panel
(``labextension/src/format.ts``, ``formatNumber``): 3 significant digits, in
exponent form below 0.001 and from 100000 on, so the learning rate reads
``3e-4`` in both.

Example:

>>> number_text(0.0003), number_text(0.001), number_text(0.21314)
('3e-4', '0.001', '0.213')
"""

from __future__ import annotations

import datetime
import html
import math
import re
from typing import Any, Iterable, Mapping

__all__ = [
    "number_text",
    "clock_text",
    "path_html",
    "bar_label_html",
    "metrics_html",
    "log_html",
    "outcome_text",
    "outcome_html",
    "load_hint",
]

#: A request id at the end of a command (``save #rest-3f2a``): how senders
#: match acknowledgements, not something to read in the panel's log.
_REQUEST_ID = re.compile(r" #[A-Za-z0-9_-]{1,32}\b")
_LOG_COLORS = {"rejected": "#d93025", "error": "#d93025", "warning": "#e37400", "checkpoint": "#188038"}
_FINAL = ("stopped", "aborted", "finished", "failed")


def number_text(value: Any) -> str:
    """A number as both panels show it: ``0.213``, ``0.001``, ``3e-4``, ``2.5e5``.

    Args:
        value: A number; anything else (None) reads ``-``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    if abs(value) < 1e-3 or abs(value) >= 1e5:
        mantissa, exponent = f"{value:.2e}".split("e")
        if "." in mantissa:
            mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    return f"{float(f'{value:.3g}'):g}"


def clock_text(seconds: float | None) -> str:
    """``0:04:05``; ``--:--`` for an unknown time."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "--:--"
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def path_html(path) -> str:
    """A path that wraps only after a ``/`` (never at a ``-`` inside a name)."""
    parts = str(path).split("/")
    pieces = [html.escape(part + "/") for part in parts[:-1]] + [html.escape(parts[-1])]
    return "<wbr>".join(f'<span style="white-space:nowrap">{piece}</span>' for piece in pieces if piece)


def bar_label_html(text: str) -> str:
    return f'<span style="font-size:12px;white-space:nowrap">{html.escape(text)}</span>'


def metrics_html(metrics: Mapping[str, Any]) -> str:
    """The latest metrics, a table of name and value."""
    cell = "padding:0 6px;line-height:1.4"
    rows = "".join(
        f'<tr><td style="{cell}">{html.escape(str(key))}</td><td style="{cell};text-align:right">{number_text(value)}</td></tr>'
        for key, value in metrics.items() if isinstance(value, (int, float)) and not isinstance(value, bool)
    )
    return f'<table style="font-size:12px;margin-left:12px;border-collapse:collapse">{rows}</table>' if rows else ""


def log_html(events: Iterable[Mapping[str, Any]]) -> str:
    """The run's log: time, then the message (request ids left out)."""
    lines = []
    for event in events:
        stamp = datetime.datetime.fromtimestamp(event["time"]).strftime("%H:%M:%S")
        color = _LOG_COLORS.get(event["kind"], "var(--jp-ui-font-color1, #444)")
        message = event["message"] if event["kind"] != "state" else f"state: {event['message']}"
        lines.append(f'<div style="color:{color}">{stamp} {html.escape(_REQUEST_ID.sub("", message))}</div>')
    return f'<div style="font-size:11px;font-family:monospace;line-height:1.4">{"".join(lines)}</div>'


def outcome_text(state: str, end_reason: str | None = None, stopped_by: str | None = None, trained: bool = True) -> str:
    """How a run ended, in words (the side panel's ``outcomeText``):
    ``Stopped by a kernel interrupt``, ``Finished: training ran to its end``.

    Args:
        state: The run's final state.
        end_reason: The record's ``end_reason``, if it has one.
        stopped_by: The record's ``stopped_by``: the callback that ended `fit` early.
        trained: Whether a batch (or item) was trained: a run that ends
            ``finished`` without one ran no training at all.
    """
    title = state[:1].upper() + state[1:]
    if state == "finished" and end_reason in (None, "finished") and not trained:
        return "Ended: nothing trained (the cell ran no fit or TrainLoop)"
    by_reason = {
        "finished": "Finished: training ran to its end",
        "callback": f"Stopped early by {stopped_by or 'a callback'}",
        "command": f"{title} by a command",
        "interrupt": f"{title} by a kernel interrupt",
        "kernel-restart": f"{title} when its kernel restarted or shut down",
        "error": "Failed: the training raised an error",
        "nan": f"{title}: the loss was not a finite number",
        "process-gone": "Lost: its process ended before the run did (killed, or crashed)",
    }
    if end_reason in by_reason:
        return by_reason[end_reason]
    by_state = {
        "finished": "Finished: training ran to its end",
        "stopped": "Stopped",
        "aborted": "Aborted",
        "failed": "Failed: the training raised an error",
    }
    return by_state.get(state, title)


def load_hint(path: str, keras2: bool = False) -> str:
    """The code that loads the checkpoint at `path` (``run.checkpoints[-1]``), by its format.

    Args:
        path: The checkpoint's file (or folder).
        keras2: A ``.keras`` file of Keras 2 (``tf_keras``), not Keras 3.
    """
    if path.endswith(".pt"):  # TrainLoop(state=...): one dict of the state_dicts it was given
        return "torch.load(run.checkpoints[-1], weights_only=True)"
    if path.endswith(".ckpt"):  # TrainLoop(save=..., load=...): a folder the user's own function reads
        return "load(run.checkpoints[-1])"
    return f"{'tf_keras' if keras2 else 'keras'}.models.load_model(run.checkpoints[-1])"


def outcome_html(name: str, state: str, end_reason: str | None, where: str, checkpoints: list[tuple[str, Mapping, bool]],
                 keras2: bool = False, stopped_by: str | None = None) -> str:
    """What an ended run's panel shows instead of its buttons.

    Args:
        name: The run's name.
        state: Its final state.
        end_reason: The record's ``end_reason``, or None.
        where: Where it ended (``epoch 7/30 · batch 12/26``), or ''.
        checkpoints: ``(path, sidecar, this_run)`` of each checkpoint of its
            name, oldest first.
        keras2: The run trained a Keras 2 (``tf_keras``) model (`load_hint`).
        stopped_by: The callback that ended `fit` early (the record's ``stopped_by``).
    """
    color = {"failed": "#d93025", "aborted": "#e37400"}.get(state, "#188038")
    head = f'<b style="color:{color}">{html.escape(outcome_text(state, end_reason, stopped_by, trained=bool(where)))}</b>'
    if where:
        head += f" at {html.escape(where)}"
    parts = [f'<div style="font-size:13px;line-height:1.5">{head}</div>']
    if checkpoints:
        count = len(checkpoints)
        parts.append(f'<div style="font-size:12px;line-height:1.5">{count} checkpoint{"s" if count > 1 else ""}, newest last:</div>')
        items = "".join(f'<li style="margin:1px 0">{_checkpoint_html(path, info, mine)}</li>' for path, info, mine in checkpoints)
        parts.append(f'<ul style="font-size:12px;line-height:1.4;margin:0;padding-left:18px">{items}</ul>')
        parts.append(
            '<div style="font-size:12px;line-height:1.5;color:var(--jp-ui-font-color2, #666)">'
            f"Continue it: <code>%%interruptible_fit --name {html.escape(name)} --resume</code>; "
            f"load the newest: <code>{html.escape(load_hint(checkpoints[-1][0], keras2))}</code>.</div>"
        )
    else:
        why = "an abort writes none" if state == "aborted" else "none was written"
        parts.append(f'<div style="font-size:12px;line-height:1.5">No checkpoint: {why}.</div>')
    return f'<div class="traincontrol-outcome" style="margin:4px 0">{"".join(parts)}</div>'


def _checkpoint_html(path: str, info: Mapping, mine: bool) -> str:
    details = []
    if info.get("reason"):
        details.append(str(info["reason"]))
    if isinstance(info.get("epoch"), int):
        details.append(f"epoch {info['epoch'] + 1}")
    if isinstance(info.get("step_in_epoch"), int):
        details.append(f"batch {info['step_in_epoch']}")
    if not mine:
        details.append("an earlier run")
    tail = f' <span style="color:var(--jp-ui-font-color2, #666)">({html.escape(", ".join(details))})</span>' if details else ""
    return f"<code>{path_html(path)}</code>{tail}"
