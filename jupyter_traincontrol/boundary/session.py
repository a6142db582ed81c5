"""One training session for every driver: `fit` (Keras 3 and Keras 2) and `TrainLoop`.

`TrainingSession` owns every part a training holds while it is under
control, in one order for every driver: the run (its own, or a notebook
cell's, open already), a job's share of it when the training is one
process of several, the steering, the saves, the commands' actions and
the NaN policy, the resume, the safeguards (Ctrl+C, SIGTERM, autosave),
each pushed on one `contextlib.ExitStack` as it opens. It ends once, from
whichever thread ends it (the training thread, a watchdog, a job's
watcher, exit), and says what happens in one voice. A new command or
policy is wired here once, and behaves the same under every driver.

A driver is a thin adapter (`Driver`: `fit.adapter.FitAdapter`,
`loop.adapter.LoopAdapter`): it reports its boundaries and says how its
state is read, steered and resumed (`Resumed`), and how its training is
ended; it holds no resume, save or steering logic of its own.

The job (`job.Job`, a layer beside this one) is used through the members
it offers, never imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import threading
from typing import Any, Callable, Mapping, Protocol, Sequence

from ..checkpoint import Checkpoint, CheckpointStore, SkippedCheckpoint, TrainingPosition
from ..protocol import Command, RunState
from ..protocol import end_reason as end_reason_of_state
from ..run.journal import say
from ..run.scope import RunScope
from ..state import random_state
from .actions import CommandActions
from .nan_policy import NanPolicy
from .progress import TrainingProgress
from .safeguards import Safeguards
from .saves import SaveScheduler
from .steering import Steering

__all__ = ["TrainingSession", "Driver", "Resumed", "SessionSettings"]

#: How long the end of a lost job's run waits for an end another thread has
#: begun (a job's end waits at most its ``lost_after``, two heartbeats, and
#: the join of its watcher).
LOST_END_WAIT_SECONDS = 30.0


class SessionSettings(Protocol):
    """What a session reads of its driver's settings (`ControlCallback`'s, `TrainLoop`'s)."""

    resume: bool
    save_in_background: bool
    autosave: float | None
    sigterm_grace: float
    on_nan: str
    nan_rollbacks: int


@dataclasses.dataclass
class Resumed:
    """What a driver's resume loaded, for the session to keep and tell.

    Attributes:
        message: One line for the run's log and the user (where it
            resumed, or that nothing loaded).
        checkpoint: The checkpoint loaded, or None.
        epoch: The zero-based epoch training continues in; None: nothing
            loaded, the counters stay.
        pinned: While the resumed epoch's trained steps are skipped, the
            position every checkpoint records (the resumed one's); else None.
        level: The log line's level (``warning`` when other runs' checkpoints
            were found instead).
        differences: Sentences saying what will differ from an uninterrupted
            run (each a warning in the log).
        undo: Puts back what the resume changed in the driver, as the
            session closes; or None.
    """

    message: str
    checkpoint: Checkpoint | None = None
    epoch: int | None = None
    pinned: TrainingPosition | None = None
    level: str = "info"
    differences: Sequence[str] = ()
    undo: Callable[[], None] | None = None


