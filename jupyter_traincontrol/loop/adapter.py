"""One custom loop under control: the adapter between a `TrainLoop` and its training session.

`LoopAdapter` is to a `TrainLoop` what `fit.adapter.FitAdapter` is to a
`fit`: it serves the loop's `boundary.session.TrainingSession`, which owns
every part (the run, its own or the notebook cell's; the job, steering,
saves, actions, the NaN policy, the resume, the safeguards) and closes
them once. The adapter's boundary methods (`epoch_began`, `item_done`,
`epoch_ended`) are where waiting commands act, on the loop's thread; it
says how the loop's state is steered (`stateless` for a state kept outside
the model), how a resume positions the loop (the items of the resumed
epoch to skip, the random state and data order put back when the epoch
starts again), and what orders its data. In a job (a torch process group,
a JAX distributed runtime: `job.Job`) every process applies each command
at one agreed item (`item_begins` waits while the job agrees on one),
process 0 writes the checkpoints, and SIGTERM on any process stops them all.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, Mapping

from ..boundary.session import Resumed, TrainingSession
from ..boundary.steering import Steering
from ..checkpoint import TrainingPosition, skipping_words
from ..protocol import RunState
from ..state import random_state
from ..system.signals import on_main_thread
from .data_sources import DataSources
from .stateless import StatelessSteering

__all__ = ["LoopAdapter"]


class LoopAdapter:
    """A `TrainLoop`'s side of its training session (`boundary.session.Driver`).

    Args:
        run: The run (a `run.RunLifecycle`): open if in a scope, else opened here.
        scope: The scope of the notebook cell whose run the loop drives
            (`run.RunScope`), or None: the loop's run is its own.
        trained: What a checkpoint holds (`state.KerasState`, `TorchState`,
            `CallableState`, or a state that refuses checkpoints).
        tunables: What ``set`` may change.
        settings: The loop's settings (``resume``, ``on_nan``,
            ``nan_rollbacks``, ``handle_sigint``, ``handle_sigterm``,
            ``sigterm_grace``, ``autosave``, ``save_in_background``,
            ``verbose``, ``model``).
        job: This process's part in a job, or None.
        where: Where the loop runs, for a job: ``thread_id``, and ``frame``
            (the one that entered the ``with`` block).

    Attributes:
        session: The loop's `TrainingSession`.
        ended: A stop or abort ended the loop.
        skip: Items of the resumed epoch already trained (drawn, not yielded).
    """

    unit = "item"
    exact_resume = True
    reads_tunables_anywhere = False
    attachments = None

    def __init__(self, run, scope, trained, tunables, settings, job=None, where=None):
        self.trained = trained
        self.tunables = tunables
        self.model = getattr(settings, "model", None)
        main = scope is None and on_main_thread()  # a notebook cell's run is the kernel's (its shutdown path)
        self.handles_sigint = settings.handle_sigint and main
        self.handles_sigterm = settings.handle_sigterm and main
        # In a job, process 0 speaks for every process; the body may go on after the last item.
        self.session = TrainingSession(run, self, settings, scope=scope, job=job,
                                       verbose=settings.verbose and (job is None or job.leader),
                                       last_batch_ends_epoch=False)
        self._where = where
        self.global_step = 0  # items trained, counted across resumes (the step of states without an optimizer's)
        self.skip = 0
        self.data = DataSources()  # what orders the items batches() is given, besides the global random state
        self._restoring: set[str] = set()  # what of the resumed epoch is still to restore: "random", "data"
        self._inexact: set[str] = set()  # what the resume said it could not restore (each once)
        self.ended = False
        self._last_loss = None
        self._logged: dict[str, list[float]] = {}
        self._thread = threading.get_ident()  # the loop's thread: the one that entered the block
        self.step_of = self.step  # a job's receipt names the loop's items

    # Opening (the session calls these, in its order) -------------------------------

    def open(self) -> None:
        """Opens the session, on the loop's thread (on failure what was
        opened closes and the run fails); the loop's first boundary takes
        what waits."""
        session = self.session
        session.open()
        if not session.start(act_now=False):  # the cell's run was stopped before this loop
            session.run.journal.log("info", "The TrainLoop does not train: the run was told to stop before it began.")

    def opened(self, stack: contextlib.ExitStack):
        return self._where

    def new_steering(self, run, progress, say) -> Steering:
        refused = getattr(self.trained, "steering_refused", None)
        if refused:
            return StatelessSteering(refused, self.trained, self.tunables, run, progress, say)
        return Steering(self.trained, self.tunables, run, progress, say)

    def wire(self, stack: contextlib.ExitStack, saves) -> None:
        """The loop's boundaries are its own methods: nothing to wire."""

    def resume(self, store, on_skip) -> Resumed:
        """Loads the newest checkpoint that loads; the resumed epoch's random
        state and data order are put back when it starts again, and its
        trained items skipped."""
        checkpoint = store.restore_latest(self.trained.restore, on_skip=on_skip).checkpoint
        if checkpoint is None:
            return Resumed(f"No checkpoint in {store.directory} loads: starting from scratch.")
        position = checkpoint.position
        self._restoring = {"random", "data"}
        resume_state = checkpoint.info.get("resume_state")
        self.data.resume(resume_state.get("data") if isinstance(resume_state, dict) else None)
        self.skip = position.resume_step
        self.global_step = position.global_step or 0
        skipping = skipping_words(self.skip, "item")
        return Resumed(f"Resumed from {checkpoint.path}: epoch {position.resume_epoch + 1}{skipping}; "
                       f"step {self.trained.step()}", checkpoint=checkpoint, epoch=position.resume_epoch)

    def data_state(self, position: TrainingPosition, in_epoch: bool) -> Mapping[str, Any] | None:
        return self.data.state(epoch_in_progress=in_epoch)

    # Boundaries ------------------------------------------------------------------

    def end_training(self) -> None:
        self.ended = True

    def step(self) -> int:
        """Items trained, counted across resumes (what a job's receipt names)."""
        return self.global_step

    def on_loop_thread(self) -> bool:
        """True on the thread that runs the loop."""
        return threading.get_ident() == self._thread

    def epoch_began(self, epoch: int, steps: int | None) -> None:
        """An epoch begins, before any line of its body: the counters, its
        random state (a resumed epoch's: the interrupted run's as it began),
        and waiting commands."""
        session = self.session
        session.progress.begin_epoch(epoch, steps)
        self._logged = {}
        self.data.epoch_began()
        if "random" in self._restoring:
            self._restoring.discard("random")
            session.random_at_epoch_start = self._restore_epoch_start(epoch)
        else:
            session.random_at_epoch_start = random_state.capture_epoch_start()
        self._act(mid_epoch=False)

    @property
    def _resumed(self):
        """The checkpoint the loop resumed from (while its epoch is restored)."""
        return self.session.resumption.checkpoint

    def _restore_epoch_start(self, epoch: int):
        """Puts back the random state the resumed epoch began with; returns
        it, as its later checkpoints keep it (the interrupted run's start)."""
        state = self._resumed.info.get("resume_state")
        self._not_exact(random_state.restore_epoch_start(state, epoch))
        if not self.skip:  # the checkpoint's generators are of its boundary: here, the epoch's start
            self._not_exact(random_state.restore_seed_generators(self.model, state))
        return random_state.kept_epoch_start(state, epoch) or random_state.capture_epoch_start()

    def data_began(self, items: Any) -> None:
        """`batches` is about to open an iterator of `items`: counted, and in
        a resumed epoch, its own order put back as the interrupted run had it."""
        if "data" in self._restoring:
            self._restoring.discard("data")
            self._not_exact(self.data.restore(items))
            if self.skip:
                self.session.progress.pin(self._resumed.position)  # a checkpoint now is of the resumed one's state
        self.data.opening(items)

    def item_skipped(self, done: bool) -> None:
        """An item the resumed checkpoint already trained was drawn (not yielded)."""
        session = self.session
        progress = session.progress
        progress.step_skipped()
        if done:
            self.skip = 0
            progress.unpin()
            state = self._resumed.info.get("resume_state")
            random_state.restore_now(state)
            self._not_exact(random_state.restore_seed_generators(self.model, state))
        if session.actions.pending:
            self._act(mid_epoch=True)

    def _not_exact(self, reason: str | None) -> None:
        """Says, once, what the resume could not restore."""
        if reason is not None and reason not in self._inexact:
            self._inexact.add(reason)
            self.session.report("warning", f"Resume is not exact: {reason}.")

    def item_done(self) -> None:
        """The boundary after an item the loop's body trained on."""
        session = self.session
        progress = session.progress
        progress.step_done(progress.step + 1)
        self.global_step += 1
        loss, self._last_loss = self._last_loss, None
        session.run.history.add_loss(loss)
        if loss is not None and not math.isfinite(loss):
            session.nan_policy.on_non_finite(loss, progress.epoch, progress.step - 1)
        if session.actions.pending:
            self._act(mid_epoch=True)

    def item_begins(self) -> None:
        """An item is about to be yielded to the body: in a job, waits while
        the job agrees on a command's step (a process does not begin an item
        past the one it said it can act at)."""
        session = self.session
        if session.gate is not None:
            session.gate.before_step(session.progress.boundary)

    def _act(self, mid_epoch: bool) -> None:
        """Applies what waits; in a job, first says it acts here, and acts
        again for what the job agreed on meanwhile."""
        gate, actions = self.session.gate, self.session.actions
        if gate is not None:
            gate.acting()
        while True:
            actions.apply_pending(mid_epoch=mid_epoch)
            if gate is None or not gate.acted():
                return

    def epoch_ended(self, epoch: int) -> None:
        """The epoch's end: its mean logs into the history, waiting commands."""
        logs = {name: sum(values) / len(values) for name, values in self._logged.items() if values}
        self.session.run.history.record_epoch(epoch, logs)
        self.session.progress.end_epoch()  # its metrics are the items' (`log`)
        self._act(mid_epoch=False)

    def log(self, metrics: dict[str, Any]) -> None:
        """The body's metrics for the item in progress (``loss`` drives the NaN policy)."""
        plain = {}
        for name, value in metrics.items():
            number = float(value)
            plain[name] = number
            self._logged.setdefault(name, []).append(number)
        progress = self.session.progress
        progress.set_metrics({**progress.metrics, **plain})
        if "loss" in plain:
            self._last_loss = plain["loss"]

    # Interrupts and the end ---------------------------------------------------------

    def write_end_checkpoint(self) -> None:
        """The loop ran all its epochs: a last checkpoint (reason ``end``;
        a failure is said, not raised)."""
        self.session.actions.saves.write_end("loop")

    def close(self, final_state: RunState, error: str | None = None, end_reason: str | None = None) -> None:
        """Ends the loop's run in `final_state` (`TrainingSession.close`),
        saying how its commands ended it unless `end_reason` says."""
        session = self.session
        session.close(final_state, error, end_reason or session.end_reason_for(final_state))

    def before_close(self, final_state: RunState) -> None:
        job = self.session.job
        if job is not None and final_state == RunState.FAILED and self.on_loop_thread():
            job.await_verdict()  # the body raised: a peer's loss, if that was why, leads the error

    def after_close(self) -> None:
        safeguards = self.session.safeguards
        if safeguards is not None and self.on_loop_thread():  # the loop's run has ended: SIGTERM goes on
            safeguards.deliver_sigterm()

