"""The control panel of a notebook run: buttons, progress, metrics, chart, log.

`ControlPanel` is an ipywidgets view of a `TrainingRun`. A button click only
writes its command to the run's FIFO (the same path as every other control)
and returns. The learning-rate field sends ``set lr=VALUE`` when Enter is
pressed in it; Abort and Rollback ask first (the button turns into "Confirm
abort" or "Confirm rollback" for a few seconds). Once the run has ended, the
buttons give way to how it ended and its checkpoints, with their paths.
A daemon monitor thread, the only writer of the panel's widgets, redraws at
most `refresh_rate` times a second and only sends what changed, so the
browser is never flooded however fast the batches are. A click's notice
shows for a few seconds, the last two at most; a click the run never took
(it had ended, or ended first) is said in the ended panel and its log
(`click_notes`). Where clicks travel through the kernel, the panel says
that they wait while another cell runs, and once per kernel what the
server extension would add (`front_end_notes`).

It works with ipywidgets 7.7 (Colab's) and 8: it uses only what both
have, and `widget_compat` for the two things that differ.

Outside a notebook front end (a plain IPython terminal) `text_reporter`
prints one line per state change and checkpoint instead; the chart is
`chart_svg`, the words and numbers `panel_text`.
"""

from __future__ import annotations

import collections
import html
import threading
import time
from typing import TYPE_CHECKING, Callable