class Driver(Protocol):
    """What a session asks of the driver it serves (a thin adapter).

    Attributes:
        unit: What one step is called (``batch``, ``item``).
        model: The Keras model trained, or None.
        trained: What a checkpoint holds (`port.Trained`).
        exact_resume: Checkpoints keep the random state and data order.
        handles_sigint: The session takes Ctrl+C.
        handles_sigterm: The session takes SIGTERM.
        reads_tunables_anywhere: Steered values may be read off the
            training thread (by the run's thread, at the start).
        attachments: What a checkpoint carries besides the state, or None.
        step_of: The step a job's receipt names, or None (steps since the
            run opened).
    """

    unit: str
    model: Any
    trained: Any
    exact_resume: bool
    handles_sigint: bool
    handles_sigterm: bool
    reads_tunables_anywhere: bool
    attachments: Callable[..., Any] | None
    step_of: Callable[[], int] | None

    def opened(self, stack: contextlib.ExitStack) -> Any:
        """The run is open: the driver's own watch, if any; returns where the
        training runs (a job's ``thread_id`` and ``frame``), or None."""

    def new_steering(self, run, progress: TrainingProgress, say: Callable[..., None]) -> Steering:
        """The steering of the driver's tunables (``set``, ``rollback``)."""

    def wire(self, stack: contextlib.ExitStack, saves: SaveScheduler) -> None:
        """The actions are open: the driver's boundaries take commands from here."""

    def resume(self, store: CheckpointStore, on_skip: Callable[[SkippedCheckpoint], None]) -> Resumed:
        """Loads the checkpoint training continues from and positions the driver there."""

    def data_state(self, position: TrainingPosition, in_epoch: bool) -> Mapping[str, Any] | None:
        """What orders the data, for a checkpoint at `position` (an exact resume)."""

    def end_training(self) -> None:
        """Ends the training at this boundary (a command's or the run's stop)."""

    def before_close(self, final_state: RunState) -> None:
        """The closing thread, before anything closes."""

    def after_close(self) -> None:
        """The closing thread, after everything closed."""


