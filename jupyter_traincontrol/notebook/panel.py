"""The control panel of a notebook run: buttons, progress, metrics, chart, log.

`ControlPanel` is an ipywidgets view of a `TrainingRun`. A button click only
writes its command to the run's FIFO (the same path as every other control)
and returns. A daemon monitor thread, the only writer of the panel's widgets,
redraws at most `refresh_rate` times a second and only sends what changed, so
the browser is never flooded however fast the batches are.

Outside a notebook front end (a plain IPython terminal) `TextReporter`
prints one line per state change and checkpoint instead.
"""

from __future__ import annotations

import collections
import datetime
import html
import queue
import sys
import threading
import time
from typing import Callable

from ..commands import COMMAND_HELP, FINAL_STATES, Command, allowed_commands

__all__ = ["ControlPanel", "TextReporter", "loss_chart_svg"]

_BAR_STYLES = {
    "starting": "", "running": "", "paused": "info", "stopping": "warning",
    "stopped": "success", "finished": "success", "aborted": "warning", "failed": "danger",
}
_STATE_COLORS = {
    "starting": "#777", "running": "#1a73e8", "paused": "#0097a7", "stopping": "#e37400",
    "stopped": "#188038", "finished": "#188038", "aborted": "#e37400", "failed": "#d93025",
}
def _clock(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "--:--"
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def loss_chart_svg(history: list[dict], width: int = 360, height: int = 130) -> str:
    """An inline SVG chart of loss and val_loss per epoch (no plotting library).

    Args:
        history: Per-epoch entries such as ``{"epoch": 1, "loss": 0.5, "val_loss": 0.6}``.

    Returns:
        SVG markup, or a short note while there is nothing to draw.
    """
    series = {key: [(h["epoch"], h[key]) for h in history if isinstance(h.get(key), (int, float))] for key in ("loss", "val_loss")}
    points = [value for values in series.values() for _, value in values]
    if not points:
        return '<div style="color:#777;font-size:12px">The loss chart appears after the first epoch.</div>'
    epochs = [epoch for values in series.values() for epoch, _ in values]
    low, high = min(points), max(points)
    if high - low < 1e-12:
        low, high = low - 0.5, high + 0.5
    first, last = min(epochs), max(epochs)
    left, right, top, bottom = 48, 10, 10, 22
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(epoch):
        return left + (plot_w * (epoch - first) / (last - first) if last > first else plot_w / 2)

    def y(value):
        return top + plot_h * (high - value) / (high - low)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" style="font:11px sans-serif">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>',
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end">{high:.3g}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end">{low:.3g}</text>',
        f'<text x="{left}" y="{height - 6}">epoch {first}</text>',
        f'<text x="{left + plot_w}" y="{height - 6}" text-anchor="end">{last}</text>',
    ]
    colors = {"loss": "#1a73e8", "val_loss": "#e37400"}
    for index, (key, values) in enumerate(series.items()):
        if not values:
            continue
        coords = " ".join(f"{x(e):.1f},{y(v):.1f}" for e, v in values)
        parts.append(f'<polyline points="{coords}" fill="none" stroke="{colors[key]}" stroke-width="2"/>')
        for e, v in values[-1:]:
            parts.append(f'<circle cx="{x(e):.1f}" cy="{y(v):.1f}" r="3" fill="{colors[key]}"/>')
        parts.append(f'<text x="{left + plot_w - 6}" y="{top + 13 + index * 13}" text-anchor="end" fill="{colors[key]}">{key}</text>')
    parts.append("</svg>")
    return "".join(parts)


class _Rate:
    """Batches per second over the last few seconds."""

    def __init__(self, window: float = 5.0):
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self._window = window

    def add(self, now: float, done: int) -> float | None:
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[0][0] > self._window:
            self._samples.popleft()
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 and d1 >= d0 else None


