"""What every driver's training session shares: the run, a job, one stack of parts, one end.

A `fit` (`fit.session.FitSession`) and a custom loop
(`loop.session.LoopSession`) open the same parts around their training:
the run (their own, or a notebook cell's, open already), a job's share of
it when the training is one process of several, the commands' actions, the
saves and the safeguards, each pushed on one `contextlib.ExitStack` as it
opens. `TrainingSession` is that common part: opening the run and joining
the job in the same order for both, ending once from whichever thread ends
it (the training thread, a watchdog, a job's watcher, exit), and saying
what happens in one voice. The drivers keep what only they know: where
their boundaries are, how their state is read and resumed.

The job (`job.Job`, a layer beside this one) is used through the members
it offers, never imported.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable

from ..checkpoint import SkippedCheckpoint
from ..protocol import Command, RunState
from ..protocol import end_reason as end_reason_of_state
from ..run.journal import say
from .actions import CommandActions
from .nan_policy import NanPolicy
from .progress import TrainingProgress
from .safeguards import Safeguards
from .saves import SaveScheduler

__all__ = ["TrainingSession"]

#: How long the end of a lost job's run waits for an end another thread has
#: begun (a job's end waits at most its ``lost_after``, two heartbeats, and
#: the join of its watcher).
LOST_END_WAIT_SECONDS = 30.0


class TrainingSession:
    """The run, the job and the closing of one training (a `fit`, a loop).

    Args:
        run: The run (a `run.RunLifecycle`).
        job: This process's part in a job (a `job.Job`), or None.
        verbose: Say what happens (start, resume, checkpoints, end).

    Attributes:
        progress: The training's counters.
        trained: What a checkpoint holds (set by the driver).
        actions: The commands' actions, once open.
        nan_policy: What a loss that is not finite does, once open.
        safeguards: Ctrl+C, SIGTERM and autosave, once open.
        gate: In a job, the agreed channel the boundaries pass; else None.
        final_state: The state the run ended in (``failed`` until it ends).
        error: Why it failed, if it did.
        end_reason: How it ended (`protocol.END_REASONS`), once it has.
    """

    def __init__(self, run, job=None, verbose: bool = True, last_batch_ends_epoch: bool = True):
        self.run = run
        self.job = job
        self.verbose = verbose
        self.progress = TrainingProgress(last_batch_ends_epoch=last_batch_ends_epoch)
        self.trained = None  # what a checkpoint holds (the driver's `state` object)
        self.actions: CommandActions | None = None
        self.nan_policy: NanPolicy | None = None
        self.safeguards: Safeguards | None = None
        self.gate = None  # in a job: the agreed channel, whose gate the boundaries pass (`_join_job`)
        self.final_state = RunState.FAILED
        self.error: str | None = None
        self.end_reason: str | None = None
        self._stack = contextlib.ExitStack()
        self._closing = False
        self._closing_lock = threading.Lock()
        self._closer: threading.Thread | None = None  # the thread that closes
        self._closed = threading.Event()  # set once every part has closed

    # Opening ------------------------------------------------------------------------

    def _open_run(self, owns_run: bool) -> None:
        """Opens the run if the session owns it (a job first agrees on its
        name), else checks it is open; the run follows the counters."""
        run, stack, job = self.run, self._stack, self.job
        if owns_run:
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

    def _new_saves(self, store, *, background: bool, autosave: float | None = None, resume_state=None,
                   attachments=None, steering=None) -> SaveScheduler:
        """The training's checkpoints into `store`, on `steering`'s terms.

        In a job every process takes each save in step, on its training
        thread, at an agreed step: no background writes, and no autosave
        (each process would decide on its own clock when to take one).

        Args:
            store: Where checkpoints go (`_store_for`).
            background: Write on a writer thread from a host copy, where the
                trained state can be copied.
            autosave: Seconds between autosaves, or None.
            resume_state: What a checkpoint at a position keeps for an exact resume.
            attachments: What a checkpoint carries besides the state (callbacks' states).
            steering: The steering whose values a checkpoint records.
        """
        in_job = self.job is not None
        saves = SaveScheduler(self.trained, self.run, self.progress, self.say, store=store,
                              background=background and not in_job and getattr(self.trained, "snapshots", False),
                              resume_state=resume_state, autosave=None if in_job else autosave,
                              attachments=attachments)
        saves.policy = steering
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
        self._before_close(final_state)
        self.final_state, self.error, self.end_reason = final_state, error, end_reason
        try:
            self._stack.close()
        finally:
            self._closed.set()
        self._after_close()

    def _before_close(self, final_state: RunState) -> None:
        """Called once, by the closing thread, before anything closes."""

    def _after_close(self) -> None:
        """Called once, by the closing thread, after everything closed."""

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

    # Interrupts, and what the user hears --------------------------------------------------

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

    def say(self, message: str, stream: Any = None) -> None:
        """One line for the user, unless the session is quiet."""
        say(message, verbose=self.verbose, stream=stream)
