"""`TrainLoop`: custom training loops (GradientTape, JAX, PyTorch) under the same control as `fit`.

The loops are real: `tests/programs/custom_loop.py` trains each kind in a
child process (driven by the CLI, raw FIFO writes and Ctrl+C, and resumed
bit for bit); the in-process tests drive a GradientTape loop and a plain
loop through the run's channel.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from helpers import (PROGRAMS, TrainingProcess, cli, press_ctrl_c_twice_the_second_in_a_gc_callback, read_sidecar,
                     run_program, wait_threads_ended, wait_until)
from jupyter_traincontrol import TrainLoop
from jupyter_traincontrol.registry import find_run
from jupyter_traincontrol.transport.channels import deliver

LOOP = str(PROGRAMS / "custom_loop.py")
ITEMS = 8  # custom_loop.py's items an epoch
KINDS = ["tape", "keras-jax", "jax", "torch"]


def start_loop(kind, name, folder, *args, linger=False):
    return TrainingProcess("--kind", kind, "--name", name, "--checkpoint-dir", str(folder), *args, script=LOOP,
                           linger=linger)


def finish(training):
    code, result, err = training.finish()
    assert code == 0, err
    return result, err


def result_of(process: subprocess.CompletedProcess) -> dict:
    assert process.returncode == 0, process.stderr
    (line,) = [line for line in process.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line[7:])


def arrays(path) -> list[np.ndarray]:
    with np.load(path) as saved:
        return [saved[key] for key in sorted(saved.files, key=lambda name: int(name.split("_")[1]))]


def assert_bit_for_bit(left, right, what):
    a, b = arrays(left), arrays(right)
    assert len(a) == len(b), f"{what}: {len(a)} arrays against {len(b)}"
    for index, (x, y) in enumerate(zip(a, b)):
        assert x.shape == y.shape and x.tobytes() == y.tobytes(), f"{what}: array {index} differs"


def wait_for_step(name, at_least=2, timeout=90):
    wait_until(lambda: ((find_run(name) or {}).get("step") or 0) >= at_least, timeout=timeout,
               message=f"{name} to train {at_least} items")


@pytest.fixture
def killed():
    """Processes a test starts, ended pass or fail."""
    started = []
    yield started
    for training in started:
        training.kill()


# Driven from outside: the CLI, the FIFO, Ctrl+C ---------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_cli_stop_checkpoints_and_a_resume_continues_at_the_next_item_bit_for_bit(kind, tmp_path, killed):
    folder, epochs = tmp_path / "ck", "2"
    reference = result_of(run_program(LOOP, "--kind", kind, "--name", "ref", "--checkpoint-dir", str(tmp_path / "ref"),
                                      "--epochs", epochs, "--dump-end", str(tmp_path / "ref.npz"), timeout=180))
    assert reference["state"] == "finished" and len(reference["trained"]) == 2 * ITEMS

    first = start_loop(kind, "custom", folder, "--epochs", epochs, "--pause-at", "0:5",
                       "--dump-end", str(tmp_path / "stopped.npz"))
    killed.append(first)
    wait_until(lambda: find_run("custom")["state"] == "paused", timeout=90, message="the loop to pause")
    record = find_run("custom")
    assert (record["epoch"], record["epochs"], record["step"]) == (1, 2, 6)
    stopped = cli("send", "custom", "stop", "--wait", "60")
    assert stopped.returncode == 0, stopped.stderr
    assert "checkpoint" in stopped.stdout
    result, _ = finish(first)
    assert result["state"] == "stopped"
    (checkpoint,) = result["checkpoints"]
    info = read_sidecar(checkpoint)
    assert info["reason"] == "stop" and info["global_step"] == len(result["trained"]) == 6

    second = run_program(LOOP, "--kind", kind, "--name", "custom", "--checkpoint-dir", str(folder), "--epochs", epochs,
                         "--resume", "--dump-start", str(tmp_path / "resumed.npz"),
                         "--dump-end", str(tmp_path / "end.npz"), timeout=180)
    resumed = result_of(second)
    assert "Resumed from" in second.stdout
    assert_bit_for_bit(tmp_path / "stopped.npz", tmp_path / "resumed.npz", "the state the resume loaded")
    assert result["trained"] + resumed["trained"] == reference["trained"]  # the very next item, none twice
    assert resumed["state"] == "finished"
    assert_bit_for_bit(tmp_path / "ref.npz", tmp_path / "end.npz", "stopped and resumed against uninterrupted")


def test_raw_fifo_writes_save_ignore_garbage_and_stop_a_tape_loop(tmp_path, killed):
    training = start_loop("tape", "fifo", tmp_path / "ck", "--epochs", "200", "--item-sleep", "0.02", linger=True)
    killed.append(training)
    wait_for_step("fifo")
    def echo(line):
        subprocess.run(["sh", "-c", f"echo '{line}' > '{training.fifo}'"], check=True, timeout=10)

    echo("save")
    wait_until(lambda: len(find_run("fifo")["checkpoints"]) == 1, timeout=60, message="the save's checkpoint")
    echo("explode now")
    echo("stop")
    wait_until(lambda: find_run("fifo")["state"] == "stopped", timeout=60, message="the loop to stop")
    record = find_run("fifo")
    assert any(e["kind"] == "rejected" and "explode now" in e["message"] for e in record["events"]), record["events"]
    result, _ = finish(training)
    assert result["state"] == "stopped"
    assert [read_sidecar(path)["reason"] for path in result["checkpoints"]] == ["save", "stop"]


def test_first_ctrl_c_stops_a_tape_loop_with_a_checkpoint(tmp_path, killed):
    training = start_loop("tape", "sig", tmp_path / "ck", "--epochs", "200", "--item-sleep", "0.02")
    killed.append(training)
    wait_for_step("sig")
    training.process.send_signal(signal.SIGINT)
    result, err = finish(training)
    assert result["state"] == "stopped"
    assert read_sidecar(result["checkpoints"][-1])["reason"] == "interrupt"
    assert "Ctrl+C: stopping after this item" in err


def test_set_lr_steers_a_torch_optimizer_and_its_scheduler(tmp_path, killed):
    training = start_loop("torch", "steer", tmp_path / "ck", "--epochs", "200", "--item-sleep", "0.02")
    killed.append(training)
    wait_for_step("steer")
    changed = cli("send", "steer", "set", "lr=0.001", "--wait", "30")
    assert changed.returncode == 0, changed.stderr
    assert "learning_rate" in changed.stdout and "-> 0.001 (and the scheduler's base learning rate)" in changed.stdout
    refused = cli("send", "steer", "set", "beta_1=0.5", "--wait", "30")
    assert refused.returncode == 6 and "Can set: learning_rate (lr), weight_decay, momentum" in refused.stderr
    assert cli("send", "steer", "stop", "--wait", "30").returncode == 0
    result, _ = finish(training)
    import torch

    newest = result["checkpoints"][-1]
    rate = torch.load(newest, weights_only=True)["optimizer"]["param_groups"][0]["lr"]
    steered = read_sidecar(newest).get("tunables") or {}
    # The sidecar keeps the set value only while it holds: once the scheduler steps, its rate wins.
    assert steered == ({"learning_rate": 0.001} if rate == pytest.approx(0.001) else {})


# In process -----------------------------------------------------------------------------


def _tape_model():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
    return model, keras.optimizers.SGD(0.01)


def _data():
    x = np.random.default_rng(0).random((64, 3), dtype="float32")
    return [(x[i:i + 8], x[i:i + 8].sum(axis=1, keepdims=True)) for i in range(0, 64, 8)]


def _train(model, optimizer, xb, yb):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(xb) - yb) ** 2)
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return float(loss)


def _loop_with(ckpt, commands_at: dict, epochs=3, **kwargs):
    """Trains a tape loop; at (epoch, item) queues the commands given there."""
    model, optimizer = _tape_model()
    with TrainLoop(name="inproc", checkpoint_dir=ckpt, model=model, optimizer=optimizer, verbose=False,
                   **kwargs) as loop:
        for epoch in loop.epochs(epochs):
            for index, (xb, yb) in enumerate(loop.batches(_data())):
                loop.log(loss=_train(model, optimizer, xb, yb))
                for command in commands_at.get((epoch, index), ()):
                    loop.send(command)
    return loop, model, optimizer


def test_a_finished_loop_leaves_an_end_checkpoint_that_keras_loads(ckpt):
    import keras

    loop, model, optimizer = _loop_with(ckpt, {})
    assert loop.state == "finished" and loop.ended_by is None
    (checkpoint,) = loop.checkpoints
    assert read_sidecar(checkpoint)["reason"] == "end"
    loaded = keras.models.load_model(checkpoint)
    assert all(np.array_equal(a, b) for a, b in zip(loaded.get_weights(), model.get_weights()))
    assert int(loaded.optimizer.iterations.numpy()) == 3 * ITEMS == int(optimizer.iterations.numpy())
    record = find_run("inproc")
    assert record["state"] == "finished" and [e["epoch"] for e in record["history"]] == [1, 2, 3]
    assert record["steps"] == ITEMS and record["epochs"] == 3 and record["fifo"] is None


def test_abort_ends_both_loops_without_a_checkpoint_and_the_block_goes_on(ckpt):
    loop, _, optimizer = _loop_with(ckpt, {(1, 2): ["abort"]})
    assert loop.state == "aborted" and loop.checkpoints == []
    assert int(optimizer.iterations.numpy()) == ITEMS + 3  # the item in flight, then nothing more
    assert (loop.epoch, loop.step) == (1, 3)


def test_save_rollback_and_pause_act_between_items(ckpt):
    paused = []

    def resume_soon(loop):
        wait_until(lambda: find_run("inproc")["state"] == "paused", message="the loop to pause")
        paused.append(True)
        deliver(loop.fifo, "resume")

    model, optimizer = _tape_model()
    with TrainLoop(name="inproc", checkpoint_dir=ckpt, model=model, optimizer=optimizer, verbose=False) as loop:
        for epoch in loop.epochs(2):
            for index, (xb, yb) in enumerate(loop.batches(_data())):
                loop.log(loss=_train(model, optimizer, xb, yb))
                if (epoch, index) == (0, 1):
                    loop.send("save")
                if (epoch, index) == (0, 3):
                    saved = [v.numpy().copy() for v in model.weights]
                    loop.send("rollback")
                if (epoch, index) == (0, 4):
                    rolled = [v.numpy().copy() for v in model.weights]
                    threading.Thread(target=resume_soon, args=(loop,), name="test-resumer").start()
                    loop.send("pause")
    assert paused == [True] and loop.state == "finished"
    first = read_sidecar(loop.checkpoints[0])
    assert (first["reason"], first["step_in_epoch"]) == ("save", 2)
    assert not all(np.array_equal(a, b) for a, b in zip(saved, rolled))  # rolled back to the item-2 state
    assert int(optimizer.iterations.numpy()) == 2 * ITEMS - 2  # two items' updates were undone


def test_an_exception_in_the_body_fails_the_run_with_its_traceback_and_closes_everything(ckpt):
    model, optimizer = _tape_model()
    with pytest.raises(ZeroDivisionError):
        with TrainLoop(name="broken", checkpoint_dir=ckpt, model=model, optimizer=optimizer, verbose=False) as loop:
            for epoch in loop.epochs(3):
                for index, batch in enumerate(loop.batches(_data())):
                    if index == 2:
                        1 / 0
    assert loop.state == "failed" and loop.fifo is None
    record = find_run("broken")
    assert record["state"] == "failed" and "ZeroDivisionError" in record["error"] and "Traceback" in record["error"]


def test_a_loop_whose_save_fails_is_answered_failed_goes_on_and_ends_with_nothing_left(ckpt):
    def save(path):
        raise RuntimeError("this state cannot be saved")

    with TrainLoop(name="unsaved", checkpoint_dir=ckpt, save=save, load=lambda path: None, verbose=False) as loop:
        for epoch in loop.epochs(2):
            for index in loop.batches(range(4)):
                if (epoch, index) == (0, 1):
                    request = loop.send("save")
    assert (loop.epoch, loop.step) == (1, 4) and loop.state == "finished" and loop.checkpoints == []
    record = find_run("unsaved")
    answer = next(a for a in record["acks"] if request.request_id in a["ids"])
    assert answer["outcome"] == "failed" and "RuntimeError: this state cannot be saved" in answer["message"]
    failures = [e["message"] for e in record["events"] if e["kind"] == "error"]
    assert len(failures) == 2 and all("this state cannot be saved" in m for m in failures)  # the save, the end's
    assert record["state"] == "finished" and record["fifo"] is None
    wait_threads_ended()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # Python's report of the swallowed one
def test_a_second_ctrl_c_swallowed_by_a_gc_callback_still_interrupts_the_loop(ckpt, ctrl_c):
    """As for `fit`: the second Ctrl+C's KeyboardInterrupt, lost inside a
    garbage-collector callback, is raised at the next item's boundary."""
    model, optimizer = _tape_model()
    with pytest.raises(KeyboardInterrupt):
        with TrainLoop(name="gc", checkpoint_dir=ckpt, model=model, optimizer=optimizer, verbose=False) as loop:
            for epoch in loop.epochs(3):
                for index, (xb, yb) in enumerate(loop.batches(_data())):
                    loop.log(loss=_train(model, optimizer, xb, yb))
                    if (epoch, index) == (0, 1):
                        press_ctrl_c_twice_the_second_in_a_gc_callback()
    assert loop.state == "failed" and loop.checkpoints == []  # not the first press's graceful stop
    assert (loop.epoch, loop.step) == (0, 2)  # raised at the boundary after the item that was pressed in


