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
second raises ``KeyboardInterrupt`` as usual; SIGTERM (``docker stop``, a
scheduler's preemption) stops with a checkpoint, then the process ends as
SIGTERM asks, once `fit` has returned. Every ten minutes of training
(``autosave``) a checkpoint is written in the background. The batch hook
costs a flag check unless a command waits, and forces no host sync per
step: on JAX and torch Keras may run it on its thread pool (see
``async_safe``).
"""

from __future__ import annotations

import os

import keras

from ..boundary.nan_policy import DEFAULT_MAX_ROLLBACKS, check_policy
from ..boundary.safeguards import DEFAULT_AUTOSAVE_SECONDS, check_autosave
from ..boundary.session import TrainingSession
from ..boundary.tunables import check_user_tunables
from ..job import Job, current_jax_job
from ..protocol import Command, Request, RunState
from ..run import RunLifecycle, RunScope
from ..system.sigterm import DEFAULT_SIGTERM_GRACE, check_sigterm_grace
from . import watchdog
from .adapter import FitAdapter
from .keras2 import Keras2Hooks
from .resume.sources import check_resume_from
from .span import FitSpan

__all__ = ["ControlCallback"]


class ControlCallback(Keras2Hooks, keras.callbacks.Callback):
    """Lets a running `fit` be stopped, checkpointed, aborted or paused.

    At train begin the callback lists the run in the registry and opens its
    command channel (a FIFO); at each batch boundary it applies waiting
    commands (see `protocol.COMMAND_HELP`); at train end a `fit` that ran
    to its end writes a last checkpoint (``save_at_end``), then the run
    records its final state and how it ended, and closes its channel. An
    instance can be reused for several `fit` calls, each a run of its own;
    in a ``with`` block, one run spans every `fit` given it (`fit.span`: for
    code that calls `fit` in a loop). A Keras 2 (``tf_keras``) `fit` takes
    it too (see `fit.keras2` for what differs).

    Args:
        name: The run's name, unique among live runs: 1-64 letters, digits,
            ``.``, ``_`` or ``-``. Defaults to the first free ``run-N``.
        checkpoint_dir: Folder for checkpoints. Defaults to
            ``checkpoints/NAME`` in the current directory.
        keep: How many of the newest checkpoints to keep. Defaults to 3.
        resume: Load the newest checkpoint of this run's name in
            `checkpoint_dir` that loads before the first batch, and continue
            at its epoch and batch. Broken ones are skipped, and said so;
            with none, training starts from scratch (and says so, naming
            the other runs whose checkpoints the folder holds). Defaults to
            False.
        resume_from: Resume from another run's checkpoints instead: a run
            name (its newest checkpoint that loads, in `checkpoint_dir` or
            in the folder its record names) or the path of a checkpoint's
            ``.keras`` file. New checkpoints keep this run's own name.
            Nothing found fails `fit` before its first step, saying what
            was found. Defaults to None.
        save_at_end: When `fit` runs to its end (not stopped, aborted or
            failed), write a last checkpoint (reason ``end``), flushed to
            disk before `fit` returns; a resume from it trains no more
            epochs of a `fit` that had all it asked for. Defaults to True.
        handle_sigint: When `fit` runs on the main thread, make the first
            Ctrl+C a graceful stop. Defaults to True.
        handle_sigterm: When `fit` runs on the main thread of a plain
            process (not a kernel's, whose shutdown stops runs its own way,
            nor a job's, whose SIGTERM is an agreed stop), SIGTERM stops
            after the batch in flight with a checkpoint (reason
            ``interrupt``); `fit` returns as usual, so every callback's
            ``on_train_end`` runs, then the signal goes on to the handler it
            replaced: yours if you installed one, else the process ends,
            killed by SIGTERM (exit status 143). A second SIGTERM, or
            `sigterm_grace` seconds, ends it at once. Defaults to True.
        sigterm_grace: Seconds a SIGTERM's stop may take before the process
            ends at once (exit status 143). Defaults to 20 (``torchrun``
            sends SIGKILL 30 s after SIGTERM).
        autosave: Every this many seconds of training (time ``running``,
            not paused) since the run's newest checkpoint of any kind, a
            checkpoint is taken at the next batch boundary (reason
            ``autosave``), in the background where saves are. The newest two
            autosaves are kept apart from `keep`: they never push out a
            checkpoint you asked for. 0 turns it off; a job has none.
            Defaults to 600 (ten minutes).
        verbose: Print one line when the run starts, resumes or ends, and
            for every checkpoint. Defaults to True.
        lifecycle: An open `run.RunLifecycle` to use instead of creating
            one (used by `%%interruptible_fit`, where one run spans the whole
            cell). The callback then neither opens nor closes it.
        channel_kind: ``"fifo"`` or ``"spool"``. Defaults to ``"fifo"``
            where the platform has FIFOs.
        save_in_background: Hold training only while the variables are
            taken (TensorFlow: a copy-on-write read of each; JAX: the
            trainer's arrays, kept from being donated; torch: a host copy),
            and write ``save`` checkpoints on a writer thread (one at a
            time; saves asked for meanwhile are merged into the next). On
            torch the host copy is kept from the first ``save`` to the end
            of `fit` and reused by each save; on TensorFlow and JAX no copy
            is kept between saves. False: write on the training thread (no
            copy). Defaults to True. A job's saves (`job`) are always
            written on the training thread: every process takes each one at
            the agreed step, in step with process 0's write.
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

    #: Async-safe: on backends Keras marks thread-safe (JAX, torch), `fit`
    #: runs the batch-end hooks on a thread pool while the next step trains,
    #: and never waits for a step's logs (no host sync per step). A command
    #: still acts between two steps on the training thread: while one waits,
    #: the `fit`'s dispatch is switched to synchronous (`dispatch.BatchDispatch`),
    #: so the next batch-end hook runs on the training thread, right after
    #: its step, where ``stop`` ends `fit` at the step of its checkpoint. On
    #: the pool the hook only counts progress and checks the loss (a loss
    #: that is not finite is acted on at the next boundary on the training
    #: thread: a step or a few later).
    async_safe = True

    def __init__(
        self,
        name: str | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        keep: int = 3,
        resume: bool = False,
        *,
        resume_from: str | os.PathLike | None = None,
        save_at_end: bool = True,
        handle_sigint: bool = True,
        verbose: bool = True,
        lifecycle: RunLifecycle | None = None,
        channel_kind: str | None = None,
        save_in_background: bool = True,
        tunables: dict | None = None,
        on_nan: str = "stop",
        nan_rollbacks: int = DEFAULT_MAX_ROLLBACKS,
        job: Job | bool | None = None,
        handle_sigterm: bool = True,
        sigterm_grace: float = DEFAULT_SIGTERM_GRACE,
        autosave: float | None = DEFAULT_AUTOSAVE_SECONDS,
    ):
        super().__init__()
        self.autosave = check_autosave(autosave)
        self.handle_sigterm = handle_sigterm
        self.sigterm_grace = check_sigterm_grace(sigterm_grace)  # checked now, not at train begin
        # A multi-process JAX job: commands agreed across its processes.
        self.job = current_jax_job() if job is None or job is True else (job or None)
        self.tunables = check_user_tunables(tunables)
        self.on_nan = check_policy(on_nan, nan_rollbacks)
        self.nan_rollbacks = nan_rollbacks
        self.resume = bool(resume)
        self.resume_from = check_resume_from(resume_from)
        self.save_at_end = bool(save_at_end)
        self.handle_sigint = handle_sigint
        self.verbose = verbose
        self.save_in_background = bool(save_in_background)
        self.lifecycle = lifecycle or RunLifecycle(
            name, checkpoint_dir, keep, channel_kind=channel_kind, registry=self.job.registry() if self.job else None
        )
        #: The scope of the run this callback's fits drive when it spans several trainings (a with block's, a
        #: notebook cell's, or the run given as `lifecycle`, which its giver opens and closes); None: each fit
        #: is a run of its own, opened and closed by the fit.
        self.scope: RunScope | None = RunScope(lifecycle, resume=self.resume) if lifecycle is not None else None
        self._fit: FitAdapter | None = None  # the fit in progress, or the last one
        self._span: FitSpan | None = None  # the run of the with block this callback is in

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
    def checkpoints(self) -> list:
        """Paths of the run's complete checkpoints, oldest first."""
        return self.lifecycle.checkpoint_paths()

    @property
    def fifo(self) -> str | None:
        """Where to write commands while the run listens."""
        return self.lifecycle.address

    @property
    def adapter(self) -> FitAdapter | None:
        """The `fit` in progress (or the last one): its side of the session."""
        return self._fit

    @property
    def session(self) -> TrainingSession | None:
        """The training session of the `fit` in progress (or of the last one)."""
        return self._fit.session if self._fit is not None else None

    @property
    def ended_by(self) -> Command | None:
        """``stop`` or ``abort`` if that command ended the last (or current) `fit`."""
        session = self.session
        return session.ended_by if session is not None else None

    def end_reason(self, state: RunState | str) -> str | None:
        """How the last `fit` came to end in final `state` (`protocol.END_REASONS`)."""
        fit = self._fit
        if fit is not None and fit.session.actions is not None:
            return fit.end_reason_for(state)
        return None

    def send(self, command: str | Command | Request, sender: str | None = "notebook") -> Request:
        """Sends a command to the run (from any thread), like any writer."""
        return self.lifecycle.send(command, sender=sender)

    def note_interrupt(self) -> None:
        """Marks the next stop as caused by an interrupt (its checkpoint's
        reason becomes ``interrupt``). Safe from any thread."""
        if self._fit is not None:
            self._fit.session.note_interrupt()

    # One run for many fits -----------------------------------------------

    def __enter__(self) -> "ControlCallback":
        """Opens one run for every `fit` given this callback in the with
        block (see `fit.span`): its name, FIFO, record and checkpoint folder
        are taken once, not at each `fit`. A stop or abort ends the block."""
        if self._span is not None:
            raise RuntimeError(f"Run {self.name!r} is already open for a with block of this callback.")
        self._span = FitSpan.open(self)
        return self

    def __exit__(self, kind, error, tb) -> bool:
        span, self._span = self._span, None
        return span.close(kind, error, tb) if span is not None else False

    # Keras hooks ---------------------------------------------------------

    def on_train_begin(self, logs=None):
        previous = self.session
        if previous is not None and not previous.closed:
            previous.close(RunState.FAILED, "A new fit began before the previous one ended.")
        if self._span is not None:
            self._span.fit_begins()
        if self.scope is None:
            watchdog.check_all()  # a run of this process whose fit raised ends now, before a new one claims a name
        fit = self._fit = FitAdapter(self, self.model, self.params)
        fit.session.open()
        fit.session.start()

    def on_epoch_begin(self, epoch, logs=None):
        fit = self._fit
        fit.epoch_began(epoch)
        fit.boundaries.at_boundary(before_step=True)  # Keras runs a step before it checks stop_training

    def on_train_batch_begin(self, batch, logs=None):
        # Always on the training thread: counts the step, and (in a job) waits at an agreed one.
        self._fit.boundaries.batch_began(batch)

    def on_train_batch_end(self, batch, logs=None):
        # The hot path: on Keras's pool, plain assignments; on the training thread, a flag check.
        self._fit.boundaries.batch_ended(batch, logs)

    def on_test_batch_end(self, batch, logs=None):
        # Validation inside fit: commands act now, not only after it.
        fit = self._fit
        if fit is not None and not fit.session.closed:
            fit.session.progress.begin_validation()
            if fit.dispatch.on_training_thread():
                fit.boundaries.at_boundary()

    def on_epoch_end(self, epoch, logs=None):
        fit = self._fit
        fit.boundaries.catch_up()  # the epoch's last steps, if their hooks ran on Keras's pool
        fit.epoch_ended(epoch, logs)
        fit.boundaries.at_boundary()

    def on_train_end(self, logs=None):
        self._fit.train_ended()
        if self._span is not None:
            self._span.fit_ended()
