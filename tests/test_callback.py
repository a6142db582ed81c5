"""ControlCallback in real `fit` calls on a tiny model, commanded through its real FIFO."""

from __future__ import annotations

import os
import signal
import functools
import threading
import time

import keras
import numpy as np
import pytest

import driving
from driving import abort_run, guarded
from helpers import At, press_ctrl_c_twice_the_second_in_a_gc_callback, read_sidecar, wait_until
from jupyter_traincontrol import ControlCallback
from jupyter_traincontrol.transport.channels import NotListeningError, deliver
from jupyter_traincontrol.registry import NameTakenError, find_run, list_runs

EPOCHS = 4


def send_and_wait_queued(callback, command):
    """Writes `command` to the run's FIFO and waits until the reader queued it."""
    deliver(callback.fifo, command)
    wait_until(lambda: callback.lifecycle.channel is None or callback.lifecycle.channel.pending, message=f"{command} queued")


def sending(callback, command):
    """An `At` action that sends `command` (queued), and the event it sets
    once it has: a remote thread times what follows from the send, however
    slow the fit was to reach it (tracing on a loaded machine)."""
    sent = threading.Event()

    def action(_callback):
        send_and_wait_queued(callback, command)
        sent.set()

    return action, sent


fit = functools.partial(driving.fit, epochs=EPOCHS)


def test_stop_checkpoints_then_ends_fit_gracefully(make_model, tiny_data, ckpt):
    model = make_model()
    control = ControlCallback(name="stopper", checkpoint_dir=ckpt)
    probe = At(1, 2, lambda cb: send_and_wait_queued(control, "stop"))
    history = fit(model, tiny_data, control, probe)
    assert history.epoch == [0, 1]  # the partial epoch is listed, as Keras does
    assert probe.train_end_called
    assert control.state == "stopped"
    (checkpoint,) = control.checkpoints
    info = read_sidecar(checkpoint)
    # The command was queued during batch 2, so it acts at the end of batch 3.
    assert (info["epoch"], info["step_in_epoch"], info["epoch_complete"]) == (1, 4, False)
    assert info["global_step"] == 8 + 4 == int(model.optimizer.iterations.numpy())
    assert info["reason"] == "stop"
    record = find_run("stopper")
    assert record["state"] == "stopped" and record["fifo"] is None
    assert record["checkpoints"] == [str(checkpoint)]
    assert any(e["message"] == "stop received" for e in record["events"])


class InjectAtEpochBegin(keras.callbacks.Callback):
    """Queues `lines` when epoch `epoch` begins (placed before the control
    callback: they wait at the epoch's first boundary)."""

    def __init__(self, control, epoch, *lines):
        super().__init__()
        self.control, self.epoch, self.lines = control, epoch, lines

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            for index, line in enumerate(self.lines):
                self.control.lifecycle.channel.inject(f"{line} #begin{index}")


@pytest.mark.parametrize("lines", [("stop",), ("pause", "stop")], ids=["stop", "pause-then-stop"])
def test_a_stop_at_an_epochs_begin_ends_fit_at_its_checkpoints_step(make_model, tiny_data, ckpt, lines):
    """Keras runs a step after on_epoch_begin before it checks stop_training:
    a stop that comes there acts after that step, so the model that fit
    leaves is the one in the stop's checkpoint (seen once under
    MirroredStrategy: checkpoint at step 16, model at 17)."""
    model = make_model()
    control = ControlCallback(name="atbegin", checkpoint_dir=ckpt)
    history = fit(model, tiny_data, InjectAtEpochBegin(control, 1, *lines), control)
    assert history.epoch == [0, 1] and control.state == "stopped"
    (checkpoint,) = control.checkpoints
    info = read_sidecar(checkpoint)
    assert (info["epoch"], info["step_in_epoch"], info["reason"]) == (1, 1, "stop")
    assert info["global_step"] == 8 + 1 == int(model.optimizer.iterations.numpy())
    record = find_run("atbegin")
    assert sorted(i for a in record["acks"] if a["outcome"] == "applied" for i in a["ids"]) == [
        f"begin{index}" for index in range(len(lines))]