def test_a_non_finite_loss_stops_the_loop_without_a_checkpoint(ckpt):
    model, optimizer = _tape_model()
    with TrainLoop(name="nan", checkpoint_dir=ckpt, model=model, optimizer=optimizer, verbose=False) as loop:
        for epoch in loop.epochs(3):
            for index, batch in enumerate(loop.batches(_data())):
                loop.log(loss=math.nan if (epoch, index) == (1, 1) else 1.0)
    assert loop.state == "stopped" and loop.checkpoints == []
    assert (loop.epoch, loop.step) == (1, 2)
    assert any("not finite" in e["message"] or "nan" in e["message"].lower() for e in find_run("nan")["events"])


def test_set_refuses_what_a_custom_step_cannot_see_and_says_what_it_can(ckpt):
    import keras

    model, _ = _tape_model()
    optimizer = keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.9), momentum=0.5)
    requests = []
    with TrainLoop(name="refuse", checkpoint_dir=ckpt, model=model, optimizer=optimizer, verbose=False) as loop:
        for epoch in loop.epochs(1):
            for index, (xb, yb) in enumerate(loop.batches(_data())):
                _train(model, optimizer, xb, yb)
                if index == 0:
                    requests += [loop.send("set lr=0.5"), loop.send("set momentum=0.9")]
    acks = find_run("refuse")["acks"]
    lr, momentum = (next(a for a in acks if request.request_id in a["ids"]) for request in requests)
    assert lr["outcome"] == "failed" and "is a schedule (ExponentialDecay)" in lr["message"]
    assert momentum["outcome"] == "failed" and "a traced step holds it as a constant" in momentum["message"]
    assert float(optimizer.momentum) == 0.5