class ControlPanel:
    """The ipywidgets panel of a run.

    Args:
        run: The `TrainingRun` shown.
        refresh_rate: Redraws a second at most. Defaults to 5.
        kernel_busy: Tells whether the kernel is handling a cell now (then
            clicks wait; the panel says so and names the terminal commands).
    """

    def __init__(self, run, refresh_rate: float = 5.0, kernel_busy: Callable[[], bool] = lambda: False):
        import ipywidgets as widgets

        self.run = run
        self.interval = 1.0 / max(0.1, float(refresh_rate))
        self._kernel_busy = kernel_busy
        self._clicks: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._click_notes: collections.deque[str] = collections.deque(maxlen=3)
        self._rate = _Rate()
        self.updates = 0
        full = widgets.Layout(width="100%")
        self.title = widgets.HTML()
        self.progress = widgets.IntProgress(min=0, max=1, value=0, layout=widgets.Layout(width="100%", height="14px"))
        self.stats = widgets.HTML()
        self.metrics = widgets.HTML()
        self.chart = widgets.HTML()
        self.log = widgets.HTML(layout=full)
        self.output = widgets.HTML(layout=full)
        self.note = widgets.HTML(layout=full)
        self.buttons = {
            "save": widgets.Button(description="Save", icon="save", tooltip=_tooltip(Command.SAVE)),
            "stop": widgets.Button(description="Stop", icon="stop", button_style="warning", tooltip=_tooltip(Command.STOP)),
            "abort": widgets.Button(description="Abort", icon="times", button_style="danger", tooltip=_tooltip(Command.ABORT)),
            "pause": widgets.Button(description="Pause", icon="pause", tooltip=_tooltip(Command.PAUSE)),
        }
        for key, button in self.buttons.items():
            button.on_click(self._click_handler(key))
        self.widget = widgets.VBox(
            [
                self.title,
                self.progress,
                self.stats,
                widgets.HBox(list(self.buttons.values())),
                widgets.HBox([self.chart, self.metrics]),
                self.note,
                self.log,
                self.output,
            ],
            layout=widgets.Layout(border="1px solid #ddd", padding="6px", width="100%"),
        )
        self.refresh()
        self._thread = threading.Thread(target=self._monitor, name=f"traincontrol-panel-{run.name}", daemon=True)

    def start(self) -> "ControlPanel":
        """Starts the monitor thread (it ends with the run)."""
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        """Waits for the monitor thread to finish its last redraw."""
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _click_handler(self, key: str):
        def on_click(button):
            command = "resume" if key == "pause" and button.description == "Resume" else key
            try:
                self.run.send(command)
                note = f"{button.description}: sent '{command}'."
            except Exception as error:  # shown in the panel, never raised into the kernel
                note = f"{button.description}: could not send '{command}': {error}"
            self._clicks.put(note)

        return on_click

    def _monitor(self) -> None:
        while not self.run.wait(self.interval):
            self.refresh()
        self.refresh()

    def refresh(self) -> None:
        """Redraws what changed. Called by the monitor thread only."""
        run, control = self.run, self.run.lifecycle
        state = run.state
        now = time.time()
        self.updates += 1
        self.title.value = (
            f'<b style="font-size:14px">{html.escape(str(run.name))}</b> '
            f'<span style="background:{_STATE_COLORS[state]};color:white;border-radius:8px;padding:1px 8px;font-size:12px">{state}</span>'
            f' <span style="color:#777;font-size:12px">checkpoints in {html.escape(str(control.store.directory if control.store else "-"))}</span>'
        )
        steps = control.steps or 0
        self.progress.max = max(1, steps)
        self.progress.value = min(control.step, self.progress.max)
        self.progress.bar_style = _BAR_STYLES[state]
        self.stats.value = self._stats_html(now)
        enabled = {str(command) for command in allowed_commands(state)}
        for key, button in self.buttons.items():
            button.disabled = key not in enabled and not (key == "pause" and "resume" in enabled)
        pause = self.buttons["pause"]
        paused = "resume" in enabled
        pause.description, pause.icon = ("Resume", "play") if paused else ("Pause", "pause")
        pause.tooltip = _tooltip(Command.RESUME if paused else Command.PAUSE)
        self.metrics.value = _metrics_html(control.metrics)
        self.chart.value = loss_chart_svg(control.epoch_history)
        self.note.value = self._note_html(state)
        self.log.value = _log_html(list(control.events)[-8:])
        self.output.value = self._output_html()

    def _stats_html(self, now: float) -> str:
        control = self.run.lifecycle
        started = control.started or now
        elapsed = (control.ended or now) - started
        steps, epochs = control.steps, control.epochs
        done = (control.epoch - 1) * steps + control.step if steps and control.epoch else None
        rate = self._rate.add(time.monotonic(), done) if done is not None else None
        parts = [f"Epoch {control.epoch or '-'}/{epochs or '?'}", f"batch {control.step}/{steps or '?'}", f"{_clock(elapsed)} elapsed"]
        if rate and steps and epochs and self.run.state in ("running", "paused"):
            remaining = (epochs - control.epoch) * steps + (steps - control.step)
            parts.append(f"ETA {_clock(remaining / rate)}")
        if rate:
            batch_size = self.run.batch_size
            parts.append(f"{rate * batch_size:,.0f} samples/s" if batch_size else f"{rate:,.1f} batches/s")
        return f'<span style="font-size:12px">{" · ".join(parts)}</span>'

    def _note_html(self, state: str) -> str:
        while True:
            try:
                self._click_notes.append(self._clicks.get_nowait())
            except queue.Empty:
                break
        lines = [html.escape(note) for note in self._click_notes]
        if state not in FINAL_STATES and self._kernel_busy():
            lines.append(
                "The kernel is busy with a cell: clicks here wait until it finishes. To act at once, in a terminal: "
                f"<code>jupyter-traincontrol send {html.escape(str(self.run.name))} stop</code> "
                f"(or save, abort, pause, resume), or <code>echo stop &gt; {html.escape(str(self.run.fifo))}</code>."
            )
        if state == "failed" and self.run.error:
            lines.append(f'<pre style="color:#d93025;white-space:pre-wrap">{html.escape(self.run.error)}</pre>')
        return "".join(f'<div style="font-size:12px;line-height:1.4">{line}</div>' for line in lines)

    def _output_html(self) -> str:
        text = self.run.output.text()
        if not text:
            return ""
        tail = "\n".join(text.splitlines()[-15:])
        return (
            '<div style="font-size:11px;color:#777;line-height:1.4">Output of the training thread:</div>'
            f'<pre style="max-height:12em;overflow:auto;font-size:11px;margin:0;line-height:1.3">{html.escape(tail)}</pre>'
        )


