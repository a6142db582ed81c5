"""A training run of ``%%interruptible_fit``: the cell's code on a background thread.

`TrainingRun` executes the cell in the user's namespace on a daemon thread,
so the kernel stays free for other cells. Every ``fit`` called on that thread
(directly or through the user's functions) gets the run's `ControlCallback`;
what the thread prints goes to the run's panel. One `RunLifecycle` spans
the whole cell: its name, FIFO, record and checkpoints.

The run knows its view only as a `RunView` (the notebook panel, or a text
reporter): it never imports the panel, and the panel reads the run through
its public attributes.

Keras loads with the cell's first ``fit`` (or at once, where it is imported
already): a cell that trains a PyTorch or JAX `TrainLoop` imports neither
Keras nor TensorFlow.

Final states: ``failed`` if the cell raised; ``aborted`` / ``stopped`` if a
``fit`` was ended by that command (`protocol.final_state`); ``finished``
otherwise (also when the cell never called ``fit``, which the run's log says).
"""

from __future__ import annotations

import collections
import inspect
import sys
import threading
import time
import traceback
from typing import Any, Callable, Protocol

from ..boundary.safeguards import DEFAULT_AUTOSAVE_SECONDS
from ..fit import watchdog
from ..protocol import ACTIVE_STATES, FINAL_STATES, Command, Request, RunState, final_state, parse_command
from ..run import RunLifecycle, scoped
from ..transport.channels import with_id
from .drivers import CellDrivers
from .fit_hook import FitInterceptor, intercept_fit
from .output import OutputBuffer, route_thread_output
from .output_mime import with_run_reference
from .widget_compat import view_bundle

__all__ = ["TrainingRun", "RunView", "active_runs", "all_runs"]

_INTERRUPT_BURST_SECONDS = 1.0
#: jupyter_client interrupts a kernel before it asks it to shut down (a
#: restart too): a run a kernel interrupt stopped waits this long for that
#: request before it says how it ended.
_SHUTDOWN_AFTER_INTERRUPT_SECONDS = 0.25

_runs_lock = threading.Lock()
_active: list["TrainingRun"] = []
_history: collections.deque["TrainingRun"] = collections.deque(maxlen=50)


def active_runs() -> list["TrainingRun"]:
    """The runs of this process that have not ended, oldest first."""
    with _runs_lock:
        return list(_active)


def all_runs() -> list["TrainingRun"]:
    """The recent runs of this process (the last 50), oldest first."""
    with _runs_lock:
        return list(_history)


class RunView(Protocol):
    """What shows a run: the notebook panel, or a text reporter."""

    def start(self) -> "RunView":
        """Starts following the run."""

    def join(self, timeout: float | None = None) -> None:
        """Waits until the view has shown the run's end."""


