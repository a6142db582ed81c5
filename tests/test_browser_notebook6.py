"""The panel in classic Notebook 6 with ipywidgets 7.7.1, whose widget manager stands in for Colab's.

Colab renders widgets with ipywidgets 7 (it ships 7.7.1) and loads no
JupyterLab extension, so its clicks travel as comm messages to the kernel.
Classic Notebook 6.5.7 with widgetsnbextension 3.6.10 (its nbextension is
enabled on install) is the nearest front end one can run: this test opens a
notebook there in Debian's chromium, trains in a ``%%interruptible_fit``
cell, checks its panel is there and fits a narrow page, stops the run with
the panel's Stop, then stops a second run with Kernel > Interrupt.

It runs in the Colab pass only (``make test-colab``: .venv-colab has
Colab's versions and Notebook 6); the main venv has ipywidgets 8 and
Notebook 7, which tests/test_browser.py covers. Screenshots of the panel
while running and once ended, 1400 and 600 px wide, go to
``test-artifacts/browser/notebook6-ipywidgets7-*.png``.
"""

from __future__ import annotations

import os
from importlib.metadata import version

import pytest

from browser_harness import (  # noqa: F401  (browser, page, jupyter: fixtures)
    NEEDS_CHROMIUM,
    TRAIN_CELLS,
    browser,
    jupyter,
    open_classic_notebook,
    page,
    record_of,
    screenshot,
    words,
)
from helpers import read_sidecar, wait_until

pytestmark = [
    NEEDS_CHROMIUM,
    pytest.mark.skipif(os.environ.get("TRAINCONTROL_COLAB_PASS") != "1",
                       reason="the Colab pass only (make test-colab: Notebook 6 and ipywidgets 7 in .venv-colab)"),
]

SHOTS = "notebook6-ipywidgets7"
BUTTONS = ["Save", "Stop", "Abort", "Pause", "Rollback"]

CELLS = [
    "%load_ext jupyter_traincontrol",
    # The browser tests' tiny model, and batches slow enough to click while it trains.
    TRAIN_CELLS[0].removeprefix("%load_ext jupyter_traincontrol\n"),
    TRAIN_CELLS[1].replace("nb-busy", "nb6"),
    """%%interruptible_fit --name nb6-interrupt --checkpoint-dir {ck}/nb6-interrupt
history = build_model().fit(x, y, epochs=200, callbacks=[Slow()], verbose=0)""",
]


def run_cell(page, index: int) -> None:
    """Runs cell `index` with Shift+Enter in its editor, as a user would."""
    page.locator(".cell").nth(index).locator(".CodeMirror").click()
    page.keyboard.press("Shift+Enter")


def wait_cell_done(page, index: int, timeout: float = 60) -> None:
    """Waits for cell `index` to have run: a number in its prompt, not ``*``."""
    prompt = f"() => Jupyter.notebook.get_cell({index}).input_prompt_number"
    wait_until(lambda: isinstance(page.evaluate(prompt), int), timeout=timeout, interval=0.2,
               message=f"cell {index} to run (its prompt: {page.evaluate(prompt)!r})")


def panel_of(page, index: int, name: str):
    """The panel of run `name` in cell `index`'s output."""
    return page.locator(".cell").nth(index).locator(f".traincontrol-panel.traincontrol-run-{name}")


PARTS = "button.traincontrol-button, .traincontrol-field, .progress, .traincontrol-chart"

# One read of the panel's geometry in the page: a live panel shows and hides
# parts as the run goes, so a box read part by part can vanish between reads.
GEOMETRY = """(panel, selector) => {
    const box = rect => ({x: rect.x, width: rect.width});
    const shown = element => {
        const rect = element.getBoundingClientRect();
        return rect.width > 0 && rect.height > 0 && getComputedStyle(element).visibility !== "hidden";
    };
    return {
        panel: box(panel.getBoundingClientRect()),
        parts: [...panel.querySelectorAll(selector)].filter(shown).map(element => ({
            name: element.className, button: element.matches("button.traincontrol-button"),
            ...box(element.getBoundingClientRect())})),
    };
}"""


def assert_inside(panel, page) -> None:
    """Checks that the panel fits the page's width, that each of its visible
    parts lies within it (nothing cut or sticking out), and that its buttons
    are of one width."""
    geometry = panel.evaluate(GEOMETRY, PARTS)
    box = geometry["panel"]
    width = page.viewport_size["width"]
    assert box["x"] >= 0 and box["x"] + box["width"] <= width, f"panel {box} outside a {width} px page"
    for part in geometry["parts"]:
        assert box["x"] - 1 <= part["x"] and part["x"] + part["width"] <= box["x"] + box["width"] + 1, (
            f"{part['name']} at {part} sticks out of the panel {box} ({width} px page)")
    widths = [part["width"] for part in geometry["parts"] if part["button"]]
    assert not widths or max(widths) - min(widths) <= 2, f"buttons of widths {widths} ({width} px page)"


