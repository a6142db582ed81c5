"""The one training session (`boundary.session.TrainingSession`), served by a driver written here.

`fit` and `TrainLoop` are thin adapters of one session; a new driver is
wired once. These tests prove it with a third one, `StepDriver`: plain
Python steps, no Keras, no `TrainLoop`, whose adapter only reports its
boundaries and says how its state is saved and resumed. A real run (its
FIFO, its record, its checkpoints) and real senders; the commands' words,
checkpoints, acknowledgements, resume and end come from the session alone.
"""

from __future__ import annotations

import contextlib
import json
import types

import pytest

from helpers import wait_until
from jupyter_traincontrol.boundary.session import Resumed, TrainingSession
from jupyter_traincontrol.boundary.steering import Steering
from jupyter_traincontrol.loop.states import build_state
from jupyter_traincontrol.protocol import RunState, final_state
from jupyter_traincontrol.registry import find_run
from jupyter_traincontrol.run import RunLifecycle

STEPS_PER_EPOCH = 5


def settings(resume: bool = False):
    """What the session reads of its driver's settings."""
    return types.SimpleNamespace(resume=resume, save_in_background=False, autosave=None, sigterm_grace=5.0,
                                 on_nan="stop", nan_rollbacks=3)


class StepDriver:
    """A driver of plain Python steps: one number trained, one step at a time.

    What a new driver writes: its boundaries (`train`), how its state is
    saved and loaded (a JSON file), and where a resume puts it.
    """

    unit = "step"
    model = None
    exact_resume = True
    handles_sigint = False
    handles_sigterm = False
    reads_tunables_anywhere = False
    attachments = None
    step_of = None

    def __init__(self, run: RunLifecycle, resume: bool = False):
        self.value = 0
        self.steps = 0
        self.ended = False
        self.closed_in: RunState | None = None
        self.trained, self.tunables = build_state(save=self._save, load=self._load, step=lambda: self.steps)
        self.session = TrainingSession(run, self, settings(resume), verbose=False)  # no scope: its run is its own

    def _save(self, folder) -> None:
        (folder / "value.json").write_text(json.dumps({"value": self.value, "steps": self.steps}))

    def _load(self, folder) -> None:
        saved = json.loads((folder / "value.json").read_text())
        self.value, self.steps = saved["value"], saved["steps"]

    # What the session asks of its driver.

    def opened(self, stack: contextlib.ExitStack):
        return None

    def new_steering(self, run, progress, say) -> Steering:
        return Steering(self.trained, self.tunables, run, progress, say)

    def wire(self, stack, saves) -> None:
        pass

    def resume(self, store, on_skip) -> Resumed:
        checkpoint = store.restore_latest(self.trained.restore, on_skip=on_skip).checkpoint
        if checkpoint is None:
            return Resumed("Nothing to resume from.")
        position = checkpoint.position
        return Resumed(f"Resumed at value {self.value}.", checkpoint=checkpoint, epoch=position.resume_epoch)

    def data_state(self, position, in_epoch):
        return None

    def end_training(self) -> None:
        self.ended = True

    def before_close(self, final_state) -> None:
        pass

    def after_close(self) -> None:
        self.closed_in = self.session.final_state

    # The driver's boundaries.

    def train(self, epochs: int, at_step=None) -> None:
        """Trains `epochs` epochs; `at_step(step)` runs after each step, before its boundary."""
        session = self.session
        session.open()
        session.start()
        progress = session.progress
        progress.plan(epochs, STEPS_PER_EPOCH)
        try:
            for epoch in range(progress.epoch, epochs):
                progress.begin_epoch(epoch, STEPS_PER_EPOCH)
                for step in range(STEPS_PER_EPOCH):
                    self.value += 1
                    self.steps += 1
                    progress.step_done(step + 1)
                    if at_step is not None:
                        at_step(self.steps)
                    session.actions.apply_pending(mid_epoch=True)
                    if self.ended:
                        break
                progress.end_epoch()
                if self.ended:
                    break
        except BaseException as error:
            session.close(RunState.FAILED, repr(error))
            raise
        session.close(final_state(session.ended_by))