class TrainingRun(FitInterceptor):
    """The code of one cell, training in the background under control.

    Args:
        code: Python source (IPython syntax already transformed).
        namespace: Where it runs (the user namespace).
        name: The run's name; defaults to the first free ``run-N``.
        checkpoint_dir: Defaults to ``checkpoints/NAME``.
        keep: Checkpoints kept. Defaults to 3.
        resume: Resume the first ``fit`` from the latest checkpoint.
        on_interrupt: The command a kernel interrupt sends: ``stop``,
            ``save`` or ``abort``. A second interrupt (more than a second
            later) while the run is stopping sends ``abort``.
        extra_record: Fields for the run's record (the kernel id).
        filename: The name tracebacks give the cell.
        tunables: Names to Keras variables ``set`` may change (see
            `ControlCallback`).
        on_nan: ``stop``, ``rollback`` or ``ignore``: what a non-finite
            loss does (see `ControlCallback`). Defaults to ``stop``.
        save_in_background: Hold training only while the variables are
            copied to host memory (see `ControlCallback`). False: every
            checkpoint is written on the training thread, with no host
            copy. Defaults to True.
        save_at_end: A ``fit`` that runs to its end writes a last
            checkpoint (see `ControlCallback`). Defaults to True.
        resume_from: Resume the first ``fit`` from another run's newest
            checkpoint, or from a checkpoint file (see `ControlCallback`).
        autosave: Seconds of training between autosaves (see
            `ControlCallback`); 0 or None: off. Defaults to 600.

    Example:

    >>> run = TrainingRun("history = model.fit(x, y, epochs=5)", user_ns)   # doctest: +SKIP
    >>> run.start(); run.wait(); run.state                                  # doctest: +SKIP
    'finished'
    """

    def __init__(
        self,
        code: str,
        namespace: dict,
        *,
        name: str | None = None,
        checkpoint_dir: str | None = None,
        keep: int = 3,
        resume: bool = False,
        on_interrupt: str = "stop",
        extra_record: dict[str, Any] | None = None,
        filename: str = "<interruptible_fit>",
        tunables: dict | None = None,
        on_nan: str = "stop",
        save_in_background: bool = True,
        save_at_end: bool = True,
        resume_from: str | None = None,
        autosave: float | None = DEFAULT_AUTOSAVE_SECONDS,
    ):
        self.on_interrupt = parse_command(on_interrupt)
        if self.on_interrupt not in (Command.STOP, Command.SAVE, Command.ABORT):
            raise ValueError(f"on_interrupt must be stop, save or abort, got {on_interrupt!r}.")
        self._compiled = compile(code, filename, "exec")
        self._namespace = namespace
        self.lifecycle = RunLifecycle(name, checkpoint_dir, keep, origin="notebook", extra_record=extra_record)
        self._callback_options = dict(
            lifecycle=self.lifecycle, handle_sigint=False, verbose=False, tunables=tunables, on_nan=on_nan,
            save_in_background=save_in_background, save_at_end=save_at_end, resume_from=resume_from,
            autosave=autosave,
        )
        #: The cell's scope: every fit and TrainLoop of the cell drives its run.
        self.drivers = CellDrivers(self.lifecycle, resume=resume, on_nan=on_nan, save_in_background=save_in_background,
                                   save_at_end=save_at_end, resume_from=resume_from, autosave=autosave)
        self._callback = None
        if tunables is not None or "keras" in sys.modules:  # made now: its arguments are checked before the run starts
            self._callback = self.callback
        self.output = OutputBuffer()
        self.history = None
        self.fit_calls = 0
        self.batch_size: int | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_interrupt = float("-inf")
        self._shutting_down = threading.Event()
        self.panel: RunView | None = None  # set by the extension

    # Public view -----------------------------------------------------------

    @property
    def callback(self):
        """The `ControlCallback` the cell's fits get. Made on first use (the
        cell's first ``fit``, or here): that imports Keras."""
        if self._callback is None:
            from ..fit.callback import ControlCallback  # Keras: not for a cell that trains none

            self._callback = ControlCallback(**self._callback_options)
            self._callback.scope = self.drivers  # its fits drive the cell's run
        return self._callback

    @property
    def keras2(self) -> bool:
        """True if a fit of the cell trained a Keras 2 (``tf_keras``) model."""
        fit = getattr(self._callback, "adapter", None)
        return bool(getattr(fit, "keras2", False))

    @property
    def name(self) -> str | None:
        """The run's name."""
        return self.lifecycle.name

    @property
    def state(self) -> RunState:
        """``starting``, ``running``, ``paused``, ``stopping``, ``stopped``,
        ``aborted``, ``finished`` or ``failed``."""
        return self.lifecycle.state

    @property
    def driving(self) -> bool:
        """True while a fit or a TrainLoop of the cell drives the run (commands act)."""
        return self.drivers.driving

    @property
    def uncontrolled(self) -> bool:
        """True while no fit or TrainLoop has begun in the cell: nothing can act on a command."""
        return self.drivers.count == 0

    @property
    def active(self) -> bool:
        """True until the cell's code has ended."""
        return self._thread is not None and not self._done.is_set()

    @property
    def checkpoints(self) -> list:
        """Paths of the run's complete checkpoints, oldest first."""
        return self.lifecycle.checkpoint_paths()

    @property
    def fifo(self) -> str | None:
        """The run's FIFO while it listens (write commands there)."""
        return self.lifecycle.address

    @property
    def error(self) -> str | None:
        """The traceback of a failed run."""
        return self.lifecycle.error

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the run ends.

        Args:
            timeout: Seconds to wait at most; None waits for ever.

        Returns:
            True if the run has ended.
        """
        return self._done.wait(timeout)

    def send(self, command: str | Command | Request, sender: str = "notebook") -> Request:
        """Sends a command through the run's FIFO (see `ControlCallback`), with
        a request id the run acknowledges (`ack`)."""
        return self.lifecycle.send(command, sender=sender)

    def ack(self, request: Request) -> dict | None:
        """What became of `request` (`send` returned it): ``{"outcome",
        "message", ...}``, or None while the run has not answered."""
        return self.lifecycle.journal.acks_of(request.request_id) if request.request_id else None

    def stop(self) -> Request:
        """Checkpoint, then end ``fit`` gracefully."""
        return self.send(Command.STOP)

    def save(self) -> Request:
        """Write a checkpoint; training goes on."""
        return self.send(Command.SAVE)

    def abort(self) -> Request:
        """End ``fit`` gracefully without a checkpoint."""
        return self.send(Command.ABORT)

    def pause(self) -> Request:
        """Hold the training thread at the next batch boundary."""
        return self.send(Command.PAUSE)

    def resume(self) -> Request:
        """Let a paused run go on."""
        return self.send(Command.RESUME)

    # Lifecycle -------------------------------------------------------------

    def start(self) -> "TrainingRun":
        """Claims the run's name and starts the training thread.

        Raises:
            NameTakenError: If a live run has the requested name.
        """
        watchdog.check_all()  # a run of this process whose fit raised ends now, before a new one claims a name
        self.lifecycle.open()
        self.lifecycle.publisher.add_tick_hook(self.drivers.answer_idle_commands)
        with _runs_lock:
            _active.append(self)
            _history.append(self)
        self._thread = self.drivers.cell_thread = threading.Thread(target=self._main, name=f"traincontrol-train-{self.name}",
                                                                   daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        """Waits for the training thread itself to exit."""
        if self._thread is not None:
            self._thread.join(timeout)

    def note_shutdown(self) -> None:
        """The kernel is shutting down or restarting: a stop now (its own, or
        the interrupt jupyter_client sends first) ends the run ``kernel-restart``."""
        self._shutting_down.set()

    def _main(self) -> None:
        final, error, reason = RunState.FINISHED, None, None
        try:
            with route_thread_output(self.output.write), intercept_fit(self), scoped(self.drivers):
                exec(self._compiled, self._namespace)
        except BaseException as exception:  # the cell failed: record it, keep the kernel healthy
            final = RunState.FAILED
            error = _format_cell_error(exception)
            if isinstance(exception, KeyboardInterrupt) and self.drivers.interrupted_cell:
                reason = "interrupt"
        else:
            final = final_state(self.drivers.ended_by)
            reason = self.drivers.end_reason(final)
            if self.drivers.count == 0:
                self.lifecycle.journal.log("warning", "The cell ran no fit and no TrainLoop, so nothing in it was under "
                                                      "control: train with model.fit(...) or in `with TrainLoop(...)`.")
        finally:
            if reason == "interrupt":  # the interrupt a shutdown or restart begins with?
                self._shutting_down.wait(_SHUTDOWN_AFTER_INTERRUPT_SECONDS)
            if self._shutting_down.is_set() and final in (RunState.STOPPED, RunState.ABORTED):
                reason = "kernel-restart"
            self.lifecycle.close(final, error, reason)
            with _runs_lock:
                if self in _active:
                    _active.remove(self)
            self._done.set()

    # FitInterceptor ----------------------------------------------------------

    def around_fit(self, fit: Callable, model, args: tuple, kwargs: dict) -> Any:
        """Adds the control callback to a ``fit`` call of the cell."""
        drivers = self.drivers
        if drivers.ended_by is not None:
            self.lifecycle.journal.log("info", f"fit skipped: the run was told to {drivers.ended_by}.")
            return getattr(model, "history", None)
        bound = inspect.signature(fit).bind(model, *args, **kwargs)
        arguments = bound.arguments
        arguments["callbacks"] = [self.callback, *list(arguments.get("callbacks") or [])]
        arguments.setdefault("verbose", 0)  # the panel shows progress instead
        self.batch_size = arguments.get("batch_size") or (None if _is_dataset(arguments.get("x")) else 32)
        self.fit_calls += 1
        self.callback.resume = drivers.take_resume()  # only the cell's first driver resumes
        drivers.driver_began(self.callback)
        try:
            history = fit(*bound.args, **bound.kwargs)
        finally:
            drivers.driver_ended(self.callback)
            self.callback.resume_from = None  # only the cell's first driver resumes
        self.history = history
        return history

    # Interrupts --------------------------------------------------------------

    def handle_interrupt(self, now: float | None = None) -> Request | None:
        """Answers a kernel interrupt: sends `on_interrupt`, or ``abort`` for a
        second interrupt while stopping. Interrupts less than a second after
        the previous one belong to the same burst and are ignored.

        Returns:
            The command sent, or None.
        """
        now = time.monotonic() if now is None else now
        previous, self._last_interrupt = self._last_interrupt, now
        if now - previous < _INTERRUPT_BURST_SECONDS or self.state not in ACTIVE_STATES:
            return None
        if not self.drivers.driving and not self.drivers.count:  # nothing trained yet: interrupt the cell's code
            self.lifecycle.journal.log("info", "Kernel interrupt: the cell runs no fit or TrainLoop; interrupting its code.")
            self.drivers.interrupt_cell()
            return None
        repeated = previous != float("-inf")
        command = Command.ABORT if repeated and self.state == RunState.STOPPING else self.on_interrupt
        between = not self.drivers.driving  # a fit of the cell has ended, the next not begun
        if between and command is not Command.SAVE:
            return self._end_between_fits(command)
        if command is Command.STOP:
            self.drivers.note_interrupt()
        waits = " (between two fits: it acts as the cell's next fit begins)" if between else ""
        self.lifecycle.journal.log("info", f"Kernel interrupt: sending {command}{waits}.")
        try:
            return self.send(command, sender="interrupt")
        except OSError as error:
            self.lifecycle.journal.log("warning", f"Kernel interrupt: could not send {command}: {error}")
            return None

    def _end_between_fits(self, command: Command) -> Request:
        """A kernel interrupt's ``stop`` or ``abort`` after a fit (or loop) of
        the cell ended and before the next began: the run's training ends
        here (the cell's code goes on, its later fits train nothing), with no
        `KeyboardInterrupt` in the cell."""
        journal = self.lifecycle.journal
        request = with_id(command, "interrupt")
        journal.log("command", f"Kernel interrupt between two fits: {command}")
        self.drivers.end_between(command, request.request_id)
        self.lifecycle.move_to(RunState.STOPPING)
        journal.acknowledge(request, "applied", f"{command} between two fits: the cell's later fits train nothing")
        self.lifecycle.publish(force=True)
        return request

    def __repr__(self) -> str:
        return f"<TrainingRun {self.name!r} {self.state}>"

    def summary(self) -> str:
        """One line about the run: state, progress, loss, and how to command it."""
        progress = self.lifecycle.progress
        parts = [f"Run {self.name!r}: {self.state}"]
        if progress.epoch:
            parts.append(f"epoch {progress.epoch}/{progress.epochs or '?'}, batch {progress.step}/{progress.steps or '?'}")
        loss = progress.metrics.get("loss") if progress.metrics else None
        if isinstance(loss, (int, float)):
            parts.append(f"loss {loss:.4g}")
        if self.checkpoints:
            parts.append(f"last checkpoint {self.checkpoints[-1]}")
        text = ", ".join(parts)
        if self.state not in FINAL_STATES:
            text += f". Commands: run.stop(), or `jupyter-traincontrol send {self.name} stop` in a terminal"
        return text

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(self.summary())

    def _repr_mimebundle_(self, include=None, exclude=None):
        widget = getattr(self.panel, "widget", None)  # the panel's (a text reporter has none)
        bundle = view_bundle(widget) if widget is not None else {}  # ipywidgets 7.7 or 8
        bundle["text/plain"] = self.summary()
        return with_run_reference(bundle, self.lifecycle, include, exclude)  # for when the widgets are gone


def _is_dataset(x) -> bool:
    return x is not None and not hasattr(x, "shape") and not isinstance(x, (list, tuple, dict))


def _format_cell_error(exception: BaseException) -> str:
    """The traceback of an exception from the cell, without our own frame."""
    tb = exception.__traceback__
    if tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exception), exception, tb))
