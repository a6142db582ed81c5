"""One custom loop under control: its parts, opened on entry, closed once, and its boundaries.

`LoopSession` is to a `TrainLoop` what `fit.session.FitSession` is to a
`fit`: the run (its own, or the notebook cell's), the loop's counters, the
commands' actions, saves and steering, the NaN policy, the resume and the
safeguards (Ctrl+C, SIGTERM, autosave), on one `contextlib.ExitStack`. Its boundary methods
(`epoch_began`, `item_done`, `epoch_ended`) are where waiting commands act,
on the loop's thread; they are the same boundary layer as `fit`'s. In a job
(a torch process group, a JAX distributed runtime: `job.Job`) every
process applies each command at one agreed item (`item_begins` waits while
the job agrees on one), process 0 writes the checkpoints, and SIGTERM on
any process stops them all.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Mapping

from ..boundary.session import TrainingSession
from ..boundary.steering import Steering
from ..checkpoint import Checkpoint, TrainingPosition, skipping_words
from ..protocol import RunState
from ..state import random_state
from ..system.signals import on_main_thread
from .data_sources import DataSources
from .stateless import StatelessSteering

__all__ = ["LoopSession"]


class LoopSession(TrainingSession):
    """The parts of one `TrainLoop` run (the run, the job and the
    closing: `boundary.session.TrainingSession`).

    Args:
        run: The run (a `run.RunLifecycle`): open if hosted, else opened here.
        owns_run: True if the loop opened the run (and closes it).
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
    """

    def __init__(self, run, owns_run: bool, trained, tunables, settings, job=None, where=None):
        # In a job, process 0 speaks for every process.
        super().__init__(run, job, verbose=settings.verbose and (job is None or job.leader),
                         last_batch_ends_epoch=False)  # the body may go on after the last item
        self.owns_run = owns_run
        self._where = where
        self.trained = trained
        self.tunables = tunables
        self.settings = settings
        self.global_step = 0  # items trained, counted across resumes (the step of states without an optimizer's)
        self.resumed: Checkpoint | None = None
        self.skip = 0  # items of the resumed epoch already trained
        self.random_at_epoch_start: random_state.EpochStart | random_state.KeptEpochStart | None = None
        self.data = DataSources()  # what orders the items batches() is given, besides the global random state
        self._restoring: set[str] = set()  # what of the resumed epoch is still to restore: "random", "data"
        self._inexact: set[str] = set()  # what the resume said it could not restore (each once)
        self.ended = False  # a stop or abort ended the loop
        self._last_loss = None
        self._logged: dict[str, list[float]] = {}
        self._thread = threading.get_ident()  # the loop's thread: the one that entered the block

    # Opening -------------------------------------------------------------------

    def open(self) -> None:
        """Opens every part, on the loop's thread. On failure what was opened closes, the run fails."""
        try:
            self._open()
        except BaseException as error:
            self.close(RunState.FAILED, f"Could not start: {error}")
            raise

    def _open(self) -> None:
        run, stack, settings, progress = self.run, self._stack, self.settings, self.progress
        self._open_run(self.owns_run)
        # A job saves on the loop's thread, its processes in step (process 0 writes, the others wait for its word).
        store = self._store_for(self._model())
        refused = getattr(self.trained, "steering_refused", None)
        steering = (StatelessSteering(refused, self.trained, self.tunables, run, progress, self.say) if refused
                    else Steering(self.trained, self.tunables, run, progress, self.say))
        saves = self._new_saves(store, background=settings.save_in_background, autosave=settings.autosave,
                                resume_state=self._resume_state, steering=steering)
        channel = self._join_job(self._where, self._model(), step_of=self.step)  # a job's: applied by all at one item
        self._open_actions(channel, saves, steering, self._end, settings.on_nan, settings.nan_rollbacks)
        store.acquire()
        stack.callback(store.release)
        stack.callback(self.actions.detach)  # the saves end while the folder is still held
        if settings.resume:
            self._resume(store)
        steering.begin(self.resumed)
        main = self.owns_run and on_main_thread()  # a notebook cell's run is the kernel's (its shutdown path)
        self._open_safeguards(saves, "item", sigint=settings.handle_sigint and main, sigterm=settings.handle_sigterm and main,
                              sigterm_grace=settings.sigterm_grace, on_second_sigint=self._on_second_sigint)
        if run.state == RunState.STARTING:
            run.move_to(RunState.RUNNING)
        if run.state == RunState.STOPPING:  # the cell's run was stopped before this loop
            self.ended = True
            run.journal.log("info", "The TrainLoop does not train: the run was told to stop before it began.")
        if self.owns_run:
            self.say(run.listening_words())

    def _on_second_sigint(self, raises: bool) -> None:
        if raises:  # in a signal handler: a flag (Python may swallow the KeyboardInterrupt; the next boundary won't)
            self.actions.interrupt_at_next_boundary()

    def _resume(self, store) -> None:
        run = self.run
        restored = store.restore_latest(self.trained.restore, on_skip=self._report_skipped)
        checkpoint = restored.checkpoint
        if checkpoint is None:
            message = f"No checkpoint in {run.store.directory} loads: starting from scratch."
        else:
            position = checkpoint.position
            self.resumed = checkpoint
            self._restoring = {"random", "data"}
            resume_state = checkpoint.info.get("resume_state")
            self.data.resume(resume_state.get("data") if isinstance(resume_state, dict) else None)
            self.skip = position.resume_step
            self.global_step = position.global_step or 0
            self.progress.resume_at(position.resume_epoch, self.trained.step())
            skipping = skipping_words(self.skip, "item")
            message = (f"Resumed from {checkpoint.path}: epoch {position.resume_epoch + 1}{skipping}; "
                       f"step {self.progress.global_step}")
        run.journal.log("info", message)
        self.say(message)

    # Boundaries ------------------------------------------------------------------

    def _end(self) -> None:
        self.ended = True

    def step(self) -> int:
        return self.global_step

    def on_loop_thread(self) -> bool:
        """True on the thread that runs the loop."""
        return threading.get_ident() == self._thread

    def _resume_state(self, position: TrainingPosition) -> Mapping[str, Any] | None:
        if self.progress.pinned is not None:
            return self.resumed.info.get("resume_state")
        in_progress = position.resume_epoch == self.progress.epoch
        started = self.random_at_epoch_start if in_progress else None
        return random_state.capture(self._model(), position.resume_epoch, started,
                                    self.data.state(epoch_in_progress=in_progress))

    def _model(self):
        return getattr(self.settings, "model", None)

    def epoch_began(self, epoch: int, steps: int | None) -> None:
        """An epoch begins, before any line of its body: the counters, its
        random state (a resumed epoch's: the interrupted run's as it began),
        and waiting commands."""
        self.progress.begin_epoch(epoch, steps)
        self._logged = {}
        self.data.epoch_began()
        if "random" in self._restoring:
            self._restoring.discard("random")
            self.random_at_epoch_start = self._restore_epoch_start(epoch)
        else:
            self.random_at_epoch_start = random_state.capture_epoch_start()
        self._act(mid_epoch=False)

    def _restore_epoch_start(self, epoch: int):
        """Puts back the random state the resumed epoch began with; returns
        it, as its later checkpoints keep it (the interrupted run's start)."""
        state = self.resumed.info.get("resume_state")
        self._not_exact(random_state.restore_epoch_start(state, epoch))
        if not self.skip:  # the checkpoint's generators are of its boundary: here, the epoch's start
            self._not_exact(random_state.restore_seed_generators(self._model(), state))
        return random_state.kept_epoch_start(state, epoch) or random_state.capture_epoch_start()

    def data_began(self, items: Any) -> None:
        """`batches` is about to open an iterator of `items`: counted, and in
        a resumed epoch, its own order put back as the interrupted run had it."""
        if "data" in self._restoring:
            self._restoring.discard("data")
            self._not_exact(self.data.restore(items))
            if self.skip:
                self.progress.pin(self.resumed.position)  # a checkpoint now is of the resumed one's state
        self.data.opening(items)

    def item_skipped(self, done: bool) -> None:
        """An item the resumed checkpoint already trained was drawn (not yielded)."""
        progress = self.progress
        progress.step_skipped()
        if done:
            self.skip = 0
            progress.unpin()
            state = self.resumed.info.get("resume_state")
            random_state.restore_now(state)
            self._not_exact(random_state.restore_seed_generators(self._model(), state))
        if self.actions.pending:
            self._act(mid_epoch=True)

    def _not_exact(self, reason: str | None) -> None:
        """Says, once, what the resume could not restore."""
        if reason is not None and reason not in self._inexact:
            self._inexact.add(reason)
            self.report("warning", f"Resume is not exact: {reason}.")

    def item_done(self) -> None:
        """The boundary after an item the loop's body trained on."""
        progress = self.progress
        progress.step_done(progress.step + 1)
        self.global_step += 1
        loss, self._last_loss = self._last_loss, None
        self.run.history.add_loss(loss)
        if loss is not None and not math.isfinite(loss):
            self.nan_policy.on_non_finite(loss, progress.epoch, progress.step - 1)
        if self.actions.pending:
            self._act(mid_epoch=True)

    def item_begins(self) -> None:
        """An item is about to be yielded to the body: in a job, waits while
        the job agrees on a command's step (a process does not begin an item
        past the one it said it can act at)."""
        if self.gate is not None:
            self.gate.before_step(self.progress.boundary)

    def _act(self, mid_epoch: bool) -> None:
        """Applies what waits; in a job, first says it acts here, and acts
        again for what the job agreed on meanwhile."""
        gate = self.gate
        if gate is not None:
            gate.acting()
        while True:
            self.actions.apply_pending(mid_epoch=mid_epoch)
            if gate is None or not gate.acted():
                return

    def epoch_ended(self, epoch: int) -> None:
        """The epoch's end: its mean logs into the history, waiting commands."""
        logs = {name: sum(values) / len(values) for name, values in self._logged.items() if values}
        self.run.history.record_epoch(epoch, logs)
        self.progress.end_epoch()  # its metrics are the items' (`log`)
        self._act(mid_epoch=False)

    def log(self, metrics: dict[str, Any]) -> None:
        """The body's metrics for the item in progress (``loss`` drives the NaN policy)."""
        plain = {}
        for name, value in metrics.items():
            number = float(value)
            plain[name] = number
            self._logged.setdefault(name, []).append(number)
        self.progress.set_metrics({**self.progress.metrics, **plain})
        if "loss" in plain:
            self._last_loss = plain["loss"]

    # Interrupts and the end ---------------------------------------------------------

    def write_end_checkpoint(self) -> None:
        """The loop ran all its epochs: a last checkpoint (reason ``end``;
        a failure is said, not raised)."""
        self.actions.saves.write_end("loop")

    def close(self, final_state: RunState, error: str | None = None, end_reason: str | None = None) -> None:
        """Ends the loop's run in `final_state` (`TrainingSession.close`),
        saying how its commands ended it unless `end_reason` says."""
        super().close(final_state, error, end_reason or self.end_reason_for(final_state))

    def _before_close(self, final_state: RunState) -> None:
        if self.job is not None and final_state == RunState.FAILED and self.on_loop_thread():
            self.job.await_verdict()  # the body raised: a peer's loss, if that was why, leads the error

    def _after_close(self) -> None:
        if self.safeguards is not None and self.on_loop_thread():  # the loop's run has ended: SIGTERM goes on
            self.safeguards.deliver_sigterm()