def shoot_both_widths(page, panel, what: str) -> None:
    """Screenshots of the panel at 1400 and 600 px, each checked to fit."""
    for width in (1400, 600):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(300)  # the widgets' layout follows the resize
        panel.scroll_into_view_if_needed()
        assert_inside(panel, page)
        screenshot(panel, f"{SHOTS}-{width}-{what}")
    page.set_viewport_size({"width": 1400, "height": 900})


def test_notebook6_panel_renders_and_stop_and_interrupt_end_runs_with_a_checkpoint(jupyter, page, tmp_path):
    assert version("ipywidgets") == "7.7.1" and version("widgetsnbextension") == "3.6.10"
    assert version("notebook").startswith("6.")
    open_classic_notebook(page, jupyter("notebook6"), CELLS, tmp_path, timeout_ms=60_000)
    for index in (0, 1):
        run_cell(page, index)
        wait_cell_done(page, index)

    # The panel, rendered by widgetsnbextension 3's widget manager (ipywidgets 7's, in the page).
    run_cell(page, 2)
    panel = panel_of(page, 2, "nb6")
    panel.locator("button.traincontrol-command-stop").wait_for(timeout=60_000)
    scripts = page.evaluate("() => performance.getEntriesByType('resource').map(entry => entry.name)")
    assert any("/nbextensions/jupyter-js-widgets/extension.js" in script for script in scripts), scripts
    wait_cell_done(page, 2)  # the cell returns at once: the kernel is free for the clicks
    assert [button.inner_text().strip() for button in panel.locator("button.traincontrol-button").all()] == BUTTONS
    lr = panel.locator(".traincontrol-field input")
    wait_until(lambda: lr.is_visible() and lr.input_value() == "0.01", timeout=30, message="the learning rate field")
    assert panel.locator(".progress").count() == 2
    panel.locator("svg.traincontrol-chart polyline").first.wait_for(timeout=30_000)  # an epoch or two done
    wait_until(lambda: "elapsed" in words(panel) and "loss" in words(panel), timeout=10, message="stats and metrics")
    shoot_both_widths(page, panel, "running")

    panel.locator("button.traincontrol-command-stop").click()
    wait_until(lambda: record_of("nb6").get("state") == "stopped", timeout=30,
               message=f"nb6 stopped (its record: {record_of('nb6')})")
    outcome = panel.locator(".traincontrol-outcome")
    outcome.wait_for()
    wait_until(lambda: "1 checkpoint" in words(outcome), timeout=10,
               message=f"the checkpoint shown ({words(outcome)!r})")
    assert words(outcome).startswith("Stopped by a command at epoch ")
    assert not any(button.is_visible() for button in panel.locator("button.traincontrol-button").all())  # gave way
    (checkpoint,) = record_of("nb6")["checkpoints"]
    assert read_sidecar(checkpoint)["reason"] == "stop"
    assert checkpoint in words(outcome).replace("\n", "")
    shoot_both_widths(page, panel, "stopped")

    # Kernel > Interrupt while a run trains in the background stops it, with a checkpoint.
    run_cell(page, 3)
    interrupted = panel_of(page, 3, "nb6-interrupt")
    interrupted.locator("button.traincontrol-command-stop").wait_for(timeout=30_000)
    wait_cell_done(page, 3)
    wait_until(lambda: record_of("nb6-interrupt").get("step"), timeout=30, message="nb6-interrupt training")
    page.locator("#kernellink").click()
    page.locator("#int_kernel").click()
    wait_until(lambda: record_of("nb6-interrupt").get("state") == "stopped", timeout=30,
               message=f"nb6-interrupt stopped (its record: {record_of('nb6-interrupt')})")
    outcome = interrupted.locator(".traincontrol-outcome")
    wait_until(lambda: words(outcome).startswith("Stopped by a kernel interrupt") and "1 checkpoint" in words(outcome),
               timeout=15, message="the interrupted panel's outcome")
    (checkpoint,) = record_of("nb6-interrupt")["checkpoints"]
    assert read_sidecar(checkpoint)["reason"] == "interrupt"
    screenshot(page, f"{SHOTS}-1400-interrupted-page")
