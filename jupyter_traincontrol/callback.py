"""`ControlCallback`: a Keras callback that obeys stop, save, abort, pause, resume, set, rollback.

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

from . import random_state
from .actions import CommandActions, FitProgress
from .checkpoint import SkippedCheckpoint
from .commands import Command, Request, RunState
from .data_order import DataOrder
from .distributed import Job, current_job
from .fit_watchdog import FitWatchdog
from .interrupt import SigintGuard
from .lifecycle import RunLifecycle
from .nan_policy import DEFAULT_MAX_ROLLBACKS, NanPolicy, check_policy
from .resume import Resumption, optimizer_step, resume_from_latest
from .steering import Steering
from .tunables import check_user_tunables

__all__ = ["ControlCallback"]


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
        save_in_background: Hold training only while the variables are
            copied to host memory, and write ``save`` checkpoints on a
            writer thread (one at a time; saves asked for meanwhile are
            merged into the next). Costs one host copy of the model's and
            optimizer's variables, kept from the first ``save`` to the end
            of `fit` and reused by each save. False: write on the training
            thread (no copy). Defaults to True. A job's saves (`job`) are
            always written on the training thread: every process takes each
            one at the agreed step, in step with process 0's write.
        tunables: Names to Keras variables the model reads (a dropout
            rate, a loss weight) that ``set NAME=VALUE`` may change, next to
            the optimizer's hyperparameters. Defaults to none.
        on_nan: What a batch whose loss is not finite does: ``"stop"``
            (end `fit` without a checkpoint: the newest one stays the last
            finite one), ``"rollback"`` (load the newest checkpoint, halve
            the learning rate, go on; at most `nan_rollbacks` times, then
            stop) or ``"ignore"``. Whatever the policy, no checkpoint of
            non-finite weights is ever written. Defaults to ``"stop"``.
        nan_rollbacks: Rollbacks ``on_nan="rollback"`` makes in one `fit`
            before it stops. Defaults to 3.

    Example:

    >>> callback = ControlCallback(name="demo", checkpoint_dir="ckpt")   # doctest: +SKIP
    >>> history = model.fit(x, y, epochs=10, callbacks=[callback])       # doctest: +SKIP
    >>> callback.state, callback.checkpoints                              # doctest: +SKIP
    ('stopped', [PosixPath('ckpt/ckpt-000001-epoch0004-step000012.keras')])
    """

    #: Not async-safe, on purpose. On backends Keras marks thread-safe (JAX,
    #: torch), `fit` runs the batch-end hooks on a thread pool while the next
    #: step trains, unless a callback that overrides them says otherwise; ours
    #: does, so the whole callback list is called on the training thread, as
    #: on TensorFlow. A command must act between two steps: ``stop`` sets
    #: ``stop_training`` after step N, which the trainer checks right after
    #: this hook (from the pool it would stop after N+1 or N+2); a checkpoint
    #: reads the variables of step N (from the pool it would race with step
    #: N+1, and on JAX with the trainer taking its state back out of the
    #: model); ``pause`` holds the training thread itself. The hook costs a
    #: flag check; what the synchronous calls cost is measured per backend by
    #: ``benchmarks/overhead.py`` (the "no-op batch hook" variant).
    async_safe = False

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
        save_in_background: bool = True,
        tunables: dict | None = None,
        on_nan: str = "stop",
        nan_rollbacks: int = DEFAULT_MAX_ROLLBACKS,
        job: Job | bool | None = None,
    ):
        super().__init__()
        # A multi-process JAX job: commands agreed across its processes.
        self._job = current_job() if job is None or job is True else (job or None)
        self.tunables = check_user_tunables(tunables)
        self.on_nan = check_policy(on_nan, nan_rollbacks)
        self.nan_rollbacks = nan_rollbacks
        self.resume = bool(resume)
        self.handle_sigint = handle_sigint
        self.verbose = verbose
        self.save_in_background = bool(save_in_background)
        self._owns_lifecycle = lifecycle is None
        self.lifecycle = lifecycle or RunLifecycle(
            name, checkpoint_dir, keep, channel_kind=channel_kind, registry=self._job.registry() if self._job else None
        )
        self._lock = threading.RLock()
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
        return self.lifecycle.checkpoint_paths()

    @property
    def fifo(self) -> str | None:
        """Where to write commands while the run listens."""
        return self.lifecycle.address

    @property
    def ended_by(self) -> Command | None:
        """``stop`` or ``abort`` if that command ended the last (or current) `fit`."""
        return self._actions.ended_by if self._actions is not None else None

    def send(self, command: str | Command | Request) -> Request:
        """Sends a command to the run (from any thread), like any writer."""
        return self.lifecycle.send(command)

    def note_interrupt(self) -> None:
        """Marks the next stop as caused by an interrupt (its checkpoint's
        reason becomes ``interrupt``). Safe from any thread."""
        self._interrupted = True
        if self._actions is not None:
            self._actions.interrupted = True

    # Keras hooks ---------------------------------------------------------

    def _reset(self) -> None:
        self._progress = FitProgress()
        self._actions: CommandActions | None = None
        self._steering: Steering | None = None
        self._nan_policy: NanPolicy | None = None
        self._interrupted = False
        self._in_fit = False
        self._resumption: Resumption | None = None
        self._data_order: DataOrder | None = None
        self._sigint: SigintGuard | None = None
        self._lost_because: str | None = None  # why `fit` left without on_train_end, if we know
        self._watchdog: FitWatchdog | None = None

    def on_train_begin(self, logs=None):
        with self._lock:
            if self._in_fit:
                self._finish(RunState.FAILED, "A new fit began before the previous one ended.")
            self._reset()
            lifecycle = self.lifecycle
            if self._owns_lifecycle:
                if self._job is not None:
                    self._job.begin(lifecycle)
                lifecycle.open()
            elif not lifecycle.is_open:
                raise RuntimeError(f"The RunLifecycle given for run {lifecycle.name!r} is not open.")
            self._in_fit = True
            self._lost_because = None
            self._actions = self._make_actions()
            lifecycle.epochs = self.params.get("epochs")
            lifecycle.steps = self.params.get("steps")
            self._watchdog = FitWatchdog(self.model, self._on_fit_lost)
            lifecycle.add_tick_hook(self._watchdog.check)
            if self._job is not None:
                self._join_job()
        self._data_order = DataOrder.find()  # counts what orders the data (exact resume)
        if self._data_order is not None:
            self._data_order.attach()
            self._progress.data_order = self._data_order
        try:
            lifecycle.store.acquire()  # checked and locked before the first step
            if self.resume:
                self._resume()
        except BaseException as error:
            self._finish(RunState.FAILED, f"Could not start: {error}")
            raise
        self._begin_steering()
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
            self._actions.apply_pending(mid_epoch=False)

    def on_epoch_begin(self, epoch, logs=None):
        progress = self._progress
        progress.epoch, progress.step, progress.stopped_mid_epoch = epoch, 0, False
        progress.random_at_epoch_start = random_state.capture_epoch_start()  # what orders this epoch's data
        if self._data_order is not None:
            self._data_order.epoch_began()
        lifecycle = self.lifecycle
        lifecycle.epoch = epoch + 1
        lifecycle.step = 0
        lifecycle.touch()
        self._actions.apply_pending(mid_epoch=False)

    def on_train_batch_end(self, batch, logs=None):
        # The hot path: plain assignments and one flag check.
        progress = self._progress
        progress.boundary += 1
        progress.step = batch + 1
        lifecycle = self.lifecycle
        lifecycle.step = progress.step
        lifecycle.metrics = logs or lifecycle.metrics
        loss = logs.get("loss") if logs else None
        lifecycle.loss_curve.add(loss)
        lifecycle.touch()
        if loss is not None and loss - loss != 0:  # NaN or infinite (Keras made it a float already)
            self._on_non_finite_loss(loss, batch)
        if self._actions.pending:
            self._actions.apply_pending(mid_epoch=True)

    def on_test_batch_end(self, batch, logs=None):
        # Validation inside fit: commands act now, not only after it.
        if self._in_fit:
            self._progress.in_validation = True
            self._actions.apply_pending(mid_epoch=False)

    def on_epoch_end(self, epoch, logs=None):
        self._progress.in_validation = False
        lifecycle = self.lifecycle
        if lifecycle.steps is None and not self._progress.stopped_mid_epoch:
            lifecycle.steps = self._progress.step  # learned from the first full epoch
        if self._steering is not None and logs is not None:
            self._steering.add_to_logs(logs)  # as ReduceLROnPlateau does: History keeps them
        lifecycle.record_epoch(epoch, logs)
        if logs:
            lifecycle.metrics = dict(logs)
        self._actions.apply_pending(mid_epoch=False)

    def on_train_end(self, logs=None):
        final = {Command.ABORT: RunState.ABORTED, Command.STOP: RunState.STOPPED}.get(self.ended_by, RunState.FINISHED)
        self._finish(final)

    # Steering: set, rollback, on_nan ------------------------------------------

    def _make_actions(self) -> CommandActions:
        lifecycle = self.lifecycle
        self._steering = Steering(self.model, lifecycle, self._progress, self._say, self.tunables)
        actions = CommandActions(self.model, lifecycle, self._progress, self._say,
                                 # A job's processes save in step (process 0 writes, the others take part
                                 # in the collectives of the serialization and wait): on the training thread.
                                 save_in_background=self.save_in_background and self._job is None,
                                 steering=self._steering,
                                 sync=self._sync_model)
        self._nan_policy = NanPolicy(
            self.on_nan, self._steering, actions.stop_without_checkpoint, self._say, self.nan_rollbacks
        )
        return actions

    def _begin_steering(self) -> None:
        resumed = self._resumption.checkpoint if self._resumption is not None else None
        self._steering.begin(resumed)

    def _on_non_finite_loss(self, loss, batch: int) -> None:
        if self._in_fit and self._nan_policy is not None:
            self._nan_policy.on_non_finite(loss, self._progress.epoch, batch)

    def _sync_model(self) -> None:
        # On JAX, reading `Callback.model` copies the trainer's state into
        # the model's variables (a cost paid only when a command waits).
        self.model  # noqa: B018

    # Resume ----------------------------------------------------------------

    def _resume(self) -> None:
        lifecycle = self.lifecycle
        self._resumption = resume_from_latest(self.model, lifecycle.store, on_skip=self._report_skipped,
                                              data_order=self._data_order)
        self._progress.epoch = self._resumption.epoch
        lifecycle.global_step = optimizer_step(self.model)
        lifecycle.log("info", self._resumption.message)
        self._say(self._resumption.message)
        for difference in self._resumption.differences:  # said once, at resume; a warning reaches
            lifecycle.log("warning", difference)          # stderr through `logging` even when not verbose

    def _report_skipped(self, skipped: SkippedCheckpoint) -> None:
        message = f"Resume skipped {skipped.path.name}: {skipped.reason}"
        self.lifecycle.log("warning", message)
        self._say(message, stream=sys.stderr)

    # Jobs across processes -------------------------------------------------

    def _join_job(self) -> None:
        """Commands of a multi-process job: proposed to all, applied by all at one step."""
        job = self._job
        job.opened(self.lifecycle, self.model, lambda message: self._finish(RunState.FAILED, message))
        self._actions.take_from(job.channel(self.lifecycle.channel, self._progress))

    def _leave_job(self, final_state: RunState, error: str | None) -> str | None:
        """Leaves the job; returns the error to record (led by a lost process, if any)."""
        job = self._job
        error = job.end(final_state, error)
        for request in job.undelivered():
            self.lifecycle.acknowledge(request, "ignored", "fit ended before the step the job agreed on")
        return error

    # Interrupts ------------------------------------------------------------

    def _on_first_sigint(self) -> None:
        # In a signal handler: no printing through sys.stdout (not reentrant).
        self.note_interrupt()
        try:
            self.lifecycle.send(Command.STOP)
        except Exception:
            channel = self.lifecycle.channel
            if channel is not None:
                channel.inject(Command.STOP)
        _write_stderr("\n[traincontrol] Ctrl+C: stopping after this batch, with a checkpoint. "
                      "Press Ctrl+C again to interrupt at once.\n")

    def _on_second_sigint(self) -> None:
        # In a signal handler, on the main thread, which may hold any lock (a
        # record write, a save): ending the run here could wait on a thread that
        # waits on that lock. Only note why; the `KeyboardInterrupt` that follows
        # leaves `fit`, and the watchdog ends the run from the publisher thread.
        self._lost_because = "KeyboardInterrupt: a second Ctrl+C interrupted fit."

    # End -------------------------------------------------------------------

    def _on_fit_lost(self) -> None:
        self._finish(RunState.FAILED, self._lost_because or "fit raised an exception; on_train_end never ran.")

    def _finish(self, final_state: RunState, error: str | None = None) -> None:
        with self._lock:
            if not self._in_fit:
                return
            self._in_fit = False
            lifecycle = self.lifecycle
            if self._watchdog is not None:
                lifecycle.remove_tick_hook(self._watchdog.check)
                self._watchdog = None
            if self._job is not None:
                error = self._leave_job(final_state, error)
            if self._actions is not None:
                self._actions.detach()
            if self._resumption is not None:
                self._resumption.undo()
            if self._data_order is not None:
                self._data_order.detach()
            if lifecycle.store is not None:
                lifecycle.store.release()
            if self._sigint is not None:
                self._sigint.retire()
            if self._owns_lifecycle:
                lifecycle.close(final_state, error)
                self._say(f"Run {lifecycle.name!r} {final_state}.")
            elif error is not None:
                lifecycle.log("error", error)

    def _say(self, message: str, stream=None) -> None:
        if self.verbose:
            print(f"[traincontrol] {message}", file=stream or sys.stdout, flush=True)


def _write_stderr(text: str) -> None:
    try:
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:
        pass