def _tooltip(command: Command) -> str:
    text = COMMAND_HELP[command]
    return text[0].upper() + text[1:]


def _metrics_html(metrics: dict) -> str:
    cell = "padding:0 6px;line-height:1.4"
    rows = "".join(
        f'<tr><td style="{cell}">{html.escape(str(key))}</td><td style="{cell};text-align:right">{value:.4g}</td></tr>'
        for key, value in metrics.items() if isinstance(value, (int, float))
    )
    return f'<table style="font-size:12px;margin-left:12px;border-collapse:collapse">{rows}</table>' if rows else ""


def _log_html(events: list[dict]) -> str:
    colors = {"rejected": "#d93025", "error": "#d93025", "warning": "#e37400", "checkpoint": "#188038"}
    lines = []
    for event in events:
        stamp = datetime.datetime.fromtimestamp(event["time"]).strftime("%H:%M:%S")
        color = colors.get(event["kind"], "#444")
        message = event["message"] if event["kind"] != "state" else f"state: {event['message']}"
        lines.append(f'<div style="color:{color}">{stamp} {html.escape(message)}</div>')
    return f'<div style="font-size:11px;font-family:monospace;line-height:1.4">{"".join(lines)}</div>'


class TextReporter:
    """The panel's stand-in outside a notebook front end: prints a line for
    each state change and checkpoint.

    Args:
        run: The `TrainingRun`.
        stream: Where to print. Defaults to the real stdout.
    """

    def __init__(self, run, stream=None):
        self.run = run
        self._stream = stream or sys.__stdout__
        run.lifecycle.add_listener(self._on_event)

    def start(self) -> "TextReporter":
        return self

    def join(self, timeout: float | None = None) -> None:
        """Nothing to wait for."""

    def _on_event(self, control, event) -> None:
        if event is None or event["kind"] not in ("state", "checkpoint", "error", "warning"):
            return
        print(f"[traincontrol] {self.run.name}: {event['message']}", file=self._stream, flush=True)
