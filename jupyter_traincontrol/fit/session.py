"""One `fit` under control: every part it holds, opened at train begin, closed once.

`FitSession` is the per-fit state of a `ControlCallback`: the run (claimed,
listening), the counters of the fit, the commands' actions, saves and
steering, the NaN policy, the job (several processes), the data-order
counts and the resume, the safeguards (Ctrl+C, SIGTERM, autosave), the
watchdog that notices a `fit` that raised. Each part is pushed on one
`contextlib.ExitStack` as it opens, so `close` unwinds them in reverse,
once, whatever thread ends the fit (the training thread at train end, the
watchdog's tick on the run's thread when `fit` raised, a job's watcher when
a process was lost, or exit). At train end (`train_ended`), a `fit` that
ran to its end first writes its last checkpoint (reason ``end``), and the
run is closed saying how it ended; a SIGTERM that stopped the `fit` is
handed on once `fit` has returned.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from ..boundary.saves import SaveScheduler
from ..boundary.session import TrainingSession
from ..boundary.steering import Steering
from ..boundary.tunables import Tunables
from ..checkpoint import TrainingPosition
from ..protocol import RunState, final_state
from ..run import RunLifecycle
from ..state import Keras2State, KerasState, is_keras2_model, random_state
from ..system.frames import call_after_return
from . import keras2, watchdog
from .boundaries import Boundaries
from .callback_states import KeptCallbacks, is_bookkeeping
from .dispatch import BatchDispatch
from .early_stop import stopping_callback
from .resume.batch_skipper import rebuild_train_function
from .resume.data_order import DataOrder
from .resume.resumption import Resumption
from .resume.start import start_resume
from .watchdog import FitWatchdog

if TYPE_CHECKING:
    from ..job import Job

__all__ = ["FitSession", "FitSettings"]


class FitSettings(Protocol):
    """What a session reads of its callback (`ControlCallback`'s settings)."""

    lifecycle: RunLifecycle
    owns_lifecycle: bool
    job: "Job | None"
    resume: bool
    resume_from: "str | os.PathLike | None"
    save_at_end: bool
    handle_sigint: bool
    handle_sigterm: bool
    sigterm_grace: float
    autosave: float | None
    verbose: bool
    save_in_background: bool
    tunables: Mapping[str, Any]
    on_nan: str
    nan_rollbacks: int


class FitSession(TrainingSession):
    """The parts of one `fit` under control (the run, the job and the
    closing: `boundary.session.TrainingSession`).

    Args:
        callback: The `ControlCallback` (its settings, its run, its job).
        model: The model `fit` trains.
        params: Keras's ``callback.params`` (``epochs``, ``steps``).
    """

    def __init__(self, callback: FitSettings, model, params: dict[str, Any]):
        super().__init__(callback.lifecycle, callback.job, callback.verbose)
        self.callback = callback
        self.model = model
        self.progress.plan(params.get("epochs"), params.get("steps"))
        self.keras2 = is_keras2_model(model)  # a tf_keras model: saved on this thread, resumed without the data order
        self.trained = Keras2State(model) if self.keras2 else KerasState(model)
        self.dispatch = BatchDispatch.find()  # on_train_begin calls this: Keras's CallbackList is on the stack
        self.kept_callbacks = KeptCallbacks(lambda: self.dispatch.callbacks, callback, self.report,
                                            epoch_end_pending=self._epoch_end_pending)
        self.boundaries: Boundaries | None = None
        self.steering: Steering | None = None
        self.data_order: DataOrder | None = None
        self.resumption: Resumption | None = None
        self.random_at_epoch_start: random_state.EpochStart | None = None  # `random_state.capture_epoch_start` of the epoch in progress
        self.lost_because: str | None = None  # why `fit` left without on_train_end, if known
        self.callback_stopped = False  # a callback of the user's ended fit early (its stop_training)
        self.stopped_by: str | None = None  # which one (its class), if known
        self._fit_frame = None  # the `fit` call's frame, until the fit closes (a SIGTERM is handed on after it)

    @property
    def history(self):
        """The run's history (loss per batch, each epoch's logs)."""
        return self.run.history

    # Opening -------------------------------------------------------------------

    def open(self) -> None:
        """Opens every part (in ``on_train_begin``, on the training thread).

        Raises:
            Whatever a part raises (a folder another run holds, a checkpoint
            that cannot be read): the parts opened so far are closed first
            and the run ends ``failed``.
        """
        try:
            self._open_watched_run()
            if self.keras2:  # what it cannot do, said before anything else of this fit
                keras2.announce(self.run.journal)
            self._open_parts()
        except BaseException as error:
            self.close(RunState.FAILED, f"Could not start: {error}")
            raise

    def _open_watched_run(self) -> None:
        """The run, opened or checked (`TrainingSession._open_run`), and the
        watchdog that notices a `fit` that raised."""
        run, stack = self.run, self._stack
        if self.callback.owns_lifecycle:
            watchdog.check_all()  # a run of this process whose fit raised ends now, before a new one claims a name
        self._open_run(self.callback.owns_lifecycle)
        fit_watchdog = FitWatchdog(self.model, self.fit_lost)
        stack.callback(fit_watchdog.stop)
        run.publisher.add_tick_hook(fit_watchdog.check)
        stack.callback(run.publisher.remove_tick_hook, fit_watchdog.check)
        self._watchdog = fit_watchdog
        self._fit_frame = fit_watchdog.frame

    def _open_parts(self) -> None:
        run, callback, stack, model, progress = self.run, self.callback, self._stack, self.model, self.progress
        store = self._store_for(model)
        tunables = Tunables(model, callback.tunables, rebuild=lambda: rebuild_train_function(model))
        self.steering = steering = Steering(self.trained, tunables, run, progress, self.say,
                                            history=lambda: getattr(model, "history", None))
        # A job saves on the training thread, its processes in step (process 0 writes, the others join in).
        saves = self._saves(store, background=callback.save_in_background, autosave=callback.autosave)
        channel = self._join_job(self._watchdog, model)  # a job's commands: applied by all at one step
        self._open_actions(channel, saves, steering, self._end_fit, callback.on_nan, callback.nan_rollbacks)
        self.boundaries = Boundaries(progress, self.history, self.actions, self.dispatch, self._non_finite,
                                     gate=self.gate)
        run.channel.on_request = saves.wake = self.dispatch.hold  # a command waits: the next boundary is on this thread
        stack.callback(self._unwire, saves)
        self.data_order = DataOrder.find()  # counts what orders the data (exact resume)
        if self.data_order is not None:
            self.data_order.attach()
            stack.callback(self.data_order.detach)
        if not store.held:  # checked and locked before the first step (a with block's run holds it for all its fits)
            stack.callback(store.acquire().release)
        stack.callback(self.actions.detach)  # the saves end while the folder is still held
        if callback.resume or callback.resume_from is not None:
            self._resume(store)
        read_on = run.publisher.run_soon if tunables.read_anywhere else None  # off the training thread
        steering.begin(getattr(self.resumption, "checkpoint", None), read_on)
        stack.callback(steering.publish_unread)  # in the last record, even if the run's thread had not read them
        # SIGTERM: a notebook cell's run is the kernel's (its shutdown path)
        self._open_safeguards(saves, "batch", sigint=callback.handle_sigint,
                              sigterm=callback.handle_sigterm and callback.owns_lifecycle,
                              sigterm_grace=callback.sigterm_grace, on_second_sigint=self._on_second_sigint)

    def _saves(self, store, background: bool, autosave: float | None = None) -> SaveScheduler:
        """This fit's checkpoints into `store`, on its steering's terms."""
        return self._new_saves(store, background=background, autosave=autosave, steering=self.steering,
                               resume_state=None if self.keras2 else self._resume_state,
                               attachments=self.kept_callbacks.attachments)

    def _unwire(self, saves) -> None:
        channel = self.run.channel
        if channel is not None:
            channel.on_request = None
        saves.wake = lambda: None
        self.dispatch.restore()

    def start(self) -> None:
        """After `open`: the run trains (or stops at once, if it was told to)."""
        run = self.run
        if run.state == RunState.STARTING:
            run.move_to(RunState.RUNNING)
        if self.callback.owns_lifecycle:
            self.say(run.listening_words(resuming=self.callback.resume_from is not None))
        if run.state == RunState.STOPPING:  # the run was stopped before this fit
            self.model.stop_training = True
        else:  # commands sent while no fit ran act before the first batch (a stop: after it)
            self.actions.apply_pending(mid_epoch=False, before_step=self.job is None)

    def _resume(self, store) -> None:
        run = self.run
        self.resumption = start_resume(self.model, store, is_keras2=self.keras2, resume_from=self.callback.resume_from,
                                       data_order=self.data_order, on_skip=self._report_skipped,
                                       on_skipped=self._skipped)
        self._stack.callback(self.resumption.undo)
        if self.resumption.resumed:  # the callbacks' states, given back once their on_train_begin has run
            self.kept_callbacks.load(self.resumption.checkpoint.path)
        # while it skips, a checkpoint is of the resumed one's weights and position
        pinned = self.resumption.checkpoint.position if self.resumption.skipping else None
        self.progress.resume_at(self.resumption.epoch, self.trained.step(), pinned)
        run.journal.log("warning" if self.resumption.others else "info", self.resumption.message)
        self.say(self.resumption.message)
        for difference in self.resumption.differences:  # said once, at resume; a warning reaches
            run.journal.log("warning", difference)       # stderr through `logging` even when not verbose

    def _skipped(self) -> None:
        """The resumed epoch's batches already trained are drawn: training goes on from here."""
        self.progress.unpin()

    # At boundaries ---------------------------------------------------------------

    def _end_fit(self) -> None:
        """A command ends the fit at this boundary. In the middle of an epoch,
        Keras still runs the epoch's validation and end: the user's callbacks
        do not see that partial epoch (a `ModelCheckpoint` would save it, an
        `EarlyStopping` count it), only Keras's record and this package's."""
        self.model.stop_training = True
        if self.progress.mid_epoch and not self.progress.epoch_is_over:
            self.dispatch.skip_epoch_end(lambda callback: callback is self.callback or is_bookkeeping(callback))

    def _resume_state(self, position: TrainingPosition) -> Mapping[str, Any]:
        """What a checkpoint at `position` keeps for an exact resume (`random_state`);
        while a resume still skips, the resumed checkpoint's own."""
        progress = self.progress
        if progress.pinned is not None:
            return self.resumption.checkpoint.info.get("resume_state")
        in_epoch = position.resume_epoch == progress.epoch
        started = self.random_at_epoch_start if in_epoch else None
        data = None
        if self.data_order is not None:  # after an epoch's last batch, Keras still opens the next epoch's data
            data = self.data_order.state(at_epoch_start=in_epoch, tail=progress.mid_epoch and position.epoch_complete,
                                         epoch=progress.epoch, in_validation=progress.in_validation)
        return random_state.capture(self.model, position.resume_epoch, started, data)

    def _epoch_end_pending(self) -> int | None:
        """The epoch whose batches are all trained and whose end has not run (a
        boundary after its last batch, or in its validation), or None."""
        progress = self.progress
        after_last_batch = progress.in_validation or progress.mid_epoch and progress.epoch_is_over
        return progress.epoch if after_last_batch and progress.pinned is None else None

    def epoch_began(self, epoch: int) -> None:
        """``on_epoch_begin``: the counters, and what orders this epoch's data."""
        self.progress.begin_epoch(epoch)
        if self.boundaries is not None:
            self.boundaries.epoch_began()
        self.random_at_epoch_start = random_state.capture_epoch_start()
        if self.data_order is not None:
            self.data_order.epoch_began()
        self.kept_callbacks.give_back()

    def epoch_ended(self, epoch: int, logs: dict | None) -> None:
        """``on_epoch_end``: the epoch's logs (with the steered values) into the history."""
        self.dispatch.show_all()  # on_train_end reaches every callback
        if logs is not None:
            self.steering.add_to_logs(logs)  # as ReduceLROnPlateau does: History keeps them
        self.history.record_epoch(epoch, logs)
        self.progress.end_epoch(logs)

    def _non_finite(self, loss, epoch: int, batch: int) -> None:
        """A batch's loss was NaN or infinite: the NaN policy acts (training thread)."""
        if not self._closing:
            self.nan_policy.on_non_finite(loss, epoch, batch)

    # Interrupts --------------------------------------------------------------------

    def _on_second_sigint(self, raises: bool) -> None:
        # In a signal handler, on the main thread, which may hold any lock (a
        # record write, a save): ending the run here could wait on a thread that
        # waits on that lock. Only note why; the `KeyboardInterrupt` that follows
        # leaves `fit` (or, if Python swallowed it, the next boundary raises it
        # again), and the watchdog ends the run from the run's thread.
        self.lost_because = "KeyboardInterrupt: a second Ctrl+C interrupted fit."
        if raises:
            self.actions.interrupt_at_next_boundary()

    # Closing -------------------------------------------------------------------------

    def fit_lost(self) -> None:
        """`fit` left without ``on_train_end`` (it raised): the run ends ``failed``."""
        self.close(RunState.FAILED, self.lost_because or "fit raised an exception; on_train_end never ran.")

    def train_ended(self) -> None:
        """``on_train_end`` (the training thread): a `fit` that ran to its end
        writes its last checkpoint (reason ``end``, unless ``save_at_end`` is
        off or no batch was trained), then the run closes in its final state.

        That checkpoint is the model `fit` returns: it is written once `fit`
        returns, after every callback's ``on_train_end`` (the weights
        ``EarlyStopping(restore_best_weights=True)`` puts back), and the run
        closes then (`system.frames.call_after_return`). Where that cannot
        be arranged (a profiler is set; a job, whose processes write it in
        step), it is written now, as the callbacks after this one have not
        run yet."""
        actions = self.actions
        state = final_state(actions.ended_by)
        if state is RunState.FINISHED and getattr(self.model, "stop_training", False):
            self._note_callback_stop()
        writes_end = state is RunState.FINISHED and self.callback.save_at_end and self.progress.boundary
        if writes_end and not self._closing and self.job is None and call_after_return(self._fit_frame, self._returned):
            return
        if writes_end and not self._closing:
            actions.saves.write_at_end()
        self.close(state, end_reason=self.end_reason_for(state))

    def _note_callback_stop(self) -> None:
        """`fit` ran out early, and no command stopped it: a callback of the
        user's set ``stop_training`` (named in the record, ``stopped_by``)."""
        self.callback_stopped = True
        self.stopped_by = stopping_callback(self.dispatch.callbacks, exclude=self.callback)
        progress = self.progress
        where = f"epoch {progress.epoch + 1}/{progress.epochs or '?'}"
        self.run.note_stopped_by(self.stopped_by)
        self.run.journal.log("info", f"Stopped by {self.stopped_by or 'a callback'} at {where}.")

    def end_reason_for(self, state: RunState | str) -> str | None:
        """How this `fit` ended in final `state` (`protocol.END_REASONS`):
        ``callback`` when a callback of the user's ended it early."""
        if self.callback_stopped and str(state) == RunState.FINISHED:
            return "callback"
        return self.actions.end_reason(state)

    def _returned(self, history) -> None:
        """`fit` of a finished run has returned `history` (None: it raised,
        a callback's ``on_train_end`` after this one's): its end checkpoint,
        then the run closes."""
        self._fit_frame = None  # returned: a SIGTERM is handed on at once
        if history is None:
            self.close(RunState.FAILED, "fit raised after its on_train_end (a callback's on_train_end raised).")
            return
        if not self._closing:
            self.actions.saves.write_at_end()
        self.close(RunState.FINISHED, end_reason=self.end_reason_for(RunState.FINISHED))

    def save_after_close(self) -> None:
        """A finished with block's end checkpoint (`fit.span`), its last `fit`
        closed: the model as it is now, at that fit's last position. Nothing
        if that fit did not finish (the block went on) or trained no batch."""
        if self.final_state is not RunState.FINISHED or not self.progress.boundary:
            return
        saves = self._saves(self.run.store, background=False)
        try:
            saves.write_at_end()
        finally:
            saves.close()

    def _after_close(self) -> None:
        """A SIGTERM that stopped the fit is handed on once `fit` has returned."""
        frame, self._fit_frame = self._fit_frame, None
        if self.safeguards is not None and self._watchdog.thread_id == threading.get_ident():
            self.safeguards.deliver_sigterm(after=lambda deliver: call_after_return(frame, lambda _: deliver()))


