"""One run for every `fit` of a ``with ControlCallback(...)`` block (`fit.span`), on real fits and its real FIFO."""

from __future__ import annotations

import os

import pytest

from driving import fit
from helpers import read_sidecar, wait_until
from jupyter_traincontrol import ControlCallback, RunLifecycle
from jupyter_traincontrol.checkpoint import CheckpointDirBusyError
from jupyter_traincontrol.registry import find_run
from jupyter_traincontrol.transport.channels import deliver

#: `tiny_data` in batches of 8.
BATCHES = 8


def queue(control, command: str) -> None:
    """Writes `command` to the run's FIFO and waits until its reader queued it."""
    deliver(control.fifo, command)
    wait_until(lambda: control.lifecycle.channel.pending, message=f"{command} queued")


def test_the_fits_of_a_with_block_drive_one_run_that_ends_with_the_block(make_model, tiny_data, ckpt):
    model, control = make_model(), ControlCallback(name="loop", checkpoint_dir=ckpt, save_at_end=False)
    with control as entered:
        assert entered is control
        run_id, fifo = control.lifecycle.run_id, control.fifo
        assert find_run("loop")["state"] == "starting" and os.path.exists(fifo)
        for _ in range(3):
            fit(model, tiny_data, control, epochs=1)
            assert (control.lifecycle.run_id, control.fifo, control.state) == (run_id, fifo, "running")
        wait_until(lambda: find_run("loop")["state"] == "running", message="the record says running")
    record = find_run("loop")
    assert (record["state"], record["end_reason"], record["run_id"]) == ("finished", "finished", run_id)
    assert not os.path.exists(fifo)
    fit(model, tiny_data, control, epochs=1)  # after the block: a fit is a run of its own again
    assert control.lifecycle.run_id != run_id and control.state == "finished"


def test_a_stop_between_two_fits_acts_in_the_next_and_a_later_fit_ends_the_block_quietly(make_model, tiny_data, ckpt):
    model, control = make_model(), ControlCallback(name="loop", checkpoint_dir=ckpt, save_at_end=False)
    began, after_the_loop = [], False
    with control:
        for index in range(5):
            began.append(index)
            fit(model, tiny_data, control, epochs=1)
            if index == 1:
                queue(control, "stop")
        after_the_loop = True
    assert began == [0, 1, 2, 3] and not after_the_loop  # the fourth fit trained nothing and ended the block
    (checkpoint,) = control.checkpoints
    steps = int(model.optimizer.iterations.numpy())
    assert steps == 2 * BATCHES + 1 == read_sidecar(checkpoint)["global_step"]  # the third fit's first step
    record = find_run("loop")
    assert (control.state, record["state"], record["end_reason"]) == ("stopped", "stopped", "command")


def test_an_error_in_the_block_fails_its_run_with_the_traceback_and_is_raised(make_model, tiny_data, ckpt):
    model, control = make_model(), ControlCallback(name="loop", checkpoint_dir=ckpt, save_at_end=False)
    with pytest.raises(ValueError, match="after the first fit"):
        with control:
            fit(model, tiny_data, control, epochs=1)
            raise ValueError("after the first fit")
    record = find_run("loop")
    assert (control.state, record["state"], record["end_reason"]) == ("failed", "failed", "error")
    assert "ValueError: after the first fit" in control.lifecycle.error


