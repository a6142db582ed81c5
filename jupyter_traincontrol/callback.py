"""`ControlCallback`: a Keras callback that obeys stop, save, abort, pause, resume.

It works in any script, without Jupyter::

    model.fit(x, y, epochs=50, callbacks=[ControlCallback(name="mnist")])

and from another terminal::

    jupyter-traincontrol send mnist stop      # or: echo stop > FIFO

Commands take effect at the next batch boundary, on the training thread,
inside Keras's own hooks, so a checkpoint is always taken between two
batches. Stopping uses ``model.stop_training = True``: unlike raising an
exception, that lets every other callback's ``on_train_end`` run
(``EarlyStopping(restore_best_weights=True)``, ``ModelCheckpoint``,
``TensorBoard``) and `fit` returns its ``History``.

With ``fit`` on the main thread, the first Ctrl+C means ``stop`` and a
second raises ``KeyboardInterrupt`` as usual. The batch hook costs a flag
check unless a command waits.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import keras

from .checkpoint import CheckpointError, SkippedCheckpoint, TrainingPosition
from .commands import Command, Request, RunState
from .interrupt import SigintGuard
from .lifecycle import RunLifecycle
from .resume import Resumption, optimizer_step, resume_from_latest

__all__ = ["ControlCallback"]

_PAUSE_POLL_SECONDS = 0.25


class ControlCallback(keras.callbacks.Callback):
    """Lets a running `fit` be stopped, checkpointed, aborted or paused.

    At train begin the callback lists the run in the registry and opens its
    command channel (a FIFO); at each batch boundary it applies waiting
    commands (see `commands.COMMAND_HELP`); at train end it records the
    final state and closes the channel. An instance can be reused for
    several `fit` calls.

    Args:
        name: The run's name, unique among live runs: 1-64 letters, digits,
            ``.``, ``_`` or ``-``. Defaults to the first free ``run-N``.
        checkpoint_dir: Folder for checkpoints. Defaults to
            ``checkpoints/NAME`` in the current directory.
        keep: How many of the newest checkpoints to keep. Defaults to 3.
        resume: Load the newest checkpoint of this run's name in
            `checkpoint_dir` that loads before the first batch, and continue
            at its epoch and batch. Broken ones are skipped, and said so;
            with none, training starts from scratch (and says so). Defaults
            to False.
        handle_sigint: When `fit` runs on the main thread, make the first
            Ctrl+C a graceful stop. Defaults to True.
        verbose: Print one line when the run starts, resumes or ends, and
            for every checkpoint. Defaults to True.
        lifecycle: An open `RunLifecycle` to use instead of creating one
            (used by `%%interruptible_fit`, where one run spans the whole
            cell). The callback then neither opens nor closes it.
        channel_kind: ``"fifo"`` or ``"spool"``. Defaults to ``"fifo"``
            where the platform has FIFOs.

    Example:

    >>> callback = ControlCallback(name="demo", checkpoint_dir="ckpt")   # doctest: +SKIP
    >>> history = model.fit(x, y, epochs=10, callbacks=[callback])       # doctest: +SKIP
    >>> callback.state, callback.checkpoints                              # doctest: +SKIP
    ('stopped', [PosixPath('ckpt/ckpt-000001-epoch0004-step000012.keras')])
    """

    def __init__(
        self,
        name: str | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        keep: int = 3,
        resume: bool = False,
        *,
        handle_sigint: bool = True,
        verbose: bool = True,
        lifecycle: RunLifecycle | None = None,
        channel_kind: str | None = None,
    ):
        super().__init__()
        self.resume = bool(resume)
        self.handle_sigint = handle_sigint
        self.verbose = verbose
        self._owns_lifecycle = lifecycle is None
        self.lifecycle = lifecycle or RunLifecycle(name, checkpoint_dir, keep, channel_kind=channel_kind)
        self._lock = threading.RLock()
        self._appliers = {
            Command.SAVE: self._save,
            Command.STOP: self._stop,
            Command.ABORT: self._abort,
            Command.PAUSE: self._hold,
            Command.RESUME: lambda _request: _ignored(self.lifecycle, "The run is not paused; 'resume' ignored."),
        }
        self._reset()

    # Public view ---------------------------------------------------------

    @property
    def name(self) -> str | None:
        """The run's name (known once training has begun, if defaulted)."""
        return self.lifecycle.name

    @property
    def state(self) -> RunState:
        """The run's state: ``starting`` ... ``stopped``, ``finished``, ..."""
        return self.lifecycle.state

    @property
    def checkpoints(self) -> list[Path]:
        """Paths of the run's complete checkpoints, oldest first."""
        return [checkpoint.path for checkpoint in self.lifecycle.checkpoints()]

    @property
    def fifo(self) -> str | None:
        """Where to write commands while the run listens."""
        channel = self.lifecycle.channel
        return channel.address if channel is not None else None

    @property
    def ended_by(self) -> Command | None:
        """``stop`` or ``abort`` if that command ended the last (or current) `fit`."""
        return self._ended_by

    def send(self, command: str | Command | Request) -> Request:
        """Sends a command to the run (from any thread), like any writer."""
        return self.lifecycle.send(command)

    def note_interrupt(self) -> None:
        """Marks the next stop as caused by an interrupt (its checkpoint's
        reason becomes ``interrupt``). Safe from any thread."""
        self._interrupted = True

    # Keras hooks ---------------------------------------------------------

    def _reset(self) -> None:
        self._channel = None
        self._epoch = 0
        self._step = 0
        self._mid_epoch = False  # True while applying commands after a training batch
        self._boundary = 0  # counts batch boundaries: saves at one boundary are one checkpoint
        self._last_save: tuple[int, str] | None = None  # (boundary, what the save wrote)
        self._ended_by: Command | None = None
        self._interrupted = False
        self._stopped_mid_epoch = False
        self._in_fit = False
        self._resumption: Resumption | None = None
        self._sigint: SigintGuard | None = None
        self._watchdog: _FitWatchdog | None = None

    def on_train_begin(self, logs=None):
        with self._lock:
            if self._in_fit:
                self._finish(RunState.FAILED, "A new fit began before the previous one ended.")
            self._reset()
            lifecycle = self.lifecycle
            if self._owns_lifecycle:
                lifecycle.open()
            elif not lifecycle.is_open:
                raise RuntimeError(f"The RunLifecycle given for run {lifecycle.name!r} is not open.")
            self._in_fit = True
            self._channel = lifecycle.channel
            lifecycle.epochs = self.params.get("epochs")
            lifecycle.steps = self.params.get("steps")
            self._watchdog = _FitWatchdog(self.model, self._on_fit_lost)
            lifecycle.add_tick_hook(self._watchdog.check)
        try:
            lifecycle.store.acquire()  # checked and locked before the first step
        except BaseException as error:
            self._finish(RunState.FAILED, f"Could not use the checkpoint folder: {error}")
            raise
        try:
            if self.resume:
                self._resumption = resume_from_latest(self.model, lifecycle.store, on_skip=self._report_skipped)
                self._epoch = self._resumption.epoch
                lifecycle.global_step = optimizer_step(self.model)
                lifecycle.log("info", self._resumption.message)
                self._say(self._resumption.message)
        except BaseException as error:
            self._finish(RunState.FAILED, f"Could not resume: {error}")
            raise
        if self.handle_sigint:
            self._sigint = SigintGuard(self._on_first_sigint, self._on_second_sigint)
            self._sigint.install()
        if lifecycle.state == RunState.STARTING:
            lifecycle.set_state(RunState.RUNNING)
        if self._owns_lifecycle:
            self._say(f"Run {lifecycle.name!r} is listening: `jupyter-traincontrol send {lifecycle.name} stop` or `echo stop > {self.fifo}`.")
        if lifecycle.state == RunState.STOPPING:  # the run was stopped before this fit
            self.model.stop_training = True
        else:  # commands sent while no fit ran act before the first batch
            self._apply_pending(mid_epoch=False)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._step = 0
        self._stopped_mid_epoch = False
        lifecycle = self.lifecycle
        lifecycle.epoch = epoch + 1
        lifecycle.step = 0
        lifecycle.touch()
        self._apply_pending(mid_epoch=False)

    def on_train_batch_end(self, batch, logs=None):
        # The hot path: plain assignments and one flag check.
        self._boundary += 1
        self._step = batch + 1
        lifecycle = self.lifecycle
        lifecycle.step = self._step
        lifecycle.metrics = logs or lifecycle.metrics
        lifecycle.loss_curve.add(logs.get("loss") if logs else None)
        lifecycle.touch()
        if self._channel.pending:
            self._apply_pending(mid_epoch=True)

    def on_test_batch_end(self, batch, logs=None):
        # Validation inside fit: commands act now, not only after it.
        if self._in_fit:
            self._apply_pending(mid_epoch=False)

    def on_epoch_end(self, epoch, logs=None):
        lifecycle = self.lifecycle
        if lifecycle.steps is None and not self._stopped_mid_epoch:
            lifecycle.steps = self._step  # learned from the first full epoch
        lifecycle.record_epoch(epoch, logs)
        if logs:
            lifecycle.metrics = dict(logs)
        self._apply_pending(mid_epoch=False)

    def on_train_end(self, logs=None):
        final = {Command.ABORT: RunState.ABORTED, Command.STOP: RunState.STOPPED}.get(self._ended_by, RunState.FINISHED)
        self._finish(final)

    # Commands --------------------------------------------------------------

    def _apply_pending(self, mid_epoch: bool) -> None:
        channel = self._channel
        if channel is None or not channel.pending:
            return
        self._mid_epoch = mid_epoch
        while (request := channel.pop()) is not None:
            self._apply(request)
        self.lifecycle.publish(force=True)  # once for the lot: senders see their acks now

    def _apply(self, request: Request) -> None:
        """Applies one request and acknowledges it (each applier returns its
        outcome, or None when it acknowledged the request itself)."""
        lifecycle = self.lifecycle
        lifecycle.log("command", f"{request.command} received")
        answer = self._appliers[request.command](request)
        if answer is not None:
            lifecycle.acknowledge(request, *answer)

    def _save(self, _request: Request) -> tuple[str, str]:
        if self._last_save is not None and self._last_save[0] == self._boundary:
            return "applied", f"merged with the save just taken: {self._last_save[1]}"
        return self._checkpoint("save")

    def _stop(self, _request: Request) -> tuple[str, str]:
        if self._ended_by is not None:
            return _ignored(self.lifecycle, "Already stopping; 'stop' ignored.")
        outcome, message = self._checkpoint("interrupt" if self._interrupted else "stop")
        self._end_fit(Command.STOP)
        return outcome, message if outcome == "applied" else f"stopping without a checkpoint: {message}"

    def _abort(self, _request: Request) -> tuple[str, str]:
        if self._ended_by is Command.ABORT:
            return _ignored(self.lifecycle, "Already aborting; 'abort' ignored.")
        self._end_fit(Command.ABORT)
        return "applied", "aborting without a checkpoint"

    def _end_fit(self, command: Command) -> None:
        steps = self.lifecycle.steps
        self._stopped_mid_epoch = self._stopped_mid_epoch or (self._mid_epoch and (steps is None or self._step < steps))
        self._ended_by = command
        self.model.stop_training = True
        self.lifecycle.set_state(RunState.STOPPING)

    def _hold(self, pause: Request) -> None:
        """Pauses the training thread here until ``resume``, ``stop`` or ``abort``."""
        lifecycle, channel = self.lifecycle, self._channel
        lifecycle.set_state(RunState.PAUSED)
        lifecycle.acknowledge(pause, "applied", "paused")
        self._say(f"Run {lifecycle.name!r} paused; send 'resume' to go on.")
        lifecycle.publish(force=True)
        while self._channel is not None:  # None once the run was ended meanwhile
            request = channel.get(_PAUSE_POLL_SECONDS)
            if request is None:
                continue
            if request.command is Command.RESUME:
                lifecycle.log("command", "resume received")
                lifecycle.set_state(RunState.RUNNING)
                lifecycle.acknowledge(request, "applied", "resumed")
                return
            if request.command is Command.PAUSE:
                lifecycle.acknowledge(request, *_ignored(lifecycle, "Already paused; 'pause' ignored."))
            else:
                self._apply(request)
            lifecycle.publish(force=True)  # the sender sees its ack now
            if self._ended_by is not None:
                return

    def _position(self) -> TrainingPosition:
        steps = self.lifecycle.steps
        if self._mid_epoch:
            complete = steps is not None and self._step >= steps
        else:
            complete = self._step > 0 and not self._stopped_mid_epoch
        return TrainingPosition(
            epoch=self._epoch,
            step_in_epoch=self._step,
            steps_per_epoch=steps,
            global_step=optimizer_step(self.model),
            epoch_complete=complete,
        )

    def _checkpoint(self, reason: str) -> tuple[str, str]:
        """Writes a checkpoint. Returns the outcome and what it wrote (or why not)."""
        lifecycle = self.lifecycle
        position = self._position()
        try:
            checkpoint = lifecycle.store.save(
                self.model, position, reason=reason, metrics=lifecycle.metrics, run=lifecycle.name
            )
        except CheckpointError as error:
            lifecycle.log("error", str(error))
            self._say(str(error), stream=sys.stderr)
            return "failed", str(error)
        lifecycle.global_step = position.global_step
        lifecycle.add_checkpoint(checkpoint)
        self._last_save = (self._boundary, str(checkpoint.path))
        self._say(f"Checkpoint ({reason}) written: {checkpoint.path}")
        return "applied", f"checkpoint written: {checkpoint.path}"

    def _report_skipped(self, skipped: SkippedCheckpoint) -> None:
        message = f"Resume skipped {skipped.path.name}: {skipped.reason}"
        self.lifecycle.log("warning", message)
        self._say(message, stream=sys.stderr)

    # Interrupts ------------------------------------------------------------

    def _on_first_sigint(self) -> None:
        # In a signal handler: no printing through sys.stdout (not reentrant).
        self.note_interrupt()
        try:
            self.lifecycle.send(Command.STOP)
        except Exception:
            if self._channel is not None:
                self._channel.inject(Command.STOP)
        _write_stderr("\n[traincontrol] Ctrl+C: stopping after this batch, with a checkpoint. "
                      "Press Ctrl+C again to interrupt at once.\n")

    def _on_second_sigint(self) -> None:
        self._finish(RunState.FAILED, "KeyboardInterrupt: a second Ctrl+C interrupted fit.")

    # End -------------------------------------------------------------------

    def _on_fit_lost(self) -> None:
        self._finish(RunState.FAILED, "fit raised an exception; on_train_end never ran.")

    def _finish(self, final_state: RunState, error: str | None = None) -> None:
        with self._lock:
            if not self._in_fit:
                return
            self._in_fit = False
            lifecycle = self.lifecycle
            if self._watchdog is not None:
                lifecycle.remove_tick_hook(self._watchdog.check)
                self._watchdog = None
            if self._resumption is not None:
                self._resumption.undo()
            if lifecycle.store is not None:
                lifecycle.store.release()
            if self._sigint is not None:
                self._sigint.retire()
            if self._owns_lifecycle:
                lifecycle.close(final_state, error)
                self._say(f"Run {lifecycle.name!r} {final_state}.")
            elif error is not None:
                lifecycle.log("error", error)
            self._channel = None

    def _say(self, message: str, stream=None) -> None:
        if self.verbose:
            print(f"[traincontrol] {message}", file=stream or sys.stdout, flush=True)


class _FitWatchdog:
    """Notices a `fit` that left by an exception (Keras then skips
    ``on_train_end``): checked from the run's publisher thread.

    Args:
        model: The model whose `fit` called the callback's first hook.
        on_lost: Called once the `fit` frame is no longer on its thread's stack.
    """

    def __init__(self, model, on_lost):
        self._thread_id = threading.get_ident()
        self._frame = _find_fit_frame(model)
        self._on_lost = on_lost

    def check(self) -> None:
        if self._frame is None:
            return
        frame = sys._current_frames().get(self._thread_id)
        while frame is not None:
            if frame is self._frame:
                return
            frame = frame.f_back
        self._frame = None
        self._on_lost()


def _ignored(lifecycle: RunLifecycle, message: str) -> tuple[str, str]:
    """Logs why a request changed nothing, and says so as its outcome."""
    lifecycle.log("info", message)
    return "ignored", message


def _find_fit_frame(model):
    """Returns the frame of the `fit` call that is training `model`, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            return frame
        frame = frame.f_back
    return None


def _write_stderr(text: str) -> None:
    try:
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:
        pass