def test_settings_that_do_not_fit_together_are_refused_at_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default checkpoint folder is made under the current one
    model, optimizer = _tape_model()
    with pytest.raises(ValueError, match="one of model=, state= or save=/load="):
        TrainLoop(model=model, save=print, load=print)
    with pytest.raises(ValueError, match="save= and load= go together"):
        TrainLoop(save=print)
    with pytest.raises(ValueError, match="on_nan"):
        TrainLoop(model=model, on_nan="explode")
    loop = TrainLoop(model=model, optimizer=optimizer)
    with pytest.raises(RuntimeError, match="with block"):
        list(loop.epochs(1))
    with pytest.raises(RuntimeError, match="inside epochs"):
        with TrainLoop(name="order", checkpoint_dir=None, model=model, optimizer=optimizer, verbose=False) as inner:
            list(inner.batches([1, 2]))


def test_a_torch_loop_imports_neither_keras_nor_tensorflow(tmp_path):
    code = (
        "import sys, torch\n"
        "from jupyter_traincontrol import TrainLoop\n"
        "model = torch.nn.Linear(2, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        f"with TrainLoop(name='light', checkpoint_dir={str(tmp_path / 'ck')!r}, state={{'m': model, 'o': opt}}, verbose=False) as loop:\n"
        "    for epoch in loop.epochs(1):\n"
        "        for item in loop.batches(range(3)):\n"
        "            opt.zero_grad(); model(torch.ones(1, 2)).sum().backward(); opt.step()\n"
        "print('LOADED', 'keras' in sys.modules, 'tensorflow' in sys.modules, loop.state, len(loop.checkpoints))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=__import__("helpers").child_env())
    assert done.returncode == 0, done.stderr
    assert "LOADED False False finished 1" in done.stdout


@pytest.mark.parametrize("kind", ["keras", "torch"])
def test_a_tunable_named_like_a_hyperparameter_or_badly_is_refused_with_the_same_words(kind):
    """Keras variables and torch tensors are checked by one rule: a clear
    ValueError naming what was received, before any training."""
    if kind == "keras":
        import keras

        from jupyter_traincontrol.boundary.tunables import check_user_tunables as check
        value = keras.Variable(0.2)
    else:
        torch = pytest.importorskip("torch")
        from jupyter_traincontrol.boundary.torch_tunables import _check_user as check
        value = torch.tensor(0.2)
    for name in ("lr", "learning_rate"):
        with pytest.raises(ValueError, match=rf"^tunables: '{name}' is an optimizer hyperparameter's name; choose"):
            check({name: value})
    with pytest.raises(ValueError, match=r"^tunables: Invalid name 'bad name!'"):
        check({"bad name!": value})
    assert list(check({"dropout": value})) == ["dropout"]