def send_at(run: RunLifecycle, plan: dict[int, str]):
    """`at_step` that sends a command through the run's FIFO (as the CLI
    does) at the steps of `plan`, and waits until the run's thread has
    queued it: the next boundary acts on it."""
    def at_step(step: int) -> None:
        if step in plan:
            run.send(plan[step], sender="cli")
            wait_until(lambda: run.channel.pending, message=f"{plan[step]!r} queued")
    return at_step


def test_a_new_driver_gets_save_and_stop_with_checkpoints_and_acks_from_the_session_alone(tmp_path):
    run = RunLifecycle("steps", tmp_path / "ckpt")
    driver = StepDriver(run)
    driver.train(epochs=4, at_step=send_at(run, {3: "save", 7: "stop"}))
    assert driver.steps == 7 and driver.ended
    assert driver.closed_in is RunState.STOPPED and run.state is RunState.STOPPED
    record = find_run("steps")
    assert record["state"] == "stopped" and record["end_reason"] == "command"
    assert [ack["outcome"] for ack in record["acks"]] == ["applied", "applied"]
    saved = [json.loads((path / "value.json").read_text())["value"] for path in run.checkpoint_paths()]
    assert saved == [3, 7]  # each checkpoint of the step it was asked at


def test_a_new_driver_resumes_where_its_checkpoint_was_taken(tmp_path):
    first = StepDriver(RunLifecycle("again", tmp_path / "ckpt"))
    first.train(epochs=4, at_step=send_at(first.session.run, {7: "stop"}))
    assert first.value == 7

    second = StepDriver(RunLifecycle("again", tmp_path / "ckpt"), resume=True)
    second.train(epochs=2)  # the checkpoint is of epoch 2's step 2: training goes on in epoch 2
    resumed = second.session.resumption
    assert resumed is not None and resumed.checkpoint.path.name in {p.name for p in first.session.run.checkpoint_paths()}
    assert resumed.message == "Resumed at value 7." and second.session.progress.epoch == 1
    assert second.value == 7 + STEPS_PER_EPOCH  # from the loaded value (this driver skips no step it trained)
    assert second.session.run.state is RunState.FINISHED


def test_a_new_drivers_abort_ends_it_without_a_checkpoint_and_bad_commands_are_refused(tmp_path):
    run = RunLifecycle("refused", tmp_path / "ckpt")
    driver = StepDriver(run)
    driver.train(epochs=4, at_step=send_at(run, {2: "set nothing=1", 4: "abort"}))
    assert driver.steps == 4 and run.state is RunState.ABORTED
    assert run.checkpoint_paths() == []
    record = find_run("refused")
    outcome, message = record["acks"][0]["outcome"], record["acks"][0]["message"]
    assert outcome == "failed" and "nothing" in message, record["acks"]
    assert record["acks"][1]["outcome"] == "applied"


def test_a_driver_that_fails_to_open_leaves_the_run_failed_and_nothing_behind(tmp_path):
    run = RunLifecycle("broken", tmp_path / "ckpt")
    driver = StepDriver(run)

    def refuse(run, progress, say):
        raise RuntimeError("no steering here")

    driver.new_steering = refuse
    with pytest.raises(RuntimeError, match="no steering here"):
        driver.train(epochs=1)
    assert run.state is RunState.FAILED
    assert "Could not start: no steering here" in find_run("broken")["error"]


def test_a_runs_state_moves_only_along_the_transition_table(tmp_path):
    """`RunLifecycle.move_to`: a move the table allows is logged and published, a move
    to the state the run is in changes nothing, and one the table forbids raises and
    leaves the state as it was."""
    from jupyter_traincontrol.protocol import InvalidTransitionError

    run = RunLifecycle("moves", tmp_path / "ckpt").open()
    try:
        assert run.state is RunState.STARTING
        assert run.move_to("running") is True and run.move_to(RunState.RUNNING) is False
        with pytest.raises(InvalidTransitionError, match="A run that is running cannot become starting"):
            run.move_to(RunState.STARTING)
        with pytest.raises(ValueError, match="sleeping"):
            run.move_to("sleeping")
        assert run.state is RunState.RUNNING
        assert [event["message"] for event in run.journal.events if event["kind"] == "state"] == ["running"]
        wait_until(lambda: find_run("moves")["state"] == "running", timeout=5, message="the move published")
    finally:
        run.close(RunState.FINISHED)
    assert run.state is RunState.FINISHED and not run.is_open
    with pytest.raises(InvalidTransitionError, match="finished cannot become running"):
        run.move_to("running")
