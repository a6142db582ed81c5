"""Cells that train without `fit`, in a real JupyterLab and Notebook 7: a `TrainLoop`, and a loop of the cell's own.

The panel of a `TrainLoop` run shows its epochs and batches and its Stop
button stops it; the panel of a cell with neither `fit` nor `TrainLoop`
says nothing is under control and offers no buttons. Screenshots at the
default and a narrow width go under ``test-artifacts/browser/``.
"""

from __future__ import annotations

import pytest

from browser_harness import (  # noqa: F401  (fixtures)
    NEEDS_CHROMIUM,
    TRAIN_CELLS,
    browser,
    jupyter,
    page,
    record_of,
    run_cell,
    screenshot,
    start_training_notebook,
    wait_idle,
    words,
)
from helpers import read_sidecar, wait_until

pytestmark = [NEEDS_CHROMIUM, pytest.mark.timeout(400)]

CELLS = [
    TRAIN_CELLS[0],
    """%%interruptible_fit --name nb-loop --checkpoint-dir {ck}/nb-loop
import tensorflow as tf
from jupyter_traincontrol import TrainLoop
model = build_model()
batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 512, 32)]
with TrainLoop(model=model) as loop:
    for epoch in loop.epochs(200):
        for xb, yb in loop.batches(batches):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(xb) - yb) ** 2)
            model.optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            loop.log(loss=float(loss))
            time.sleep(0.05)""",
    """%%interruptible_fit --name nb-own
for step in range(3000):
    time.sleep(0.05)""",
]


def cell(page, index: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


@pytest.mark.parametrize("app", ["lab", "notebook"])
def test_a_train_loop_cell_is_shown_and_stopped_and_a_cell_without_one_says_nothing_is_under_control(
        app, jupyter, page, tmp_path):
    start_training_notebook(jupyter, page, tmp_path, app=app, cells=CELLS)
    panel = cell(page, 1).locator(".traincontrol-panel.traincontrol-run-nb-loop")
    panel.locator("button.traincontrol-command-stop").wait_for(timeout=60_000)
    wait_until(lambda: (record_of("nb-loop").get("epoch") or 0) >= 2, timeout=90, message="nb-loop in its 2nd epoch")
    wait_until(lambda: "/200 · batch" in words(panel) and "/16" in words(panel), timeout=30,
               message="the panel's epoch and batch (Epoch N/200 · batch M/16)")
    screenshot(page, f"{app}-1400-train-loop")
    page.set_viewport_size({"width": 900, "height": 900})
    screenshot(panel, f"{app}-900-train-loop-panel")
    page.set_viewport_size({"width": 1400, "height": 900})
    panel.locator("button.traincontrol-command-stop").click()
    wait_until(lambda: record_of("nb-loop").get("state") == "stopped", timeout=60, message="nb-loop stopped")
    (checkpoint,) = record_of("nb-loop")["checkpoints"]
    assert read_sidecar(checkpoint)["reason"] == "stop"
    panel.locator(".traincontrol-outcome").wait_for(timeout=30_000)
    assert words(panel.locator(".traincontrol-outcome")).startswith("Stopped")

    wait_idle(page)
    run_cell(page, 2)
    own = cell(page, 2).locator(".traincontrol-panel.traincontrol-run-nb-own")
    note = own.get_by_text("Nothing in this cell is under control")
    note.wait_for(timeout=60_000)
    buttons = own.locator("button.traincontrol-button")
    assert buttons.count() > 0
    assert buttons.evaluate_all("(all) => all.every(b => b.disabled)"), "a button of a cell with nothing to control"
    screenshot(page, f"{app}-1400-nothing-under-control")
    page.set_viewport_size({"width": 900, "height": 900})
    own.scroll_into_view_if_needed()
    screenshot(own, f"{app}-900-nothing-under-control-panel")
