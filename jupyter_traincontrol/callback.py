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

from .checkpoint import Checkpoint, CheckpointError, TrainingPosition, restore_weights
from .commands import Command
from .control import RunControl
from .interrupt import SigintGuard
from .resume import BatchSkipper, can_skip_batches

__all__ = ["ControlCallback"]

_PAUSE_POLL_SECONDS = 0.25


class ControlCallback(keras.callbacks.Callback):
    """Lets a running `fit` be stopped, checkpointed, aborted or paused.

    At train begin the callback lists the run in the registry and opens its
    command channel (a FIFO); at each batch boundary it applies waiting
    commands; at train end it records the final state and closes the
    channel. An instance can be reused for several `fit` calls.

    | command  | at the next batch boundary                         |
    |----------|----------------------------------------------------|
    | `save`   | write a checkpoint; training goes on               |
    | `stop`   | write a checkpoint, then end `fit` gracefully      |
    | `abort`  | end `fit` gracefully without a checkpoint          |
    | `pause`  | hold the training thread (`save`/`stop`/`abort` still act) |
    | `resume` | let a paused run go on                             |

    Args:
        name: The run's name, unique among live runs: 1-64 letters, digits,
            ``.``, ``_`` or ``-``. Defaults to the first free ``run-N``.
        checkpoint_dir: Folder for checkpoints. Defaults to
            ``checkpoints/NAME`` in the current directory.
        keep: How many of the newest checkpoints to keep. Defaults to 3.
        resume: Load the latest checkpoint of `checkpoint_dir` before the
            first batch and continue at its epoch and batch. With no
            checkpoint yet, training starts from scratch (and says so).
            Defaults to False.
        handle_sigint: When `fit` runs on the main thread, make the first
            Ctrl+C a graceful stop. Defaults to True.
        verbose: Print one line when the run starts, resumes or ends, and
            for every checkpoint. Defaults to True.
        control: An open `RunControl` to use instead of creating one (used
            by `%%interruptible_fit`, where one run spans the whole cell).
            The callback then neither opens nor closes it.
        channel_kind: ``"fifo"`` or ``"spool"``. Defaults to ``"fifo"``
            where the platform has FIFOs.

    Example:

    >>> callback = ControlCallback(name="demo", checkpoint_dir="ckpt")   # doctest: +SKIP
    >>> history = model.fit(x, y, epochs=10, callbacks=[callback])       # doctest: +SKIP
    >>> callback.state, callback.checkpoints                              # doctest: +SKIP
    ('stopped', [PosixPath('ckpt/ckpt-000001-epoch0003-step000012.keras')])
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
        control: RunControl | None = None,
        channel_kind: str | None = None,
    ):
        super().__init__()
        self.resume = bool(resume)
        self.handle_sigint = handle_sigint
        self.verbose = verbose
        self._owns_control = control is None
        self._control = control or RunControl(name, checkpoint_dir, keep, channel_kind=channel_kind)
        self._lock = threading.RLock()
        self._reset()

    # Public view ---------------------------------------------------------

    @property
    def control(self) -> RunControl:
        """The run's `RunControl` (name, state, record, channel)."""
        return self._control

    @property
    def name(self) -> str | None:
        """The run's name (known once training has begun, if defaulted)."""
        return self._control.name

    @property
    def state(self) -> str:
        """The run's state: ``starting`` ... ``stopped``, ``finished``, ..."""
        return self._control.state

    @property
    def checkpoints(self) -> list[Path]:
        """Paths of the run's complete checkpoints, oldest first."""
        return [checkpoint.path for checkpoint in self._control.checkpoints()]

    @property
    def fifo(self) -> str | None:
        """Where to write commands while the run listens."""
        channel = self._control.channel
        return channel.address if channel is not None else None

    @property
    def stop_requested(self) -> bool:
        """True if the last (or current) `fit` was ended by `stop`."""
        return self._stop_requested

    @property
    def abort_requested(self) -> bool:
        """True if the last (or current) `fit` was ended by `abort`."""
        return self._abort_requested

    def send(self, command: str | Command) -> Command:
        """Sends a command to the run (from any thread), like any writer."""
        return self._control.send(command)

    def note_interrupt(self) -> None:
        """Marks the next stop as caused by an interrupt (its checkpoint's
        reason becomes ``interrupt``). Safe from any thread."""
        self._interrupted = True

    # Keras hooks ---------------------------------------------------------

    def _reset(self) -> None:
        self._channel = None
        self._epoch = 0
        self._step = 0
        self._stop_requested = False
        self._abort_requested = False
        self._interrupted = False
        self._stopped_mid_epoch = False
        self._in_fit = False
        self._skipper: BatchSkipper | None = None
        self._initial_epoch_to_restore = None
        self._sigint: SigintGuard | None = None
        self._fit_frame = None
        self._fit_thread_id: int | None = None

    def on_train_begin(self, logs=None):
        with self._lock:
            if self._in_fit:
                self._finish("failed", "A new fit began before the previous one ended.")
            self._reset()
            control = self._control
            if self._owns_control:
                control.open()
            elif not control.is_open:
                raise RuntimeError(f"The RunControl given for run {control.name!r} is not open.")
            self._in_fit = True
            self._channel = control.channel
            control.epochs = self.params.get("epochs")
            control.steps = self.params.get("steps")
            self._fit_thread_id = threading.get_ident()
            self._fit_frame = _find_fit_frame(self.model)
            control.add_tick_hook(self._watch_fit)
        try:
            if self.resume:
                self._resume()
        except BaseException as error:
            self._finish("failed", f"Could not resume: {error}")
            raise
        if self.handle_sigint:
            self._sigint = SigintGuard(self._on_first_sigint, self._on_second_sigint)
            self._sigint.install()
        if self._owns_control:
            control.set_state("running")
            self._say(f"Run {control.name!r} is listening: `jupyter-traincontrol send {control.name} stop` or `echo stop > {self.fifo}`.")
        elif control.state == "starting":
            control.set_state("running")
        if control.state == "stopping":  # the run was stopped before this fit
            self.model.stop_training = True
        elif self._channel.pending:  # sent while no fit ran: act before the first batch
            self._apply_commands(mid_epoch=False)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._step = 0
        self._stopped_mid_epoch = False
        control = self._control
        control.epoch = epoch + 1
        control.step = 0
        control.touch()
        if self._channel is not None and self._channel.pending:
            self._apply_commands(mid_epoch=False)

    def on_train_batch_end(self, batch, logs=None):
        # The hot path: plain assignments and one flag check.
        self._step = batch + 1
        control = self._control
        control.step = self._step
        control.metrics = logs or control.metrics
        control.loss_curve.add(logs.get("loss") if logs else None)  # front: per-batch loss series
        control.touch()
        if self._channel.pending:
            self._apply_commands(mid_epoch=True)

    def on_test_batch_end(self, batch, logs=None):
        # Validation inside fit: commands act now, not only after it.
        if self._in_fit and self._channel is not None and self._channel.pending:
            self._apply_commands(mid_epoch=False)

    def on_epoch_end(self, epoch, logs=None):
        control = self._control
        if control.steps is None and not self._stopped_mid_epoch:
            control.steps = self._step  # learned from the first full epoch
        control.record_epoch(epoch, logs)
        if logs:
            control.metrics = dict(logs)
        if self._channel is not None and self._channel.pending:
            self._apply_commands(mid_epoch=False)

    def on_train_end(self, logs=None):
        if self._abort_requested:
            final = "aborted"
        elif self._stop_requested:
            final = "stopped"
        else:
            final = "finished"
        self._finish(final)

    # Commands --------------------------------------------------------------

    def _apply_commands(self, mid_epoch: bool) -> None:
        while (command := self._channel.pop()) is not None:
            self._apply(command, mid_epoch)

    def _apply(self, command: Command, mid_epoch: bool) -> None:
        control = self._control
        control.log("command", f"{command} received")
        if command is Command.SAVE:
            self._checkpoint("save", mid_epoch)
        elif command is Command.STOP:
            self._request_stop(mid_epoch)
        elif command is Command.ABORT:
            self._request_abort(mid_epoch)
        elif command is Command.PAUSE:
            self._hold(mid_epoch)
        elif command is Command.RESUME:
            control.log("info", "The run is not paused; 'resume' ignored.")

    def _ending(self) -> bool:
        return self._stop_requested or self._abort_requested

    def _request_stop(self, mid_epoch: bool) -> None:
        if self._ending():
            self._control.log("info", "Already stopping; 'stop' ignored.")
            return
        reason = "interrupt" if self._interrupted else "stop"
        self._checkpoint(reason, mid_epoch)
        self._stop_requested = True
        self._end_fit(mid_epoch)

    def _request_abort(self, mid_epoch: bool) -> None:
        if self._abort_requested:
            return
        self._abort_requested = True
        self._end_fit(mid_epoch)

    def _end_fit(self, mid_epoch: bool) -> None:
        steps = self._control.steps
        self._stopped_mid_epoch = self._stopped_mid_epoch or (mid_epoch and (steps is None or self._step < steps))
        self.model.stop_training = True
        self._control.set_state("stopping")

    def _hold(self, mid_epoch: bool) -> None:
        control = self._control
        control.set_state("paused")
        self._say(f"Run {control.name!r} paused; send 'resume' to go on.")
        channel = self._channel
        while True:
            if not channel.wait(_PAUSE_POLL_SECONDS):
                continue
            command = channel.pop()
            if command is None:
                continue
            if command is Command.RESUME:
                control.log("command", "resume received")
                control.set_state("running")
                return
            if command is Command.PAUSE:
                control.log("info", "Already paused; 'pause' ignored.")
                continue
            self._apply(command, mid_epoch)
            if self._ending():
                return

    def _position(self, mid_epoch: bool) -> TrainingPosition:
        steps = self._control.steps
        if mid_epoch:
            complete = steps is not None and self._step >= steps
        else:
            complete = self._step > 0 and not self._stopped_mid_epoch
        return TrainingPosition(
            epoch=self._epoch,
            step_in_epoch=self._step,
            steps_per_epoch=steps,
            global_step=_optimizer_step(self.model),
            epoch_complete=complete,
        )

    def _checkpoint(self, reason: str, mid_epoch: bool) -> Checkpoint | None:
        control = self._control
        position = self._position(mid_epoch)
        try:
            checkpoint = control.store.save(
                self.model, position, reason=reason, metrics=control.metrics, run=control.name
            )
        except CheckpointError as error:
            control.log("error", str(error))
            self._say(str(error), stream=sys.stderr)
            return None
        control.global_step = position.global_step
        control.log("checkpoint", f"{reason}: {checkpoint.path}")
        self._say(f"Checkpoint ({reason}) written: {checkpoint.path}")
        return checkpoint

    # Resume ----------------------------------------------------------------

    def _resume(self) -> None:
        control = self._control
        latest = control.store.latest()
        if latest is None:
            self._say(f"No checkpoint in {control.store.directory} yet: starting from scratch.")
            return
        restore_weights(self.model, latest)
        position = latest.position
        self._initial_epoch_to_restore = (getattr(self.model, "_initial_epoch", None),)
        self.model._initial_epoch = position.resume_epoch
        self._epoch = position.resume_epoch
        skipped = ""
        if position.resume_step:
            backend = keras.backend.backend()
            if can_skip_batches(backend):
                self._skipper = BatchSkipper(self.model, position.resume_step, latest.info.get("metrics", {}), backend)
                self._skipper.install()
                skipped = f", skipping its first {position.resume_step} batches (already trained)"
            else:
                skipped = f"; backend {backend!r} repeats its first {position.resume_step} batches"
        control.global_step = _optimizer_step(self.model)
        message = (
            f"Resumed from {latest.path}: epoch {position.resume_epoch + 1}{skipped}; "
            f"optimizer step {control.global_step}."
        )
        control.log("info", message)
        self._say(message)

    # Interrupts ------------------------------------------------------------

    def _on_first_sigint(self) -> None:
        # In a signal handler: no printing through sys.stdout (not reentrant).
        self.note_interrupt()
        try:
            self._control.send(Command.STOP)
        except Exception:
            if self._channel is not None:
                self._channel.inject(Command.STOP)
        _write_stderr("\n[traincontrol] Ctrl+C: stopping after this batch, with a checkpoint. "
                      "Press Ctrl+C again to interrupt at once.\n")

    def _on_second_sigint(self) -> None:
        self._finish("failed", "KeyboardInterrupt: a second Ctrl+C interrupted fit.")

    # End -------------------------------------------------------------------

    def _watch_fit(self) -> None:
        """Reader-thread check: did fit leave without calling on_train_end?"""
        target, thread_id = self._fit_frame, self._fit_thread_id
        if target is None or not self._in_fit:
            return
        frame = sys._current_frames().get(thread_id)
        while frame is not None:
            if frame is target:
                return
            frame = frame.f_back
        self._finish("failed", "fit raised an exception; on_train_end never ran.")

    def _finish(self, final_state: str, error: str | None = None) -> None:
        with self._lock:
            if not self._in_fit:
                return
            self._in_fit = False
            control = self._control
            control.remove_tick_hook(self._watch_fit)
            self._fit_frame = None
            if self._skipper is not None:
                self._skipper.uninstall()
            if self._initial_epoch_to_restore is not None:
                self.model._initial_epoch = self._initial_epoch_to_restore[0]
            if self._sigint is not None:
                self._sigint.retire()
            if self._owns_control:
                control.close(final_state, error)
                self._say(f"Run {control.name!r} {final_state}.")
            elif error is not None:
                control.log("error", error)
            self._channel = None

    def _say(self, message: str, stream=None) -> None:
        if self.verbose:
            print(f"[traincontrol] {message}", file=stream or sys.stdout, flush=True)


def _find_fit_frame(model):
    """Returns the frame of the `fit` call that is training `model`, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            return frame
        frame = frame.f_back
    return None


def _optimizer_step(model) -> int | None:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return None
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


def _write_stderr(text: str) -> None:
    try:
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:
        pass

