"""`%%interruptible_fit` cells that train without `fit`: a `TrainLoop`, or a loop of their own.

A `TrainLoop` on the cell's thread is the cell's run (the magic's options,
the panel, kernel interrupts). A cell that trains with neither is honest:
commands are answered at once with the fix, and a kernel interrupt
interrupts its code as a plain kernel would.
"""

from __future__ import annotations

import time

import pytest

from helpers import cli, read_sidecar
from kernel_harness import RUN

pytestmark = pytest.mark.timeout(240)

TAPE_CELL = """%%interruptible_fit --name {name} {options}
import tensorflow as tf
from jupyter_traincontrol import TrainLoop
batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)]
with TrainLoop(model=model) as loop:
    for epoch in loop.epochs({epochs}):
        for xb, yb in loop.batches(batches):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(xb) - yb) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
            loop.log(loss=float(loss))
            time.sleep({sleep})
"""

OWN_LOOP_CELL = """%%interruptible_fit --name {name}
done = 0
for i in range(2000):
    time.sleep(0.02)
    done += 1
"""


def start_tape_loop(kernel, name, epochs=200, sleep=0.02, options=""):
    result = kernel.execute(TAPE_CELL.format(name=name, options=options, epochs=epochs, sleep=sleep))
    assert result.status == "ok", result.error
    kernel.wait_for(f"{RUN}.state == 'running' and {RUN}.lifecycle.progress.step > 0", timeout=90)


def button(kernel, key):
    return kernel.value(f"{RUN}.panel.buttons[{key!r}].model_id")


def test_the_panel_shows_a_train_loop_and_its_stop_button_stops_it_with_a_checkpoint(kernel):
    start_tape_loop(kernel, "tl-panel")
    kernel.wait_for(f"{RUN}.lifecycle.record().get('steps') == 8", timeout=30)  # learned from the first epoch
    record = kernel.value(f"{{k: {RUN}.lifecycle.record().get(k) for k in ('epochs', 'metrics')}}")
    assert record["epochs"] == 200 and "loss" in record["metrics"]
    kernel.click(button(kernel, "stop"))
    kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=30)
    checkpoint = kernel.value(f"str({RUN}.checkpoints[-1])")
    info = read_sidecar(checkpoint)
    assert info["reason"] == "stop"
    assert info["global_step"] == kernel.value("int(model.optimizer.iterations.numpy())")
    assert kernel.value("loop.state") == "stopped"


def test_a_kernel_interrupt_stops_a_train_loop_with_a_checkpoint_and_resume_continues(kernel):
    start_tape_loop(kernel, "tl-int")
    kernel.interrupt()
    kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=30)
    info = read_sidecar(kernel.value(f"str({RUN}.checkpoints[-1])"))
    assert info["reason"] == "interrupt"
    steps_at_stop = kernel.value("int(model.optimizer.iterations.numpy())")
    kernel.execute("model.optimizer.iterations.assign(0)")  # forget it: the resume must bring it back
    epochs = info["epoch"] + 2  # the rest of the stopped epoch, and one more
    result = kernel.execute(TAPE_CELL.format(name="tl-int", options="--resume", epochs=epochs, sleep=0))
    assert result.status == "ok", result.error
    kernel.wait_for(f"{RUN}.state == 'finished'", timeout=90)
    trained = kernel.value("int(model.optimizer.iterations.numpy())")
    assert trained == epochs * 8  # resumed at the item after the stop: every item trained once
    assert trained > steps_at_stop
    assert any("Resumed from" in e["message"] for e in kernel.value(f"{RUN}.lifecycle.record()['events']"))


def test_a_cell_without_fit_or_train_loop_answers_commands_at_once_and_an_interrupt_interrupts_it(kernel):
    result = kernel.execute(OWN_LOOP_CELL.format(name="own"))
    assert result.status == "ok", result.error
    kernel.wait_for("done > 5", timeout=30)
    state = kernel.value(f"{RUN}.state")
    assert state == "starting" and not kernel.value(f"{RUN}.driving")  # nothing drives it, nothing claims to
    kernel.wait_for(f"'Nothing in this cell is under control' in {RUN}.panel.note.value", timeout=10)
    assert kernel.value(f"all(button.disabled for button in {RUN}.panel.buttons.values())")
    started = time.monotonic()
    answered = cli("send", "own", "stop", "--wait", "30")
    assert time.monotonic() - started < 10  # not the 30 s timeout
    assert answered.returncode == 6, (answered.returncode, answered.stdout, answered.stderr)
    assert "no fit or TrainLoop running" in answered.stderr
    assert kernel.value(f"{RUN}.state") == state  # the refused stop changed nothing
    kernel.interrupt()
    kernel.wait_for(f"{RUN}.state == 'failed'", timeout=30)
    error = kernel.value(f"{RUN}.error")
    assert "KeyboardInterrupt" in error
    assert 5 < kernel.value("done") < 2000  # interrupted in the middle
    events = " ".join(e["message"] for e in kernel.value(f"{RUN}.lifecycle.record()['events']"))
    assert "nothing was trained" not in events
    assert kernel.value("2 * 21") == 42  # the kernel is fine