class TrainingSession:
    """One training under control, whatever drives it: its parts, opened in
    one order, closed once.

    Args:
        run: The run (a `run.RunLifecycle`): open already if the session
            does not own it (a notebook cell's, a with block's).
        driver: The driver's adapter (`Driver`).
        settings: The driver's settings (`SessionSettings`).
        scope: The scope of a run that spans several trainings, whose
            owner opened it (`run.RunScope`); None: the session opens the
            run and closes it (a scope of one).
        job: This process's part in a job (a `job.Job`), or None.
        verbose: Say what happens (start, resume, checkpoints, end).
        last_batch_ends_epoch: The epoch's last step ends it (a `fit`); a
            loop's body may go on after its last item.

    Attributes:
        say: Prints one line for the user (``say(message, stream=None)``),
            unless the session is quiet (`verbose`).
        progress: The training's counters.
        trained: What a checkpoint holds (the driver's).
        steering: ``set`` and ``rollback``, once open.
        actions: The commands' actions, once open.
        nan_policy: What a loss that is not finite does, once open.
        safeguards: Ctrl+C, SIGTERM and autosave, once open.
        resumption: What the resume loaded (`Resumed`), or None if the
            training did not resume.
        random_at_epoch_start: The random state the epoch in progress began
            with (`random_state.capture_epoch_start`), for exact resume.
        interrupted_twice: A second Ctrl+C came while the first's stop waited.
        gate: In a job, the agreed channel the boundaries pass; else None.
        final_state: The state the run ended in (``failed`` until it ends).
        error: Why it failed, if it did.
        end_reason: How it ended (`protocol.END_REASONS`), once it has.
    """

    def __init__(self, run, driver: Driver, settings: SessionSettings, *, scope: RunScope | None = None, job=None,
                 verbose: bool = True, last_batch_ends_epoch: bool = True):
        self.run = run
        self.driver = driver
        self.settings = settings
        self.scope = scope
        self.job = job
        self.say: Callable[..., None] = functools.partial(say, verbose=verbose)
        self.progress = TrainingProgress(last_batch_ends_epoch=last_batch_ends_epoch)
        self.trained = driver.trained
        self.steering: Steering | None = None
        self.actions: CommandActions | None = None
        self.nan_policy: NanPolicy | None = None
        self.safeguards: Safeguards | None = None
        self.resumption: Resumed | None = None
        self.random_at_epoch_start: Any = None
        self.interrupted_twice = False
        self.gate = None  # in a job: the agreed channel, whose gate the boundaries pass (`_join_job`)
        self.final_state = RunState.FAILED
        self.error: str | None = None
        self.end_reason: str | None = None
        self._stack = contextlib.ExitStack()
        self._closing = False
        self._closing_lock = threading.Lock()
        self._closer: threading.Thread | None = None  # the thread that closes
        self._closed = threading.Event()  # set once every part has closed
        self._resume_from = getattr(settings, "resume_from", None)  # a fit's: another run's checkpoints, or a file

    # Opening ------------------------------------------------------------------------

    def open(self) -> None:
        """Opens every part, on the training thread, in one order for every
        driver: the run, the driver's watch, steering, saves, the job,
        actions, the driver's boundaries, the folder's lock, the resume, the
        safeguards.

        Raises:
            Whatever a part raises (a folder another run holds, a checkpoint
            that cannot be read): the parts opened so far are closed first
            and the run ends ``failed``.
        """
        try:
            self._open_parts()
        except BaseException as error:
            self.close(RunState.FAILED, f"Could not start: {error}")
            raise

    def _open_parts(self) -> None:
        run, stack, driver, settings = self.run, self._stack, self.driver, self.settings
        self._open_run()
        where = driver.opened(stack)
        # A job saves on the training thread, its processes in step (process 0 writes, the others join in).
        store = self._store_for(driver.model)
        self.steering = steering = driver.new_steering(run, self.progress, self.say)
        saves = self._new_saves(store, background=settings.save_in_background, autosave=settings.autosave)
        channel = self._join_job(where, driver.model, step_of=driver.step_of)  # a job's: applied by all at one step
        self._open_actions(channel, saves, steering, driver.end_training, settings.on_nan, settings.nan_rollbacks)
        driver.wire(stack, saves)
        if not store.held:  # checked and locked before the first step (a with block's run holds it for all its fits)
            stack.callback(store.acquire().release)
        stack.callback(self.actions.detach)  # the saves end while the folder is still held
        if settings.resume or self._resume_from is not None:
            self._resume(store)
        read_on = run.publisher.run_soon if driver.reads_tunables_anywhere else None  # off the training thread
        steering.begin(getattr(self.resumption, "checkpoint", None), read_on)
        stack.callback(steering.publish_unread)  # in the last record, even if the run's thread had not read them
        self._open_safeguards(saves, driver.unit, sigint=driver.handles_sigint, sigterm=driver.handles_sigterm,
                              sigterm_grace=settings.sigterm_grace, on_second_sigint=self._on_second_sigint)

    def start(self, act_now: bool = True) -> bool:
        """After `open`: the run trains, or stops at once if it was told to.

        Args:
            act_now: Commands sent while nothing trained act now, before the
                first step (a stop: after it); False: at the driver's first
                boundary.

        Returns:
            False if the run was stopped before this training began.
        """
        run = self.run
        if run.state == RunState.STARTING:
            run.move_to(RunState.RUNNING)
        if self.scope is None:
            self.say(run.listening_words(resuming=self._resume_from is not None))
        if run.state == RunState.STOPPING:  # the run was stopped before this training
            self.driver.end_training()
            return False
        if act_now:
            self.actions.apply_pending(mid_epoch=False, before_step=self.job is None)
        return True

    # The run and the job ---------------------------------------------------------------------

    def _open_run(self) -> None:
        """Opens the run outside a scope (a job first agrees on its name);
        in one, checks it is open. The run follows the counters."""
        run, stack, job = self.run, self._stack, self.job
        if self.scope is None:
            if job is not None:
                job.begin(run)
                stack.callback(job.run_ended)  # last: once the run's final record is written
            run.open()
            stack.callback(self._close_run)
        elif not run.is_open:
            raise RuntimeError(f"The RunLifecycle given for run {run.name!r} is not open.")
        else:
            stack.callback(self._log_error)
        run.follow(self.progress)
        stack.callback(run.unfollow)

    def _store_for(self, model=None):
        """Where checkpoints go: the run's store; in a job, its process's
        share of it (process 0 writes, the others wait for its word;
        `model`, a Keras model, takes part in the save's collectives)."""
        job = self.job
        return job.store(self.run.store, model) if job is not None else self.run.store

    def _join_job(self, where, model=None, step_of: Callable[[], int] | None = None):
        """In a job, after the run opened: starts its share (proposals,
        heartbeats, receipts, SIGTERM) and returns the channel the actions
        read, whose commands every process applies at one agreed step;
        outside one, the run's channel. In a job that channel is also the
        `gate` the driver's boundaries pass (``before_step``, ``acting``,
        ``acted``).

        Args:
            where: Where the training runs (``thread_id``, ``frame``).
            model: A Keras model being trained, or None.
            step_of: The step a receipt names (default: steps since the run opened).
        """
        channel, job = self.run.channel, self.job
        if job is None:
            return channel
        job.opened(self.run, self.progress, where, self.end_lost, model, step_of=step_of)
        self._stack.callback(self._leave_job)
        self.gate = job.channel(channel, self.progress)
        return self.gate

    # The parts, on one set of terms for every driver ----------------------------------------

    def _new_saves(self, store, *, background: bool, autosave: float | None = None) -> SaveScheduler:
        """The training's checkpoints into `store`, on its steering's terms,
        with what the driver's checkpoints keep for an exact resume and
        carry besides the state.

        In a job every process takes each save in step, on its training
        thread, at an agreed step: no background writes, and no autosave
        (each process would decide on its own clock when to take one).

        Args:
            store: Where checkpoints go (`_store_for`).
            background: Write on a writer thread from a host copy, where the
                trained state can be copied.
            autosave: Seconds between autosaves, or None.
        """
        in_job, driver = self.job is not None, self.driver
        saves = SaveScheduler(self.trained, self.run, self.progress, self.say, store=store,
                              background=background and not in_job and getattr(self.trained, "snapshots", False),
                              resume_state=self._resume_state if driver.exact_resume else None,
                              autosave=None if in_job else autosave, attachments=driver.attachments)
        saves.policy = self.steering
        return saves

    def _open_actions(self, channel, saves: SaveScheduler, steering, on_end: Callable[[], None], on_nan: str,
                      nan_rollbacks: int) -> None:
        """The commands' actions, reading `channel`, and the NaN policy (`on_end` ends the training)."""
        steering.wait_for_saves = saves.wait_for_writes
        self.actions = CommandActions(self.trained, self.run, channel, self.progress, saves, on_end, self.say, steering)
        self.nan_policy = NanPolicy(on_nan, steering, self.actions.stop_without_checkpoint, self.say, nan_rollbacks)

    def _open_safeguards(self, saves: SaveScheduler, unit: str, *, sigint: bool, sigterm: bool,
                         sigterm_grace: float, on_second_sigint: Callable[[bool], None]) -> None:
        """Ctrl+C, SIGTERM and autosave for the life of the session. In a
        job SIGTERM is the job's: an agreed stop on every process (`job.Job`),
        so the session's own SIGTERM stop stays out."""
        self.safeguards = Safeguards(self.run, saves, self.note_interrupt, unit, sigint=sigint,
                                     sigterm=sigterm and self.job is None, sigterm_grace=sigterm_grace,
                                     on_second_sigint=on_second_sigint)
        self.safeguards.open(self._stack)

    # Closing ------------------------------------------------------------------------

    def close(self, final_state: RunState, error: str | None = None, end_reason: str | None = None) -> None:
        """Ends the run in `final_state`: every part closes, in reverse order
        of opening. Once; from any thread (a second caller returns at once).

        Args:
            final_state: The run's final state.
            error: Why it failed, for ``failed``.
            end_reason: How it ended (`protocol.END_REASONS`); defaults to
                what the run says of `final_state`.
        """
        with self._closing_lock:
            if self._closing:
                return
            self._closing, self._closer = True, threading.current_thread()
        self.driver.before_close(final_state)
        self.final_state, self.error, self.end_reason = final_state, error, end_reason
        try:
            self._stack.close()
        finally:
            self._closed.set()
        self.driver.after_close()

    def save_after_close(self) -> None:
        """The end checkpoint of a training that finished, written after its
        session closed (a with block's, once its last `fit` has returned):
        the model as it is now, at the last position. Nothing if it did not
        finish or trained no step."""
        if self.final_state is not RunState.FINISHED or not self.progress.boundary:
            return
        saves = self._new_saves(self.run.store, background=False)
        try:
            saves.write_at_end()
        finally:
            saves.close()

    def end_reason_for(self, state: RunState | str) -> str | None:
        """How the training ended in final `state` (`protocol.END_REASONS`)."""
        if self.actions is None:
            return end_reason_of_state(str(state))
        return self.actions.end_reason(state)

    def end_lost(self, message: str) -> None:
        """A job's process was lost, or this one exits with its training not
        ended (the job's threads, atexit): ends the run ``failed``, and
        returns once it has ended. If another thread is ending it already,
        waits for that end, a while at most: what comes next (the registry's
        exit, the job leaving a stuck process) must find the run's last
        record written."""
        self.close(RunState.FAILED, message)
        if self._closer is not threading.current_thread():
            self._closed.wait(LOST_END_WAIT_SECONDS)

    @property
    def closed(self) -> bool:
        """True once `close` began."""
        return self._closing

    def _leave_job(self) -> None:
        """Leaves the job; the error recorded is led by a lost process, if any.
        Agreed requests whose step never came stay unanswered, as a single
        run's command that came after its last batch: the sender learns the
        run ended before applying it."""
        self.error = self.job.end(self.final_state, self.error)

    def _close_run(self) -> None:
        self.run.close(self.final_state, self.error, self.end_reason)
        self.say(f"Run {self.run.name!r} {self.final_state}.")

    def _log_error(self) -> None:
        if self.error is not None:  # the run goes on after this training (a notebook cell's): its log says why
            self.run.journal.log("error", self.error)

    # Resume ------------------------------------------------------------------------------

    def _resume(self, store: CheckpointStore) -> None:
        """The driver loads the checkpoint training continues from; the
        counters continue there, and the log and the user are told."""
        run = self.run
        self.resumption = resumed = self.driver.resume(store, self._report_skipped)
        if resumed.undo is not None:
            self._stack.callback(resumed.undo)
        if resumed.epoch is not None:  # while it skips, a checkpoint is of the resumed one's weights and position
            self.progress.resume_at(resumed.epoch, self.trained.step(), resumed.pinned)
        run.journal.log(resumed.level, resumed.message)
        self.say(resumed.message)
        for difference in resumed.differences:  # said once, at resume; a warning reaches
            run.journal.log("warning", difference)  # stderr through `logging` even when not verbose

    def _resume_state(self, position: TrainingPosition) -> Mapping[str, Any] | None:
        """What a checkpoint at `position` keeps for an exact resume (the
        random state, the data order); while a resume still skips, the
        resumed checkpoint's own."""
        progress = self.progress
        if progress.pinned is not None:
            return self.resumption.checkpoint.info.get("resume_state")
        in_epoch = position.resume_epoch == progress.epoch
        started = self.random_at_epoch_start if in_epoch else None
        return random_state.capture(self.driver.model, position.resume_epoch, started,
                                    self.driver.data_state(position, in_epoch))

    # Interrupts, and what the user hears --------------------------------------------------

    def _on_second_sigint(self, raises: bool) -> None:
        # In a signal handler, on the main thread, which may hold any lock (a
        # record write, a save): ending the run here could wait on a thread that
        # waits on that lock. Only note it; where Python may swallow the
        # `KeyboardInterrupt` that follows, the next boundary raises it again.
        self.interrupted_twice = True
        if raises:
            self.actions.interrupt_at_next_boundary()

    def note_interrupt(self) -> None:
        """The next stop is an interrupt's (its checkpoint's reason). Any thread."""
        if self.actions is not None:
            self.actions.interrupted = True

    @property
    def ended_by(self) -> Command | None:
        """The command that ended the training (``stop``, ``abort``), or None."""
        return self.actions.ended_by if self.actions is not None else None

    def _report_skipped(self, skipped: SkippedCheckpoint) -> None:
        """A checkpoint the resume could not load: said, and the next older one tried."""
        self.report("warning", f"Resume skipped {skipped.path.name}: {skipped.reason}")

    def report(self, level: str, message: str) -> None:
        """One line in the run's log, said to the user too (a warning on stderr)."""
        self.run.journal.log(level, message)
        self.say(message, stream=sys.stderr if level == "warning" else None)
