"""The control panel of a notebook run: buttons, progress, metrics, chart, log.

`ControlPanel` is an ipywidgets view of a `TrainingRun`. A button click only
writes its command to the run's FIFO (the same path as every other control)
and returns. The learning-rate field sends ``set lr=VALUE`` when Enter is
pressed in it; Rollback asks first (the button turns into "Confirm
rollback" for a few seconds). A daemon monitor thread, the only writer of the panel's widgets,
redraws at most `refresh_rate` times a second and only sends what changed, so
the browser is never flooded however fast the batches are.

Outside a notebook front end (a plain IPython terminal) `text_reporter`
prints one line per state change and checkpoint instead; the chart is
`chart_svg`.
"""

from __future__ import annotations

import collections
import datetime
import html
import queue
import threading
import time
from typing import TYPE_CHECKING, Callable

from ..protocol import COMMAND_HELP, FINAL_STATES, Command, UnknownCommandError, allowed_commands, parse_request
from .chart_svg import loss_chart_svg

if TYPE_CHECKING:  # the panel reads the run; the run never imports the panel
    from .run import TrainingRun

__all__ = ["ControlPanel"]

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


#: How long Rollback waits for its confirming click.
ROLLBACK_CONFIRM_SECONDS = 8.0

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

    def __init__(self, run: TrainingRun, refresh_rate: float = 5.0, kernel_busy: Callable[[], bool] = lambda: False):
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
        # Two bars, labelled: the epoch in progress, and the whole run.
        self.epoch_label = widgets.HTML(layout=widgets.Layout(width="15em", flex="0 0 auto"))
        self.progress = widgets.IntProgress(min=0, max=1, value=0, layout=widgets.Layout(flex="1 1 auto", height="14px", min_width="4em"))
        self.run_label = widgets.HTML(layout=widgets.Layout(width="15em", flex="0 0 auto"))
        self.run_progress = widgets.IntProgress(min=0, max=1, value=0, layout=widgets.Layout(flex="1 1 auto", height="14px", min_width="4em"))
        self.stats = widgets.HTML()
        self.metrics = widgets.HTML()
        self.chart = widgets.HTML(layout=widgets.Layout(flex="0 1 380px", min_width="0"))
        self.log = widgets.HTML(layout=full)
        self.output = widgets.HTML(layout=full)
        self.note = widgets.HTML(layout=full)
        self.buttons = {
            "save": widgets.Button(description="Save", icon="save", tooltip=_tooltip(Command.SAVE)),
            "stop": widgets.Button(description="Stop", icon="stop", button_style="warning", tooltip=_tooltip(Command.STOP)),
            "abort": widgets.Button(description="Abort", icon="times", button_style="danger", tooltip=_tooltip(Command.ABORT)),
            "pause": widgets.Button(description="Pause", icon="pause", tooltip=_tooltip(Command.PAUSE)),
            "rollback": widgets.Button(description="Rollback", icon="undo", tooltip=_tooltip(Command.ROLLBACK)),
        }
        self._rollback_armed: float | None = None  # when Rollback asked for its confirming click
        # The learning rate, editable: Enter sends `set lr=VALUE`.
        self.learning_rate = widgets.Text(
            description="lr", placeholder="learning rate", continuous_update=False,
            tooltip="The learning rate; type a new one and press Enter to set it at the next batch",
            layout=widgets.Layout(width="11em"), style={"description_width": "1.6em"},
        )
        self.learning_rate._dom_classes = (
            "traincontrol-field", "traincontrol-command-set", "traincontrol-tunable-learning_rate",
        )
        self._shown_lr: float | None = None
        self.learning_rate.observe(self._on_learning_rate, names="value")
        # Classes a front end can find the panel and its commands by: the
        # JupyterLab extension sends a click on these buttons straight to the
        # server (the run's FIFO), so it acts even while the kernel is busy.
        for key, button in self.buttons.items():
            button.on_click(self._click_handler(key))
            button._dom_classes = ("traincontrol-button", f"traincontrol-command-{key}")
        row = widgets.Layout(width="100%", align_items="center")
        self.widget = widgets.VBox(
            [
                self.title,
                widgets.HBox([self.epoch_label, self.progress], layout=row),
                widgets.HBox([self.run_label, self.run_progress], layout=row),
                self.stats,
                widgets.HBox([*self.buttons.values(), self.learning_rate],
                             layout=widgets.Layout(flex_flow="row wrap", align_items="center")),
                widgets.HBox([self.chart, self.metrics], layout=widgets.Layout(flex_flow="row wrap", width="100%")),
                self.note,
                self.log,
                self.output,
            ],
            layout=widgets.Layout(border="1px solid var(--jp-border-color2, #ddd)", padding="6px", width="100%"),
        )
        self.widget._dom_classes = ("traincontrol-panel", f"traincontrol-run-{run.name}")
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
            if key == "rollback" and not self._confirm_rollback(button):
                return
            command = "resume" if key == "pause" and button.description == "Resume" else key
            try:
                self.run.send(command, sender="panel")
                note = f"{button.description}: sent '{command}'."
            except Exception as error:  # shown in the panel, never raised into the kernel
                note = f"{button.description}: could not send '{command}': {error}"
            self._clicks.put(note)

        return on_click

    def _confirm_rollback(self, button) -> bool:
        """True on the confirming click; the first click only asks."""
        armed = self._rollback_armed
        if armed is not None and time.monotonic() - armed < ROLLBACK_CONFIRM_SECONDS:
            self._rollback_armed = None
            button.description, button.button_style = "Rollback", ""
            return True
        self._rollback_armed = time.monotonic()
        button.description, button.button_style = "Confirm rollback", "danger"
        self._clicks.put("Rollback: click 'Confirm rollback' to load the newest checkpoint into the model "
                         "(the learning rate stays as it is now).")
        return False

    def _on_learning_rate(self, change) -> None:
        """Enter in the learning-rate field (the front end syncs the value then)."""
        if change["new"] == _lr_text(self._shown_lr):
            return  # the monitor showing the run's value (it notes it first), or nothing changed
        text = change["new"].strip()
        try:
            request = self.run.send(parse_request(f"set lr={text}"), sender="panel")  # the id says who sent it
            note = f"Learning rate: sent '{request}'."  # without its id
        except UnknownCommandError as error:
            note = f"Learning rate: {error}"
        except Exception as error:  # shown in the panel, never raised into the kernel
            note = f"Learning rate: could not send 'set lr={text}': {error}"
        self._clicks.put(note)

    def _monitor(self) -> None:
        while not self.run.wait(self.interval):
            self.refresh()
        self.refresh()

    def refresh(self) -> None:
        """Redraws what changed. Called by the monitor thread only."""
        run, lifecycle = self.run, self.run.lifecycle
        progress = lifecycle.progress
        state = run.state
        now = time.time()
        self.updates += 1
        self.title.value = (
            f'<b style="font-size:14px">{html.escape(str(run.name))}</b> '
            f'<span style="background:{_STATE_COLORS[state]};color:white;border-radius:8px;padding:1px 8px;font-size:12px">{state}</span>'
            f' <span style="color:#777;font-size:12px">checkpoints in {_path_html(lifecycle.store.directory if lifecycle.store else "-")}</span>'
        )
        steps, epochs = progress.steps or 0, progress.epochs or 0
        self.progress.max = max(1, steps)
        self.progress.value = min(progress.step, self.progress.max)
        self.epoch_label.value = _bar_label(f"Epoch {progress.epoch or '-'}/{epochs or '?'} · batch {progress.step}/{steps or '?'}")
        # The run: batches when the epoch's length is known, else epochs.
        done_epochs = max(0, progress.epoch - 1)
        if steps and epochs:
            self.run_progress.max, self.run_progress.value = epochs * steps, min(epochs * steps, done_epochs * steps + progress.step)
        else:
            self.run_progress.max, self.run_progress.value = max(1, epochs), min(max(1, epochs), done_epochs)
        self.run_label.value = _bar_label(f"Run {100 * self.run_progress.value // max(1, self.run_progress.max)}%" if epochs else "Run")
        for bar in (self.progress, self.run_progress):
            bar.bar_style = _BAR_STYLES[state]
        self.stats.value = self._stats_html(now, progress)
        enabled = {str(command) for command in allowed_commands(state)}
        for key, button in self.buttons.items():
            button.disabled = key not in enabled and not (key == "pause" and "resume" in enabled)
        pause = self.buttons["pause"]
        paused = "resume" in enabled
        pause.description, pause.icon = ("Resume", "play") if paused else ("Pause", "pause")
        pause.tooltip = _tooltip(Command.RESUME if paused else Command.PAUSE)
        pause._dom_classes = ("traincontrol-button", f"traincontrol-command-{'resume' if paused else 'pause'}")
        self._refresh_steering(enabled, progress)
        self.metrics.value = _metrics_html(progress.metrics)
        self.chart.value = loss_chart_svg(**lifecycle.history.chart_series())
        self.note.value = self._note_html(state)
        self.log.value = _log_html(list(lifecycle.journal.events)[-8:])
        self.output.value = self._output_html()

    def _refresh_steering(self, enabled: set[str], progress) -> None:
        rollback = self.buttons["rollback"]
        if self._rollback_armed is not None and time.monotonic() - self._rollback_armed >= ROLLBACK_CONFIRM_SECONDS:
            self._rollback_armed = None
            rollback.description, rollback.button_style = "Rollback", ""
        rollback.disabled = "rollback" not in enabled or not self.run.lifecycle.checkpoints()
        lr = progress.tunables.get("learning_rate")
        field = self.learning_rate
        field.disabled = "set" not in enabled
        field.layout.display = "none" if lr is None and self._shown_lr is None else None
        if lr is not None and lr != self._shown_lr:
            self._shown_lr = lr
            field.value = _lr_text(lr)  # only when the run's value changed: never over what is being typed

    def _stats_html(self, now: float, progress) -> str:
        lifecycle = self.run.lifecycle
        started = lifecycle.started or now
        elapsed = (lifecycle.ended or now) - started
        steps, epochs = progress.steps, progress.epochs
        done = (progress.epoch - 1) * steps + progress.step if steps and progress.epoch else None
        rate = self._rate.add(time.monotonic(), done) if done is not None else None
        parts = [f"{_clock(elapsed)} elapsed"]
        if rate and steps and epochs and self.run.state in ("running", "paused"):
            remaining = (epochs - progress.epoch) * steps + (steps - progress.step)
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
            # The JupyterLab extension hides this (class traincontrol-busy-note)
            # where it sends the clicks to the server: there they do not wait.
            lines.append(
                '<span class="traincontrol-busy-note">'
                "The kernel is busy with a cell: clicks here wait until it finishes. To act at once, in a terminal: "
                f"<code>jupyter-traincontrol send {html.escape(str(self.run.name))} stop</code> "
                "(or save, abort, pause, resume, <code>set lr=1e-4</code>, rollback), "
                f"or <code>echo stop &gt; {html.escape(str(self.run.fifo))}</code>."
                "</span>"
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


def _lr_text(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def _tooltip(command: Command) -> str:
    text = COMMAND_HELP[command]
    return text[0].upper() + text[1:]


def _path_html(path) -> str:
    """A path that wraps only after a ``/`` (never at a ``-`` inside a name)."""
    parts = str(path).split("/")
    pieces = [html.escape(part + "/") for part in parts[:-1]] + [html.escape(parts[-1])]
    return "<wbr>".join(f'<span style="white-space:nowrap">{piece}</span>' for piece in pieces if piece)


def _bar_label(text: str) -> str:
    return f'<span style="font-size:12px;white-space:nowrap">{html.escape(text)}</span>'


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
        color = colors.get(event["kind"], "var(--jp-ui-font-color1, #444)")
        message = event["message"] if event["kind"] != "state" else f"state: {event['message']}"
        lines.append(f'<div style="color:{color}">{stamp} {html.escape(message)}</div>')
    return f'<div style="font-size:11px;font-family:monospace;line-height:1.4">{"".join(lines)}</div>'