def test_save_writes_a_checkpoint_and_training_goes_on(make_model, tiny_data, ckpt):
    model = make_model()
    control = ControlCallback(name="saver", checkpoint_dir=ckpt, save_at_end=False)  # the save's checkpoint only
    history = fit(model, tiny_data, control, At(0, 5, lambda cb: send_and_wait_queued(control, "save")))
    assert history.epoch == list(range(EPOCHS))
    assert control.state == "finished"
    (checkpoint,) = control.checkpoints
    assert read_sidecar(checkpoint)["reason"] == "save"
    assert read_sidecar(checkpoint)["global_step"] == 7


def test_abort_ends_fit_without_a_checkpoint(make_model, tiny_data, ckpt):
    model = make_model()
    control = ControlCallback(name="aborter", checkpoint_dir=ckpt)
    probe = At(2, 0, lambda cb: send_and_wait_queued(control, "abort"))
    history = fit(model, tiny_data, control, probe)
    assert history.epoch == [0, 1, 2]
    assert probe.train_end_called
    assert control.state == "aborted"
    assert control.checkpoints == []
    assert not ckpt.exists()  # taken (made) at train begin, nothing written in it: removed as the run let go


def test_pause_holds_the_training_thread_and_commands_still_act(make_model, tiny_data, ckpt):
    model = make_model()
    control = ControlCallback(name="pauser", checkpoint_dir=ckpt)
    steps_seen = []

    class Counter(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            steps_seen.append(batch)

    send_pause, pause_sent = sending(control, "pause")

    def remote():
        pause_sent.wait(300)
        wait_until(lambda: control.state == "paused", message="paused")
        held_at = len(steps_seen)
        time.sleep(0.4)  # a negative observation: no step while paused
        assert len(steps_seen) == held_at, "training went on while paused"
        wait_until(lambda: find_run("pauser")["state"] == "paused", message="the record to say paused")
        deliver(control.fifo, "save")
        wait_until(lambda: len(control.checkpoints) == 1, message="checkpoint while paused")
        assert len(steps_seen) == held_at
        deliver(control.fifo, "resume")

    errors = []
    thread = threading.Thread(target=lambda: guarded(remote, errors, unblock=lambda: abort_run(control)))
    thread.start()
    try:
        history = fit(model, tiny_data, control, Counter(), At(1, 3, send_pause))
    finally:
        pause_sent.set()  # a fit that ended early lets the remote fail at once
        thread.join()
    assert not errors, errors[0]
    assert history.epoch == list(range(EPOCHS))
    assert control.state == "finished"
    assert [e["message"] for e in control.lifecycle.journal.events if e["kind"] == "state"][:3] == ["running", "paused", "running"]


def test_stop_while_paused(make_model, tiny_data, ckpt):
    model = make_model()
    control = ControlCallback(name="pstop", checkpoint_dir=ckpt)

    send_pause, pause_sent = sending(control, "pause")

    def remote():
        pause_sent.wait(300)
        wait_until(lambda: control.state == "paused", message="paused")
        deliver(control.fifo, "stop")

    thread = threading.Thread(target=remote)
    thread.start()
    try:
        history = fit(model, tiny_data, control, At(0, 1, send_pause))
    finally:
        pause_sent.set()
        thread.join()
    assert history.epoch == [0]
    assert control.state == "stopped"
    assert read_sidecar(control.checkpoints[0])["step_in_epoch"] == 3


def test_a_command_during_validation_acts_before_the_next_epoch(make_model, tiny_data, ckpt):
    model = make_model()
    control = ControlCallback(name="val", checkpoint_dir=ckpt)
    probe = At(0, 0, lambda cb: send_and_wait_queued(control, "stop"), hook="on_test_batch_begin")
    history = fit(model, tiny_data, control, probe, validation_split=0.25)
    assert history.epoch == [0]
    info = read_sidecar(control.checkpoints[0])
    assert (info["epoch"], info["epoch_complete"], info["resume_epoch"], info["resume_step"]) == (0, True, 1, 0)


def test_user_callbacks_finish_their_work_after_stop(make_model, tiny_data, ckpt, tmp_path):
    model = make_model()
    control = ControlCallback(name="composer", checkpoint_dir=ckpt)
    # mode="max" on a falling loss makes epoch 0 the best: restoring is visible.
    early = keras.callbacks.EarlyStopping(monitor="loss", mode="max", patience=100, restore_best_weights=True)
    saver = keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras"), monitor="loss")
    board = keras.callbacks.TensorBoard(log_dir=str(tmp_path / "tb"))
    history = fit(model, tiny_data, control, early, saver, board, At(2, 4, lambda cb: send_and_wait_queued(control, "stop")))
    assert history.epoch == [0, 1, 2]
    for restored, best in zip(model.get_weights(), early.best_weights):
        np.testing.assert_array_equal(restored, best)
    last = keras.models.load_model(control.checkpoints[0])
    assert not np.allclose(last.get_weights()[0], model.get_weights()[0])
    assert (tmp_path / "best.keras").exists()
    assert any((tmp_path / "tb").rglob("*.tfevents.*"))


def test_first_sigint_stops_gracefully_and_the_handler_is_restored(make_model, tiny_data, ckpt, ctrl_c):
    before = signal.getsignal(signal.SIGINT)
    model = make_model()
    control = ControlCallback(name="ctrlc", checkpoint_dir=ckpt)

    def interrupt(cb):
        os.kill(os.getpid(), signal.SIGINT)
        wait_until(lambda: control.lifecycle.channel.pending, message="stop queued")

    history = fit(model, tiny_data, control, At(1, 1, interrupt))
    assert history.epoch == [0, 1]
    assert control.state == "stopped"
    assert read_sidecar(control.checkpoints[0])["reason"] == "interrupt"
    assert signal.getsignal(signal.SIGINT) is before


def test_second_sigint_raises_keyboard_interrupt_and_cleans_up(make_model, tiny_data, ckpt, ctrl_c):
    before = signal.getsignal(signal.SIGINT)
    model = make_model()
    control = ControlCallback(name="ctrlc2", checkpoint_dir=ckpt)

    def interrupt_twice(cb):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        fit(model, tiny_data, control, At(1, 1, interrupt_twice))
    assert signal.getsignal(signal.SIGINT) is before  # handed back at once, from the handler
    # The handler only notes the cause; the run is ended off the signal handler (its watchdog).
    wait_until(lambda: control.state == "failed", timeout=10, message="the run ended as failed")
    assert "second Ctrl+C" in control.lifecycle.error
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # Python's report of the swallowed one
def test_a_second_sigint_handled_inside_a_gc_callback_still_interrupts(make_model, tiny_data, ckpt, ctrl_c):
    """A handler that runs inside a garbage-collector callback (JAX registers
    one) cannot raise out of it: Python prints the error and goes on. The
    second Ctrl+C was then lost, and the run went on to a graceful stop; the
    next boundary raises it now."""
    model = make_model()
    control = ControlCallback(name="ctrlc-gc", checkpoint_dir=ckpt)
    with pytest.raises(KeyboardInterrupt):
        fit(model, tiny_data, control, At(1, 1, lambda cb: press_ctrl_c_twice_the_second_in_a_gc_callback()))
    wait_until(lambda: control.state == "failed", timeout=10, message="the run ended as failed")
    assert "second Ctrl+C" in control.lifecycle.error
    assert control.checkpoints == []  # not the first press's graceful stop


def test_a_failing_fit_marks_the_run_failed_and_releases_everything(make_model, tiny_data, ckpt):
    model = make_model()
    control = ControlCallback(name="crash", checkpoint_dir=ckpt)

    def explode(cb):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fit(model, tiny_data, control, At(1, 2, explode))
    wait_until(lambda: control.state == "failed", message="the watchdog to notice")
    # The run's thread writes the record once it has marked the run failed.
    wait_until(lambda: find_run("crash")["state"] == "failed", timeout=5, message="the failed record")
    with pytest.raises(NotListeningError):
        control.send("stop")


def test_a_taken_name_fails_the_second_fit_clearly(make_model, tiny_data, ckpt):
    model = make_model()
    first = ControlCallback(name="twin", checkpoint_dir=ckpt)
    errors = []

    def second_fit(cb):
        try:
            fit(make_model(seed=3), tiny_data, ControlCallback(name="twin", checkpoint_dir=ckpt), epochs=1)
        except NameTakenError as error:
            errors.append(error)

    fit(model, tiny_data, first, At(0, 1, second_fit), epochs=1)
    assert "A run named 'twin' is already running" in str(errors[0])
    assert first.state == "finished"


def test_garbage_on_the_fifo_is_logged_and_the_run_stays_controllable(make_model, tiny_data, ckpt):
    model = make_model()
    control = ControlCallback(name="garbage", checkpoint_dir=ckpt)

    def spray(cb):
        fd = os.open(control.fifo, os.O_WRONLY)
        os.write(fd, b"\x00\xff garbage\nfrobnicate\n")
        os.close(fd)
        wait_until(lambda: any(e["kind"] == "rejected" for e in control.lifecycle.journal.events), message="rejections")
        send_and_wait_queued(control, "stop")

    fit(model, tiny_data, control, At(0, 3, spray))
    assert control.state == "stopped"
    rejected = [e["message"] for e in control.lifecycle.journal.events if e["kind"] == "rejected"]
    assert len(rejected) == 2 and "frobnicate" in rejected[1]


def test_the_record_shows_live_progress(make_model, tiny_data, ckpt):
    model = make_model()
    control = ControlCallback(name="progress", checkpoint_dir=ckpt)
    seen = {}

    def look(cb):
        try:
            deliver(control.fifo, "pause")
            wait_until(lambda: find_run("progress")["state"] == "paused", message="paused record")
            seen.update(find_run("progress"))
        finally:
            deliver(control.fifo, "resume")  # whatever happened: the fit must not stay paused

    def pause_later(cb):
        threading.Thread(target=look, args=(cb,)).start()
        wait_until(lambda: control.lifecycle.channel.pending, message="pause queued")

    fit(model, tiny_data, control, At(2, 4, pause_later))
    assert (seen["epoch"], seen["epochs"], seen["steps"]) == (3, EPOCHS, 8)
    assert seen["step"] == 6 and "loss" in seen["metrics"]
    assert [h["epoch"] for h in seen["history"]] == [1, 2]


def test_resume_continues_the_optimizer_step_and_the_epoch(make_model, tiny_data, ckpt):
    control = ControlCallback(name="first", checkpoint_dir=ckpt)
    fit(make_model(), tiny_data, control, At(1, 6, lambda cb: send_and_wait_queued(control, "stop")))
    assert read_sidecar(control.checkpoints[0])["epoch_complete"] is True  # stopped at the epoch's last batch

    resumed_model = make_model(seed=5)
    resumed = ControlCallback(name="first", checkpoint_dir=ckpt, resume=True)  # a run resumes its own checkpoints
    history = fit(resumed_model, tiny_data, resumed)
    assert history.epoch == [2, 3]
    assert int(resumed_model.optimizer.iterations.numpy()) == EPOCHS * 8
    assert getattr(resumed_model, "_initial_epoch", None) is None  # Keras's leftover is put back


def test_resume_mid_epoch_equals_an_uninterrupted_run(make_model, tiny_data, ckpt):
    straight = make_model(seed=7)
    fit(straight, tiny_data)

    interrupted = make_model(seed=7)
    first = ControlCallback(name="part1", checkpoint_dir=ckpt)
    fit(interrupted, tiny_data, first, At(1, 2, lambda cb: send_and_wait_queued(first, "stop")))
    assert read_sidecar(first.checkpoints[0])["step_in_epoch"] == 4

    continued = make_model(seed=99)  # different initial weights: all must come from the checkpoint
    history = fit(continued, tiny_data, ControlCallback(name="part1", checkpoint_dir=ckpt, resume=True))
    assert history.epoch == [1, 2, 3]
    assert int(continued.optimizer.iterations.numpy()) == int(straight.optimizer.iterations.numpy()) == 32
    for a, b in zip(continued.get_weights(), straight.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.backends("tensorflow", "jax", reason="Keras's torch trainer refuses steps_per_execution > 1")
def test_resume_with_steps_per_execution(tiny_data, ckpt):
    from helpers import build_model

    model = build_model()
    model.compile(optimizer="adam", loss="mse", steps_per_execution=2)
    first = ControlCallback(name="spe", checkpoint_dir=ckpt)
    fit(model, tiny_data, first, At(0, 3, lambda cb: send_and_wait_queued(first, "stop")))
    assert read_sidecar(first.checkpoints[0])["step_in_epoch"] % 2 == 0

    again = build_model(seed=1)
    again.compile(optimizer="adam", loss="mse", steps_per_execution=2)
    history = fit(again, tiny_data, ControlCallback(name="spe", checkpoint_dir=ckpt, resume=True), epochs=2)
    assert history.epoch == [0, 1]
    assert int(again.optimizer.iterations.numpy()) == 16


def test_resume_without_a_checkpoint_starts_from_scratch_and_says_so(make_model, tiny_data, ckpt, capsys):
    history = fit(make_model(), tiny_data, ControlCallback(name="fresh", checkpoint_dir=ckpt, resume=True), epochs=2)
    assert history.epoch == [0, 1]
    assert "No checkpoint in" in capsys.readouterr().out


def test_an_instance_can_be_reused_for_several_fits(make_model, tiny_data, ckpt):
    model = make_model()
    control = ControlCallback(name="again", checkpoint_dir=ckpt)
    fit(model, tiny_data, control, epochs=1)
    assert control.state == "finished"
    fit(model, tiny_data, control, At(0, 2, lambda cb: send_and_wait_queued(control, "stop")), epochs=1)
    assert control.state == "stopped"
    assert len(list_runs()) == 1




# A fit that runs to its end -------------------------------------------------------------


def test_a_fit_that_runs_to_its_end_leaves_a_checkpoint_flushed_at_once(make_model, tiny_data, ckpt):
    model = make_model()
    control = ControlCallback(name="ender", checkpoint_dir=ckpt)
    phases = []
    watch = At(0, 0, lambda cb: setattr(control.lifecycle.store, "on_phase", phases.append))
    history = fit(model, tiny_data, control, watch)
    assert history.epoch == list(range(EPOCHS)) and control.state == "finished"
    (checkpoint,) = control.checkpoints
    info = read_sidecar(checkpoint)
    assert info["reason"] == "end"
    assert (info["epoch"], info["step_in_epoch"], info["epoch_complete"]) == (EPOCHS - 1, 8, True)
    assert (info["resume_epoch"], info["resume_step"], info["global_step"]) == (EPOCHS, 0, EPOCHS * 8)
    assert "flushed" in phases  # on disk before fit returned, as a stop's
    for saved, trained in zip(keras.models.load_model(checkpoint).get_weights(), model.get_weights()):
        np.testing.assert_array_equal(saved, trained)
    record = find_run("ender")
    assert record["checkpoints"] == [str(checkpoint)] and record["end_reason"] == "finished"


def test_a_resume_from_the_end_checkpoint_trains_no_more_epochs_but_can_go_on(make_model, tiny_data, ckpt):
    first = ControlCallback(name="done", checkpoint_dir=ckpt)
    fit(make_model(), tiny_data, first)
    saved = keras.models.load_model(first.checkpoints[-1])

    again = make_model(seed=5)
    resumed = ControlCallback(name="done", checkpoint_dir=ckpt, resume=True)
    history = fit(again, tiny_data, resumed)
    assert history.epoch == [] and history.history == {}  # it had all the epochs it asked for
    assert int(again.optimizer.iterations.numpy()) == EPOCHS * 8
    for a, b in zip(again.get_weights(), saved.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert len(resumed.checkpoints) == 1  # nothing trained: no second end checkpoint

    longer = fit(again, tiny_data, ControlCallback(name="done", checkpoint_dir=ckpt, resume=True), epochs=EPOCHS + 2)
    assert longer.epoch == [EPOCHS, EPOCHS + 1]
    assert int(again.optimizer.iterations.numpy()) == (EPOCHS + 2) * 8


def test_save_at_end_false_leaves_a_finished_fit_without_a_checkpoint(make_model, tiny_data, ckpt):
    control = ControlCallback(name="noend", checkpoint_dir=ckpt, save_at_end=False)
    fit(make_model(), tiny_data, control)
    assert control.state == "finished" and control.checkpoints == []
    assert not ckpt.exists()  # the folder it made holds nothing: removed


def test_a_stopped_or_aborted_fit_writes_no_end_checkpoint(make_model, tiny_data, ckpt):
    stopped = ControlCallback(name="s", checkpoint_dir=ckpt)
    fit(make_model(), tiny_data, stopped, At(1, 2, lambda cb: send_and_wait_queued(stopped, "stop")))
    assert [read_sidecar(path)["reason"] for path in stopped.checkpoints] == ["stop"]
    aborted = ControlCallback(name="a", checkpoint_dir=ckpt)
    fit(make_model(), tiny_data, aborted, At(1, 2, lambda cb: send_and_wait_queued(aborted, "abort")))
    assert aborted.checkpoints == []


# How a run ended ----------------------------------------------------------------------------


def _explode(cb):
    raise RuntimeError("boom")


@pytest.mark.parametrize(
    "name, action, state, reason",
    [
        ("by-itself", None, "finished", "finished"),
        ("by-cli", lambda control: deliver(control.fifo, "stop", sender="cli"), "stopped", "command"),
        ("by-echo", lambda control: deliver(control.fifo, "abort"), "aborted", "command"),
        ("by-ctrl-c", lambda control: os.kill(os.getpid(), signal.SIGINT), "stopped", "interrupt"),
        ("by-error", None, "failed", "error"),
    ],
)
def test_the_record_says_how_the_run_ended(make_model, tiny_data, ckpt, ctrl_c, name, action, state, reason):
    control = ControlCallback(name=name, checkpoint_dir=ckpt)

    def act(cb):
        action(control)
        wait_until(lambda: control.lifecycle.channel.pending, message="the command queued")

    if state == "failed":
        with pytest.raises(RuntimeError, match="boom"):
            fit(make_model(), tiny_data, control, At(1, 2, _explode))
        wait_until(lambda: find_run(name)["state"] == "failed", message="the watchdog to notice")
    else:
        fit(make_model(), tiny_data, control, *([At(1, 2, act)] if action else []))
    record = find_run(name)
    assert (record["state"], record["end_reason"]) == (state, reason)


# Resume from another run ----------------------------------------------------------------------


def _stopped_run(make_model, tiny_data, name, ckpt):
    """A run `name` stopped in epoch 2 (batch 4), with its checkpoint in `ckpt`."""
    control = ControlCallback(name=name, checkpoint_dir=ckpt, verbose=False)
    fit(make_model(), tiny_data, control, At(1, 2, lambda cb: send_and_wait_queued(control, "stop")))
    return control.checkpoints[-1]


def test_a_resume_that_finds_only_other_runs_checkpoints_names_them(make_model, tiny_data, ckpt, capsys):
    _stopped_run(make_model, tiny_data, "a", ckpt)
    control = ControlCallback(name="b", checkpoint_dir=ckpt, resume=True)
    history = fit(make_model(), tiny_data, control, epochs=1)
    assert history.epoch == [0]  # from scratch: a run resumes its own checkpoints only
    out = capsys.readouterr().out
    assert f"No checkpoint of run 'b' in {ckpt} yet: starting from scratch." in out
    assert "The folder holds checkpoints of run 'a' (1, newest ckpt-000001-epoch0002-step000004.keras)" in out
    assert "ControlCallback(resume_from='a') or %%interruptible_fit --resume-from a" in out
    warnings = [e["message"] for e in find_run("b")["events"] if e["kind"] == "warning"]
    assert any("resume_from='a'" in message for message in warnings)


def test_resume_from_another_run_continues_it_under_its_own_name(make_model, tiny_data, tmp_path):
    straight = make_model(seed=7)
    fit(straight, tiny_data)
    stopped = _stopped_run(lambda: make_model(seed=7), tiny_data, "a", tmp_path / "a")

    model = make_model(seed=99)
    control = ControlCallback(name="b", checkpoint_dir=tmp_path / "b", resume_from="a")  # a's folder: from a's record
    history = fit(model, tiny_data, control)
    assert history.epoch == [1, 2, 3]
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * 8
    for a, b in zip(model.get_weights(), straight.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    (own,) = control.checkpoints
    assert own.parent == tmp_path / "b" and read_sidecar(own)["run"] == "b"
    assert [e["message"] for e in find_run("b")["events"] if e["message"].startswith("Resumed")][0].startswith(
        f"Resumed from run 'a''s {stopped}: epoch 2, skipping its first 4 batches")
    assert stopped.exists()  # the other run's checkpoint is left as it was


def test_resume_from_a_checkpoint_file(make_model, tiny_data, ckpt, tmp_path):
    stopped = _stopped_run(make_model, tiny_data, "a", ckpt)
    model = make_model(seed=3)
    history = fit(model, tiny_data, ControlCallback(name="c", checkpoint_dir=tmp_path / "c", resume_from=str(stopped)))
    assert history.epoch == [1, 2, 3]
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * 8


def test_resume_from_nothing_fails_fit_saying_what_was_found(make_model, tiny_data, ckpt):
    _stopped_run(make_model, tiny_data, "a", ckpt)
    control = ControlCallback(name="d", checkpoint_dir=ckpt, resume_from="nobody")
    with pytest.raises(ValueError) as error:
        fit(make_model(), tiny_data, control)
    assert str(error.value) == (
        f"Cannot resume from run 'nobody': {ckpt} holds checkpoints of run 'a' (1, newest "
        "ckpt-000001-epoch0002-step000004.keras), and no run 'nobody' is listed, nor in the history of ended runs. "
        "Expected the name of a run whose checkpoints are in the checkpoint folder, or the path of a checkpoint's "
        ".keras file."
    )
    assert control.state == "failed"
    missing = ckpt / "ckpt-000009-epoch0001-step000000.keras"
    with pytest.raises(ValueError, match=f"Cannot resume from {missing}: there is no file {missing} \\(its folder holds "
                                         "checkpoints of run 'a'"):
        fit(make_model(), tiny_data, ControlCallback(name="e", checkpoint_dir=ckpt, resume_from=missing))
    with pytest.raises(ValueError, match="resume_from='no such' is neither a checkpoint file nor a run name"):
        ControlCallback(resume_from="no such")


def test_the_end_checkpoint_is_the_model_fit_returns_after_every_callbacks_train_end(make_model, tiny_data, ckpt):
    """EarlyStopping(restore_best_weights=True), after this callback in the
    list, puts the best epoch's weights back in its on_train_end: the end
    checkpoint holds those, the model `fit` returns (issue 40, case 2)."""
    control = ControlCallback(name="best", checkpoint_dir=ckpt, verbose=False)
    # Only the first epoch improves by min_delta: the best weights are its.
    early = keras.callbacks.EarlyStopping(monitor="loss", min_delta=1e9, patience=2, restore_best_weights=True)
    model = make_model()
    driving.fit(model, tiny_data, control, early, epochs=10)
    assert early.stopped_epoch == 2 and control.state == "finished"
    record = find_run("best")  # how it ended: EarlyStopping ended it, at epoch 3 of 10
    assert (record["end_reason"], record["stopped_by"]) == ("callback", "EarlyStopping")
    assert any(e["message"] == "Stopped by EarlyStopping at epoch 3/10." for e in record["events"]), record["events"]
    (end,) = control.checkpoints
    assert read_sidecar(end)["reason"] == "end"
    saved = keras.models.load_model(end)
    for written, returned in zip(saved.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(written, returned)


def test_a_later_fit_that_runs_to_its_end_is_how_a_with_block_ended(make_model, tiny_data, ckpt):
    """In one run of several fits, the first ended early by EarlyStopping and
    the last ran to its end: the run ended finished, named by no callback."""
    model = make_model()
    with ControlCallback(name="twofits", checkpoint_dir=ckpt, verbose=False) as control:
        early = keras.callbacks.EarlyStopping(monitor="loss", min_delta=1e9, patience=1)
        driving.fit(model, tiny_data, control, early, epochs=10)
        assert early.stopped_epoch == 1
        driving.fit(model, tiny_data, control, epochs=2)
    record = find_run("twofits")
    assert (record["end_reason"], record["stopped_by"]) == ("finished", None)
