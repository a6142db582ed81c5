"""One `fit` under control: the adapter between Keras's hooks and the training session.

`FitAdapter` is what a `ControlCallback` makes at each ``on_train_begin``
(Keras 3's `fit`, and Keras 2's: `keras2`): it serves the fit's
`boundary.session.TrainingSession`, which owns every part (the run, the
job, steering, saves, actions, the NaN policy, the resume, the
safeguards) and closes them once, whatever thread ends the fit (the
training thread at train end, the watchdog's tick on the run's thread when
`fit` raised, a job's watcher when a process was lost, or exit). The
adapter says what only a `fit` knows: its boundaries (`Boundaries`, the
batch-end hooks switched to the training thread while a command waits:
`BatchDispatch`), how its state is read and steered, its resume
(`resume.start`), its data order, the callbacks' states a checkpoint
carries, which callbacks see the rest of an epoch a command ended early
(this one and Keras's record of the fit: not a partial epoch for a
`ModelCheckpoint` to save), the watchdog, and when its end checkpoint is
written: at train end (`train_ended`) a `fit` that ran to its end writes
it (reason ``end``) once `fit` has returned, and a SIGTERM that stopped
the `fit` is handed on then.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from ..boundary.session import Resumed, TrainingSession
from ..boundary.steering import Steering
from ..boundary.tunables import Tunables
from ..checkpoint import TrainingPosition
from ..protocol import RunState, final_state
from ..run import RunLifecycle, RunScope
from ..state import Keras2State, KerasState, is_keras2_model, random_state
from ..system.frames import call_after_return
from . import keras2
from .boundaries import Boundaries
from .callback_states import KeptCallbacks, is_bookkeeping
from .dispatch import BatchDispatch
from .early_stop import stopping_callback
from .resume.batch_skipper import rebuild_train_function
from .resume.data_order import DataOrder
from .resume.start import start_resume
from .watchdog import FitWatchdog

if TYPE_CHECKING:
    from ..job import Job

__all__ = ["FitAdapter", "FitSettings"]


class FitSettings(Protocol):
    """What a fit reads of its callback (`ControlCallback`'s settings)."""

    lifecycle: RunLifecycle
    scope: RunScope | None
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


class FitAdapter:
    """A `fit`'s side of its training session (`boundary.session.Driver`).

    Args:
        callback: The `ControlCallback` (its settings, its run, its job).
        model: The model `fit` trains.
        params: Keras's ``callback.params`` (``epochs``, ``steps``).

    Attributes:
        session: The fit's `TrainingSession`.
        boundaries: What each Keras hook does at a boundary, once open.
        keras2: The model is a tf_keras one: saved on the training thread,
            resumed without the data order.
    """

    unit = "batch"
    step_of = None  # a receipt names the steps since the run opened

    def __init__(self, callback: FitSettings, model, params: dict[str, Any]):
        self.callback = callback
        self.model = model
        self.keras2 = is_keras2_model(model)
        self.trained = Keras2State(model) if self.keras2 else KerasState(model)
        self.exact_resume = not self.keras2
        self.handles_sigint = callback.handle_sigint
        self.handles_sigterm = callback.handle_sigterm and callback.scope is None  # a cell's run: the kernel's
        self.session = session = TrainingSession(callback.lifecycle, self, callback, scope=callback.scope,
                                                 job=callback.job, verbose=callback.verbose)
        session.progress.plan(params.get("epochs"), params.get("steps"))
        self.dispatch = BatchDispatch.find()  # on_train_begin calls this: Keras's CallbackList is on the stack
        self.kept_callbacks = KeptCallbacks(lambda: self.callbacks, callback, session.report)
        self.boundaries: Boundaries | None = None
        self.tunables: Tunables | None = None
        self.data_order: DataOrder | None = None
        self.callback_stopped = False  # a callback of the user's ended fit early (its stop_training)
        self.stopped_by: str | None = None  # which one (its class), if known
        self._watchdog: FitWatchdog | None = None
        self._epoch_end_seen_by: list[Any] = []  # the callbacks that see an epoch a command ended early
        self._hidden: list | None = None  # all of them, while the rest of such an epoch runs without the others
        self._fit_frame = None  # the `fit` call's frame, until the fit closes (a SIGTERM is handed on after it)

    @property
    def callbacks(self) -> list:
        """The `fit`'s callbacks, all of them (none if its `CallbackList` was not found)."""
        if self._hidden is not None:
            return list(self._hidden)
        return list(getattr(self.dispatch.callback_list, "callbacks", None) or [])

    def attachments(self) -> dict[str, Any]:
        """What a checkpoint taken now carries besides the model: the callbacks' states."""
        return self.kept_callbacks.attachments(self._epoch_end_pending())

    @property
    def reads_tunables_anywhere(self) -> bool:
        return self.tunables.read_anywhere

    # Opening (the session calls these, in its order) -------------------------------

    def opened(self, stack: contextlib.ExitStack) -> FitWatchdog:
        """The run is open: the watchdog that notices a `fit` that raised, and
        what a Keras 2 fit cannot do, said before anything else of it."""
        run = self.session.run
        fit_watchdog = FitWatchdog(self.model, self.fit_lost)
        stack.callback(fit_watchdog.stop)
        run.publisher.add_tick_hook(fit_watchdog.check)
        stack.callback(run.publisher.remove_tick_hook, fit_watchdog.check)
        self._watchdog, self._fit_frame = fit_watchdog, fit_watchdog.frame
        if self.keras2:
            keras2.announce(run.journal)
        return fit_watchdog

    def new_steering(self, run, progress, say) -> Steering:
        model = self.model
        self.tunables = Tunables(model, self.callback.tunables, rebuild=lambda: rebuild_train_function(model))
        return Steering(self.trained, self.tunables, run, progress, say, history=lambda: getattr(model, "history", None))

    def wire(self, stack: contextlib.ExitStack, saves) -> None:
        """The boundaries take commands; a command that waits switches the
        batch-end hooks to the training thread; the data order is counted."""
        session = self.session
        self.boundaries = Boundaries(session.progress, session.run.history, session.actions, self.dispatch,
                                     self._non_finite, gate=session.gate)
        if self.dispatch.asynchronous:  # else every batch-end hook runs on this thread already: nothing to hold
            session.run.channel.on_request = saves.wake = self.dispatch.hold  # the next boundary is on this thread
        stack.callback(self._unwire, saves)
        # Who still sees the rest of an epoch a command ended early: this callback, and Keras's record of the fit.
        self._epoch_end_seen_by = [callback for callback in self.callbacks
                                   if callback is self.callback or is_bookkeeping(callback)]
        self.data_order = DataOrder.find()  # counts what orders the data (exact resume)
        if self.data_order is not None:
            self.data_order.attach()
            stack.callback(self.data_order.detach)

    def _unwire(self, saves) -> None:
        channel = self.session.run.channel
        if channel is not None:
            channel.on_request = None
        saves.wake = lambda: None
        self._show_all()
        self.dispatch.restore()

    def resume(self, store, on_skip) -> Resumed:
        """Loads the checkpoint into the model and positions `fit` there; the
        callbacks' states are given back once their on_train_begin has run."""
        made = start_resume(self.model, store, is_keras2=self.keras2, resume_from=self.callback.resume_from,
                            data_order=self.data_order, on_skip=on_skip, on_skipped=self.session.progress.unpin)
        try:
            if made.resumed:
                self.kept_callbacks.load(made.checkpoint.path)
        except BaseException:
            made.undo()
            raise
        return Resumed(made.message, checkpoint=made.checkpoint, epoch=made.epoch,
                       pinned=made.checkpoint.position if made.skipping else None,
                       level="warning" if made.others else "info", differences=made.differences, undo=made.undo)

    def data_state(self, position: TrainingPosition, in_epoch: bool) -> Mapping[str, Any] | None:
        """The data order's counts (after an epoch's last batch, Keras still
        opens the next epoch's data)."""
        if self.data_order is None:
            return None
        progress = self.session.progress
        return self.data_order.state(at_epoch_start=in_epoch, tail=progress.mid_epoch and position.epoch_complete,
                                     epoch=progress.epoch, in_validation=progress.in_validation)

    # At boundaries ---------------------------------------------------------------

    def end_training(self) -> None:
        """A command ends the fit at this boundary. In the middle of an epoch,
        Keras still runs the epoch's validation and end: the user's callbacks
        do not see that partial epoch (a `ModelCheckpoint` would save it, an
        `EarlyStopping` count it), only Keras's record and this package's."""
        self.model.stop_training = True
        progress = self.session.progress
        listed = self.dispatch.callback_list
        if progress.mid_epoch and not progress.epoch_is_over and listed is not None and self._hidden is None:
            # Until `_show_all`, only those callbacks are called. Keras iterates over the list
            # it holds, so a list swapped while one hook runs is seen from the next hook on.
            self._hidden = listed.callbacks
            listed.callbacks = [callback for callback in self._hidden
                                if any(callback is seen for seen in self._epoch_end_seen_by)]

    def _show_all(self) -> None:
        """Every callback is called again (see `end_training`). Idempotent."""
        if self._hidden is not None:
            self.dispatch.callback_list.callbacks, self._hidden = self._hidden, None

    def _epoch_end_pending(self) -> int | None:
        """The epoch whose batches are all trained and whose end has not run (a
        boundary after its last batch, or in its validation), or None."""
        progress = self.session.progress
        after_last_batch = progress.in_validation or progress.mid_epoch and progress.epoch_is_over
        return progress.epoch if after_last_batch and progress.pinned is None else None

    def epoch_began(self, epoch: int) -> None:
        """``on_epoch_begin``: the counters, and what orders this epoch's data."""
        session = self.session
        session.progress.begin_epoch(epoch)
        if self.boundaries is not None:
            self.boundaries.epoch_began()
        session.random_at_epoch_start = random_state.capture_epoch_start()
        if self.data_order is not None:
            self.data_order.epoch_began()
        self.kept_callbacks.give_back()

    def epoch_ended(self, epoch: int, logs: dict | None) -> None:
        """``on_epoch_end``: the epoch's logs (with the steered values) into the history."""
        session = self.session
        self._show_all()  # on_train_end reaches every callback
        if logs is not None:
            session.steering.add_to_logs(logs)  # as ReduceLROnPlateau does: History keeps them
        session.run.history.record_epoch(epoch, logs)
        session.progress.end_epoch(logs)

    def _non_finite(self, loss, epoch: int, batch: int) -> None:
        """A batch's loss was NaN or infinite: the NaN policy acts (training thread)."""
        session = self.session
        if not session.closed:
            session.nan_policy.on_non_finite(loss, epoch, batch)

    # Closing -------------------------------------------------------------------------

    def fit_lost(self) -> None:
        """`fit` left without ``on_train_end`` (it raised): the run ends ``failed``.
        After a second Ctrl+C the `KeyboardInterrupt` left it, and the
        watchdog ends the run from the run's thread."""
        why = ("KeyboardInterrupt: a second Ctrl+C interrupted fit." if self.session.interrupted_twice
               else "fit raised an exception; on_train_end never ran.")
        self.session.close(RunState.FAILED, why)

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
        session = self.session
        state = final_state(session.actions.ended_by)
        if state is RunState.FINISHED and getattr(self.model, "stop_training", False):
            self._note_callback_stop()
        writes_end = state is RunState.FINISHED and self.callback.save_at_end and session.progress.boundary
        if writes_end and not session.closed and session.job is None and call_after_return(self._fit_frame,
                                                                                             self._returned):
            return
        if writes_end and not session.closed:
            session.actions.saves.write_at_end()
        session.close(state, end_reason=self.end_reason_for(state))

    def _note_callback_stop(self) -> None:
        """`fit` ran out early, and no command stopped it: a callback of the
        user's set ``stop_training`` (named in the record, ``stopped_by``)."""
        self.callback_stopped = True
        self.stopped_by = stopping_callback(self.callbacks, exclude=self.callback)
        progress, run = self.session.progress, self.session.run
        where = f"epoch {progress.epoch + 1}/{progress.epochs or '?'}"
        run.note_stopped_by(self.stopped_by)
        run.journal.log("info", f"Stopped by {self.stopped_by or 'a callback'} at {where}.")

    def end_reason_for(self, state: RunState | str) -> str | None:
        """How this `fit` ended in final `state` (`protocol.END_REASONS`):
        ``callback`` when a callback of the user's ended it early."""
        if self.callback_stopped and str(state) == RunState.FINISHED:
            return "callback"
        return self.session.end_reason_for(state)

    def _returned(self, history) -> None:
        """`fit` of a finished run has returned `history` (None: it raised,
        a callback's ``on_train_end`` after this one's): its end checkpoint,
        then the run closes."""
        session = self.session
        self._fit_frame = None  # returned: a SIGTERM is handed on at once
        if history is None:
            session.close(RunState.FAILED, "fit raised after its on_train_end (a callback's on_train_end raised).")
            return
        if not session.closed:
            session.actions.saves.write_at_end()
        session.close(RunState.FINISHED, end_reason=self.end_reason_for(RunState.FINISHED))

    def before_close(self, final_state: RunState) -> None:
        """Nothing of a fit's waits for its close."""

    def after_close(self) -> None:
        """A SIGTERM that stopped the fit is handed on once `fit` has returned."""
        frame, self._fit_frame = self._fit_frame, None
        safeguards = self.session.safeguards
        if safeguards is not None and self._watchdog.thread_id == threading.get_ident():
            safeguards.deliver_sigterm(after=lambda deliver: call_after_return(frame, lambda _: deliver()))
