"""The notebook path's main scenarios, on the Keras backend of ``KERAS_BACKEND``.

`make test` runs this file with ``KERAS_BACKEND=jax`` and ``=torch``
(``BACKEND_TESTS``; on TensorFlow `tests/test_notebook.py` runs the same
scenarios and more, so this file skips there): the kernel inherits the
variable, and each test first checks that the kernel's Keras
really runs on that backend. The scenarios: a run with the widget panel that
completes; ``save`` through the FIFO and ``stop`` through the CLI while it
trains; a kernel interrupt that checkpoints and stops with a `History`,
then ``--resume`` in the next cell; a run in a plain IPython terminal (the
text reporter).

On JAX the trainer holds the variables outside the model during a step, so
every checkpoint is checked against what was really trained: its optimizer
step is the one its sidecar records, and a stop's checkpoint holds exactly
the weights `fit` left in the model.
"""

from __future__ import annotations

import json
import os

import pytest

from helpers import cli, read_sidecar, run_python
from kernel_harness import FIT_CELL, RUN, run_terminal_session, start_fit

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.backends("jax", "torch", reason="tests/test_notebook.py runs these scenarios and more on TensorFlow"),
]

BACKEND = os.environ["KERAS_BACKEND"]
@pytest.fixture
def kernel(kernel):
    assert kernel.value("keras.backend.backend()") == BACKEND  # the kernel inherited KERAS_BACKEND
    return kernel


def saved_step_and_weights(checkpoint: str) -> tuple[int, list]:
    """The optimizer step and first kernel inside a checkpoint file, read by
    a fresh process on this backend (the file, not the sidecar)."""
    check = run_python(
        "import json, keras, numpy as np;"
        f"m = keras.models.load_model({checkpoint!r});"
        "print(json.dumps([int(m.optimizer.iterations.numpy()), m.get_weights()[0].tolist()]))"
    )
    assert check.returncode == 0, check.stderr[-2000:]
    step, weights = json.loads(check.stdout.strip().splitlines()[-1])
    return step, weights


def test_a_run_with_the_panel_completes(kernel):
    result = kernel.execute(FIT_CELL.format(name="whole", options="", epochs=3, sleep=0))
    assert result.status == "ok", result.error
    (bundle,) = result.results
    assert "application/vnd.jupyter.widget-view+json" in bundle
    kernel.wait_for(f"{RUN}.state == 'finished'", timeout=60)
    assert kernel.value("history.epoch") == [0, 1, 2]
    assert kernel.value("int(model.optimizer.iterations.numpy())") == 3 * 8
    kernel.execute(f"{RUN}.panel.join(10)")  # its last redraw is done
    assert kernel.value(f"[{RUN}.panel.run_progress.value, {RUN}.panel.run_progress.max]") == [24, 24]
    assert kernel.value(f"'<svg' in {RUN}.panel.chart.value and 'finished' in {RUN}.panel.title.value")


def test_save_through_the_fifo_and_stop_through_the_cli_while_training(kernel, tmp_path):
    start_fit(kernel, "driven")
    fifo = kernel.value(f"{RUN}.fifo")
    with open(fifo, "w") as writer:  # what `echo save > FIFO` does
        writer.write("save\n")
    kernel.wait_for(f"len({RUN}.checkpoints) == 1", timeout=30)
    assert kernel.value(f"{RUN}.state") == "running"  # save keeps training
    saved = kernel.value(f"str({RUN}.checkpoints[-1])")
    step, _ = saved_step_and_weights(saved)
    assert step > 0 and step == read_sidecar(saved)["global_step"]  # the weights of the step it was taken at

    result = cli("send", "driven", "stop")
    assert result.returncode == 0, result.stderr
    kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=30)
    assert kernel.value("type(history).__name__") == "History"
    stopped = kernel.value(f"str({RUN}.checkpoints[-1])")
    step, weights = saved_step_and_weights(stopped)
    assert step == kernel.value("int(model.optimizer.iterations.numpy())") > read_sidecar(saved)["global_step"]
    assert weights == kernel.value("model.get_weights()[0].tolist()")  # exactly the model fit left


def test_an_interrupt_checkpoints_and_stops_and_the_next_cell_resumes(kernel):
    start_fit(kernel, "part", epochs=6, sleep=0.02)
    kernel.wait_for(f"{RUN}.lifecycle.progress.epoch >= 2", timeout=60)
    kernel.interrupt()
    kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=30)
    assert kernel.value("type(history).__name__") == "History"
    checkpoint = kernel.value(f"str({RUN}.checkpoints[-1])")
    info = read_sidecar(checkpoint)
    assert info["reason"] == "interrupt"
    step, weights = saved_step_and_weights(checkpoint)
    assert step == kernel.value("int(model.optimizer.iterations.numpy())") == info["global_step"]
    assert weights == kernel.value("model.get_weights()[0].tolist()")

    result = kernel.execute(FIT_CELL.format(name="part", options="--resume", epochs=6, sleep=0))
    assert result.status == "ok", result.error
    kernel.wait_for(f"{RUN}.state == 'finished'", timeout=60)
    assert kernel.value("history.epoch[0]") == info["resume_epoch"]
    assert kernel.value("int(model.optimizer.iterations.numpy())") == 6 * 8


def test_a_plain_ipython_terminal_gets_the_text_reporter(tmp_path, runtime_dir):
    result = run_terminal_session(tmp_path, runtime_dir, then=(
        "print(str(run.state), keras.backend.backend(), int(model.optimizer.iterations.numpy()))\n"
    ))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[traincontrol] term: running" in result.stdout
    assert "[traincontrol] term: finished" in result.stdout
    assert f"finished {BACKEND} 4" in result.stdout