def test_a_fit_that_raises_in_the_block_ends_its_run_failed(make_model, tiny_data, ckpt):
    import keras

    class Fails(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise RuntimeError("a user's callback failed")

    model, control = make_model(), ControlCallback(name="loop", checkpoint_dir=ckpt, save_at_end=False)
    with pytest.raises(RuntimeError, match="a user's callback failed"):
        with control:
            fit(model, tiny_data, control, epochs=1)
            fit(model, tiny_data, control, Fails(), epochs=1)
    assert control.state == "failed" and "a user's callback failed" in control.lifecycle.error


def test_a_finished_block_writes_one_end_checkpoint_as_it_ends_which_a_resume_continues(make_model, tiny_data, ckpt):
    model, control = make_model(), ControlCallback(name="loop", checkpoint_dir=ckpt)  # save_at_end: the default
    with control:
        for _ in range(3):
            fit(model, tiny_data, control, epochs=1)
            assert control.checkpoints == []  # a fit in the block writes none of its own
        assert control.save_at_end is False  # the block's, until it ends
    (checkpoint,) = control.checkpoints
    sidecar = read_sidecar(checkpoint)
    assert (sidecar["reason"], sidecar["global_step"]) == ("end", 3 * BATCHES)
    assert control.save_at_end is True and find_run("loop")["checkpoints"] == [str(checkpoint)]
    resumed, again = make_model(), ControlCallback(name="loop", checkpoint_dir=ckpt, resume=True, save_at_end=False)
    fit(resumed, tiny_data, again, epochs=2)  # the checkpoint ends the last fit's epoch 1 of 1: one more
    assert again.session.resumption.checkpoint.path == checkpoint
    assert int(resumed.optimizer.iterations.numpy()) == 4 * BATCHES


def test_a_block_that_fails_or_stops_writes_no_end_checkpoint(make_model, tiny_data, ckpt):
    model, control = make_model(), ControlCallback(name="loop", checkpoint_dir=ckpt)
    with pytest.raises(ValueError, match="after the fit"):
        with control:
            fit(model, tiny_data, control, epochs=1)
            raise ValueError("after the fit")
    assert control.checkpoints == [] and control.state == "failed"
    with control:
        fit(model, tiny_data, control, epochs=1)
        queue(control, "stop")
        fit(model, tiny_data, control, epochs=1)
    assert [read_sidecar(path)["reason"] for path in control.checkpoints] == ["stop"]


def test_the_block_holds_its_checkpoint_folder_from_its_start_to_its_end(make_model, tiny_data, ckpt):
    model, control = make_model(), ControlCallback(name="loop", checkpoint_dir=ckpt, save_at_end=False)
    with control:
        with pytest.raises(CheckpointDirBusyError, match="in use by run 'loop'"):
            fit(make_model(), tiny_data, ControlCallback(name="other", checkpoint_dir=ckpt), epochs=1)
        fit(model, tiny_data, control, epochs=1)
        with pytest.raises(CheckpointDirBusyError, match="in use by run 'loop'"):
            fit(make_model(), tiny_data, ControlCallback(name="other", checkpoint_dir=ckpt), epochs=1)
    fit(make_model(), tiny_data, ControlCallback(name="other", checkpoint_dir=ckpt), epochs=1)


def test_only_the_blocks_first_fit_resumes(make_model, tiny_data, ckpt):
    model = make_model()
    fit(model, tiny_data, ControlCallback(name="loop", checkpoint_dir=ckpt), epochs=2)  # its end checkpoint
    control = ControlCallback(name="loop", checkpoint_dir=ckpt, resume=True, save_at_end=False)
    with control:
        fit(model, tiny_data, control, epochs=3)
        assert control.session.resumption is not None and control.session.resumption.epoch == 2
        fit(model, tiny_data, control, epochs=1)
        assert control.session.resumption is None
    assert control.resume is True and control.state == "finished"
    assert int(model.optimizer.iterations.numpy()) == (2 + 1 + 1) * BATCHES


def test_a_with_block_is_refused_where_the_callback_does_not_own_its_run(tmp_path, ckpt):
    control = ControlCallback(name="loop", checkpoint_dir=ckpt)
    with control:
        with pytest.raises(RuntimeError, match="already open for a with block"):
            control.__enter__()
    assert control.state == "finished"
    run = RunLifecycle("given", tmp_path / "given").open()
    try:
        with pytest.raises(RuntimeError, match=r"drives a run it was given \(lifecycle=...\)"):
            with ControlCallback(lifecycle=run):
                pass
    finally:
        run.close("finished")
