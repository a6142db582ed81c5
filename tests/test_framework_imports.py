"""A `TrainLoop` loads only the framework its user trains with.

A PyTorch loop in a process that never imported Keras imports neither
Keras nor TensorFlow (their import takes seconds and prints TensorFlow's
log lines); a JAX loop imports neither them nor PyTorch; a TensorFlow loop
no more than TensorFlow itself does. The same in a notebook cell: a
``%%interruptible_fit`` cell whose `TrainLoop` trains a torch model. Each
test looks at ``sys.modules`` of a fresh process once its run has ended.
"""

from __future__ import annotations

import json

import pytest

from helpers import run_python
from kernel_harness import RUN, Kernel

pytestmark = pytest.mark.timeout(240)

FRAMEWORKS = ("keras", "tensorflow", "torch", "jax", "tf_keras")

#: Prints the frameworks the user's imports loaded, trains `LOOP`, prints those loaded at the end.
PROGRAM = """
import json, os, sys, tempfile
{imports}
before = [name for name in {frameworks!r} if name in sys.modules]
from jupyter_traincontrol import TrainLoop
{setup}
folder = tempfile.mkdtemp()
with TrainLoop(name="imports", checkpoint_dir=os.path.join(folder, "ck"), handle_sigint=False, handle_sigterm=False,
               verbose=False, {state}) as loop:
    for epoch in loop.epochs(2):
        for item in loop.batches(range(4)):
            loop.log(loss=float(step()))
after = [name for name in {frameworks!r} if name in sys.modules]
print("RESULT " + json.dumps({{"state": loop.state, "checkpoints": len(loop.checkpoints), "before": before,
                               "after": after}}))
"""

TORCH = dict(
    imports="import torch",
    setup="""model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
def step():
    optimizer.zero_grad()
    loss = (model(torch.ones(4, 3)) ** 2).mean()
    loss.backward()
    optimizer.step()
    return loss.item()""",
    state='state={"model": model, "optimizer": optimizer}',
)

JAX = dict(
    imports="import jax, jax.numpy as jnp, numpy as np",
    setup="""params = {"w": jnp.ones(3)}
grad = jax.jit(jax.grad(lambda p: (p["w"] ** 2).sum()))
def step():
    params["w"] = params["w"] - 0.1 * grad(params)["w"]
    return (params["w"] ** 2).sum()
def save(path):
    np.save(os.path.join(path, "w.npy"), np.asarray(params["w"]))
def load(path):
    params["w"] = jnp.asarray(np.load(os.path.join(path, "w.npy")))""",
    state="save=save, load=load",
)

TENSORFLOW = dict(
    imports="import tensorflow as tf",
    setup="""w = tf.Variable(tf.ones(3))
checkpoint = tf.train.Checkpoint(w=w)
def step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w ** 2)
    w.assign_sub(0.1 * tape.gradient(loss, w))
    return loss
def save(path):
    checkpoint.write(os.path.join(path, "w"))
def load(path):
    checkpoint.read(os.path.join(path, "w")).assert_consumed()""",
    state="save=save, load=load",
)


def run_loop(kind: dict) -> dict:
    program = PROGRAM.format(frameworks=FRAMEWORKS, **kind)
    done = run_python(program, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["state"] == "finished" and result["checkpoints"] == 1, result
    return result


def test_a_torch_loop_imports_neither_keras_nor_tensorflow():
    result = run_loop(TORCH)
    assert result["before"] == ["torch"]
    assert result["after"] == ["torch"], f"a torch loop imported {set(result['after']) - {'torch'}}"


def test_a_jax_loop_imports_neither_keras_nor_tensorflow_nor_torch():
    result = run_loop(JAX)
    assert result["before"] == ["jax"]
    assert result["after"] == ["jax"], f"a JAX loop imported {set(result['after']) - {'jax'}}"


def test_a_tensorflow_loop_imports_no_framework_tensorflow_does_not():
    result = run_loop(TENSORFLOW)
    assert "tensorflow" in result["before"] and "torch" not in result["before"]
    assert result["after"] == result["before"]


TORCH_CELL = """%%interruptible_fit --name torch-cell
import torch
from jupyter_traincontrol import TrainLoop
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
with TrainLoop(state={"model": model, "optimizer": optimizer}) as loop:
    for epoch in loop.epochs(2):
        for item in loop.batches(range(4)):
            optimizer.zero_grad()
            loss = (model(torch.ones(4, 3)) ** 2).mean()
            loss.backward()
            optimizer.step()
            loop.log(loss=loss.item())
"""


KERAS_CELL = """%%interruptible_fit --name keras-cell
import keras, numpy as np
x = np.ones((16, 3), dtype="float32")
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
history = model.fit(x, x.sum(axis=1), batch_size=4, epochs=2, verbose=0)
"""


def test_a_torch_loop_in_a_notebook_cell_imports_neither_keras_nor_tensorflow(tmp_path, runtime_dir):
    """Then a cell that imports Keras itself: its fit is under control all the same."""
    runtime_dir.parent.mkdir(exist_ok=True)
    setup = "%load_ext jupyter_traincontrol\nimport sys, jupyter_traincontrol"
    kernel = Kernel(tmp_path, runtime_dir.parent, setup=setup)
    try:
        assert kernel.value(f"[name for name in {FRAMEWORKS!r} if name in sys.modules]") == []
        result = kernel.execute(TORCH_CELL, timeout=120)
        assert result.status == "ok", result.error
        kernel.wait_for(f"{RUN}.state == 'finished'", timeout=120)
        assert kernel.value(f"len({RUN}.checkpoints)") == 1
        kernel.wait_for(f"{RUN}.panel.outcome.value != ''", timeout=10)  # the ended panel, drawn
        assert "torch.load(run.checkpoints[-1]" in kernel.value(f"{RUN}.panel.outcome.value")
        assert kernel.value(f"[name for name in {FRAMEWORKS!r} if name in sys.modules]") == ["torch"]
        result = kernel.execute(KERAS_CELL, timeout=120)
        assert result.status == "ok", result.error
        kernel.wait_for(f"{RUN}.state == 'finished'", timeout=120)
        assert kernel.value(f"({RUN}.name, {RUN}.fit_calls, len({RUN}.checkpoints), len(history.epoch))") == [
            "keras-cell", 1, 1, 2]
    finally:
        kernel.shutdown()