from ..protocol import COMMAND_HELP, FINAL_STATES, Command, UnknownCommandError, allowed_commands, parse_request
from ..transport.channels import NotListeningError
from . import front_end_notes
from .chart_svg import loss_chart_svg
from .click_notes import ClickNotes
from .panel_text import (
    bar_label_html, clock_text, log_html, metrics_html, number_text, outcome_html, outcome_text, path_html,
)
from .widget_compat import set_tooltip

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
#: How long Abort and Rollback wait for their confirming click.
CONFIRM_SECONDS = 8.0
#: The commands that ask first: the armed button's label, and what the panel says.
_CONFIRMS = {
    "abort": ("Confirm abort", "Abort: click 'Confirm abort' to end training without a checkpoint "
                               "(Stop writes one first)."),
    "rollback": ("Confirm rollback", "Rollback: click 'Confirm rollback' to load the newest checkpoint into the model "
                                     "(a learning rate you set stays; otherwise the checkpoint's comes back)."),
}
#: How long a click's notice shows, and how many show at once.
NOTE_SECONDS = 10.0
_NOTES_SHOWN = 2
#: A run that ends sooner leaves the server-extension note to the kernel's next panel (it may not have been read).
SERVER_NOTE_READ_SECONDS = 30.0

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
        self.clicks = ClickNotes(run.lifecycle.journal.log, NOTE_SECONDS, _NOTES_SHOWN)
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
        # Once per kernel, where clicks go through the kernel: what the server extension adds.
        self._server_note_since = time.monotonic() if front_end_notes.take_server_note() else None
        self.front_end_note = widgets.HTML(
            value=front_end_notes.server_extension_note_html(str(run.name)) if self._server_note_since is not None
            else "", layout=full)
        self.outcome = widgets.HTML(layout=widgets.Layout(width="100%", display="none"))
        # Buttons of one width, in two groups that wrap as wholes (save, stop, abort; pause, rollback), then
        # the learning rate: a narrow panel breaks the row between groups into lines of about one length.
        def button(description, icon, command, style=""):
            return widgets.Button(description=description, icon=icon, button_style=style, tooltip=_tooltip(command),
                                  layout=widgets.Layout(width="10em", flex="0 0 auto"))

        self.buttons = {
            "save": button("Save", "save", Command.SAVE),
            "stop": button("Stop", "stop", Command.STOP, "warning"),
            "abort": button("Abort", "times", Command.ABORT, "danger"),
            "pause": button("Pause", "pause", Command.PAUSE),
            "rollback": button("Rollback", "undo", Command.ROLLBACK),
        }
        self._styles = {key: button.button_style for key, button in self.buttons.items()}
        self._icons = {key: button.icon for key, button in self.buttons.items()}
        self._armed: dict[str, float] = {}  # when Abort or Rollback asked for its confirming click
        # The learning rate, editable: Enter sends `set lr=VALUE`.
        self.learning_rate = widgets.Text(
            description="lr", placeholder="learning rate", continuous_update=False,
            layout=widgets.Layout(width="9em"), style={"description_width": "1.6em"},
        )
        set_tooltip(self.learning_rate, "The learning rate; type a new one and press Enter to set it at the next batch")
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
        group = widgets.Layout(flex_flow="row nowrap", flex="0 0 auto", margin="0 8px 0 0")
        self.controls = widgets.HBox(
            [widgets.HBox([self.buttons[key] for key in ("save", "stop", "abort")], layout=group),
             widgets.HBox([self.buttons[key] for key in ("pause", "rollback")], layout=group),
             self.learning_rate],
            layout=widgets.Layout(flex_flow="row wrap", align_items="center", width="100%"),
        )
        self.widget = widgets.VBox(
            [
                self.title,
                widgets.HBox([self.epoch_label, self.progress], layout=row),
                widgets.HBox([self.run_label, self.run_progress], layout=row),
                self.stats,
                self.controls,
                self.outcome,
                widgets.HBox([self.chart, self.metrics], layout=widgets.Layout(flex_flow="row wrap", width="100%")),
                self.note,
                self.front_end_note,
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
            command = "resume" if key == "pause" and button.description == "Resume" else key
            label = command.capitalize()  # "Abort", not "Confirm abort": what the click is for
            if self.run.state in FINAL_STATES:  # taken late: the kernel was busy until after the run's end
                self._not_applied(label, command)
                return
            if key in _CONFIRMS and not self._confirmed(key, button):
                return
            self._send(label, command)

        return on_click

    def _send(self, label: str, command) -> None:
        """Sends a click's command to the run, and says so (or why not)."""
        try:
            request = self.run.send(command, sender="panel")  # a request with an id: the run answers it
        except NotListeningError:  # ended between the click and now
            self._not_applied(label, str(command))
            return
        except UnknownCommandError as error:
            self.clicks.add(f"{label}: {error}")
            return
        except Exception as error:  # shown in the panel, never raised into the kernel
            self.clicks.add(f"{label}: could not send '{command}': {error}")
            return
        self.clicks.sent(label, request)
        self.clicks.add(f"{label}: sent '{request}'.")  # without its id

    def _not_applied(self, label: str, command: str) -> None:
        """A click the kernel took once the run had ended (or was ending):
        said in the ended panel and its log, never dropped without a word."""
        self.clicks.too_late(label, command, self._how_it_ended())
        if self.run.wait(0):  # the monitor draws its last once the run has ended: after it, this thread redraws
            self.join(5)
            if not self._thread.is_alive():
                self.refresh()

    def _answered(self, request) -> bool:
        return self.run.ack(request) is not None

    def _how_it_ended(self) -> str:
        lifecycle = self.run.lifecycle
        state = self.run.state
        if state not in FINAL_STATES:
            return "it was ending"
        return outcome_text(str(state), lifecycle.end_reason, lifecycle.record().get("stopped_by"))

    def _confirmed(self, key: str, button) -> bool:
        """True on the confirming click; the first click only asks (Abort, Rollback)."""
        armed = self._armed.pop(key, None)
        if armed is not None and time.monotonic() - armed < CONFIRM_SECONDS:
            self._disarm(key)
            return True
        label, question = _CONFIRMS[key]
        self._armed[key] = time.monotonic()
        button.description, button.button_style, button.icon = label, "danger", ""  # no icon: room for the words
        self.clicks.add(question)
        return False

    def _disarm(self, key: str) -> None:
        self._armed.pop(key, None)
        button = self.buttons[key]
        button.description, button.button_style, button.icon = key.capitalize(), self._styles[key], self._icons[key]

    def _on_learning_rate(self, change) -> None:
        """Enter in the learning-rate field (the front end syncs the value then)."""
        if change["new"] == number_text(self._shown_lr) or (self._shown_lr is None and change["new"] == ""):
            return  # the monitor showing the run's value (it notes it first), or nothing changed
        text = change["new"].strip()
        if self.run.state in FINAL_STATES:  # taken late, as a click can be
            self._not_applied("Learning rate", f"set lr={text}")
            return
        try:
            request = parse_request(f"set lr={text}")
        except UnknownCommandError as error:
            self.clicks.add(f"Learning rate: {error}")
            return
        self._send("Learning rate", request)

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
            f' <span style="color:#777;font-size:12px">checkpoints in {path_html(lifecycle.store.directory if lifecycle.store else "-")}</span>'
        )
        steps, epochs = progress.steps or 0, progress.epochs or 0
        self.progress.max = max(1, steps)
        self.progress.value = min(progress.step, self.progress.max)
        if progress.epoch:
            self.epoch_label.value = bar_label_html(f"Epoch {progress.epoch}/{epochs or '?'} · batch {progress.step}/{steps or '?'}")
        else:  # no batch yet, or none ever (a cell with no fit, a fit that failed before its first)
            self.epoch_label.value = bar_label_html("no batch trained" if state in FINAL_STATES else "waiting for the first batch")
        # The run: batches when the epoch's length is known, else epochs.
        done_epochs = max(0, progress.epoch - 1)
        if steps and epochs:
            self.run_progress.max, self.run_progress.value = epochs * steps, min(epochs * steps, done_epochs * steps + progress.step)
        else:
            self.run_progress.max, self.run_progress.value = max(1, epochs), min(max(1, epochs), done_epochs)
        self.run_label.value = bar_label_html(f"Run {100 * self.run_progress.value // max(1, self.run_progress.max)}%" if epochs else "Run")
        for bar in (self.progress, self.run_progress):
            bar.bar_style = _BAR_STYLES[state]
        self.stats.value = self._stats_html(now, progress)
        enabled = {str(command) for command in allowed_commands(state)}
        if self._uncontrolled(state, now):
            enabled = set()  # nothing would act on a click
        for key, button in self.buttons.items():
            button.disabled = key not in enabled and not (key == "pause" and "resume" in enabled)
        pause = self.buttons["pause"]
        paused = "resume" in enabled
        pause.description, pause.icon = ("Resume", "play") if paused else ("Pause", "pause")
        pause.tooltip = _tooltip(Command.RESUME if paused else Command.PAUSE)
        pause._dom_classes = ("traincontrol-button", f"traincontrol-command-{'resume' if paused else 'pause'}")
        self._refresh_steering(enabled, progress)
        self.clicks.forget_answered(self._answered)
        self._refresh_outcome(state, progress)
        self.metrics.value = metrics_html(progress.metrics)
        self.chart.value = loss_chart_svg(**lifecycle.history.chart_series())
        self.note.value = self._note_html(state, now)
        self.log.value = log_html(list(lifecycle.journal.events)[-8:])
        self.output.value = self._output_html()

    def _refresh_outcome(self, state: str, progress) -> None:
        """Once the run has ended: how, and its checkpoints, instead of the buttons."""
        if state not in FINAL_STATES:
            return
        lifecycle = self.run.lifecycle
        where = ""
        if progress.epoch:
            where = f"epoch {progress.epoch}/{progress.epochs or '?'} · batch {progress.step}/{progress.steps or '?'}"
        checkpoints = [(str(c.path), c.info, c.info.get("run_id") == lifecycle.run_id) for c in lifecycle.checkpoints()]
        record = lifecycle.record()
        how = outcome_text(str(state), record.get("end_reason"), record.get("stopped_by"))
        self.clicks.check_unanswered(self._answered, how)
        self.outcome.value = outcome_html(str(self.run.name), str(state), record.get("end_reason"), where, checkpoints,
                                          keras2=self.run.keras2, stopped_by=record.get("stopped_by")
                                          ) + self.clicks.not_applied_html()
        self.controls.layout.display = "none"
        self.outcome.layout.display = None
        if self._server_note_since is not None:  # the JupyterLab extension no longer hides it in an ended run's panel
            if time.monotonic() - self._server_note_since < SERVER_NOTE_READ_SECONDS:
                front_end_notes.give_back_server_note()
            self._server_note_since = None
            self.front_end_note.value = ""

    def _refresh_steering(self, enabled: set[str], progress) -> None:
        for key, armed in list(self._armed.items()):
            if time.monotonic() - armed >= CONFIRM_SECONDS:
                self._disarm(key)
        rollback = self.buttons["rollback"]
        rollback.disabled = "rollback" not in enabled or not self.run.lifecycle.checkpoints()
        lr = progress.tunables.get("learning_rate")
        field = self.learning_rate
        field.disabled = "set" not in enabled
        field.layout.display = "none" if lr is None and self._shown_lr is None else None
        if lr is not None and lr != self._shown_lr:
            self._shown_lr = lr
            field.value = number_text(lr)  # only when the run's value changed: never over what is being typed

    def _stats_html(self, now: float, progress) -> str:
        lifecycle = self.run.lifecycle
        started = lifecycle.started or now
        elapsed = (lifecycle.ended or now) - started
        steps, epochs = progress.steps, progress.epochs
        done = (progress.epoch - 1) * steps + progress.step if steps and progress.epoch else None
        rate = self._rate.add(time.monotonic(), done) if done is not None else None
        parts = [f"{clock_text(elapsed)} elapsed"]
        if rate and steps and epochs and self.run.state in ("running", "paused"):
            remaining = (epochs - progress.epoch) * steps + (steps - progress.step)
            parts.append(f"ETA {clock_text(remaining / rate)}")
        if rate:
            batch_size = self.run.batch_size
            parts.append(f"{rate * batch_size:,.0f} samples/s" if batch_size else f"{rate:,.1f} batches/s")
        return f'<span style="font-size:12px">{" · ".join(parts)}</span>'

    def _uncontrolled(self, state: str, now: float) -> bool:
        """True once the cell has run a second with no fit or TrainLoop begun."""
        started = self.run.lifecycle.started or now
        return state not in FINAL_STATES and self.run.uncontrolled and now - started >= 1.0

    def _note_html(self, state: str, wall_now: float) -> str:
        # A click's notice is news for a few seconds, and none once the run has ended.
        lines = self.clicks.notices(ended=state in FINAL_STATES)
        if self._uncontrolled(state, wall_now):
            lines.append(
                "Nothing in this cell is under control (yet): it has run no fit and no TrainLoop, so the buttons "
                "would do nothing. Train with <code>model.fit(...)</code> or in <code>with TrainLoop(...) as loop:</code>"
                " to control it; an interrupt interrupts the cell's code."
            )
        elif state not in FINAL_STATES and self._kernel_busy():
            # The JupyterLab extension hides it where it sends the clicks to the server: there they do not wait.
            lines.append(front_end_notes.busy_note_html(str(self.run.name), self.run.fifo))
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
