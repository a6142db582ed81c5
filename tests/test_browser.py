"""The JupyterLab side panel and status bar item, in a real browser.

A real JupyterLab (and Notebook 7) server runs in a subprocess with private
Jupyter folders; Debian's chromium is driven by Playwright (no downloaded
browser). The runs are the example training script in subprocesses, and
``%%interruptible_fit`` cells in a real notebook kernel.

Screenshots are written under ``test-artifacts/browser/`` (ignored by git);
their paths are printed.
"""

from __future__ import annotations

import re

import pytest

from browser_harness import (  # noqa: F401  (browser, page, jupyter: fixtures)
    NEEDS_CHROMIUM,
    PANEL,
    PANEL_TAB,
    STATUS_ITEM,
    TOKEN,
    assert_kernel_still_busy,
    browser,
    jupyter,
    kernel_state,
    open_lab,
    page,
    record_of,
    run_cell,
    screenshot,
    start_training_notebook,
    timed,
    wait_idle,
    words,
)
from helpers import read_sidecar, wait_until

pytestmark = NEEDS_CHROMIUM


def test_side_panel_shows_a_run_and_stops_it(jupyter, page, training, tmp_path):
    script = training(
        "--name", "browser-run", "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "200", "--batch-sleep", "0.05",
        linger=True,
    )
    server = jupyter("lab")
    open_lab(page, server)

    # The status bar summarises the active run; clicking it opens the panel.
    status = page.locator(STATUS_ITEM)
    status.wait_for()
    wait_until(lambda: re.fullmatch(r"1 training · browser-run epoch \d+/200 loss [0-9.e-]+", words(status)),
               timeout=30, message=f"the status bar summary (got {words(status)!r})")
    panel = page.locator(PANEL)
    assert not panel.is_visible()
    status.click()
    panel.wait_for(state="visible")

    card = panel.locator('.jp-TrainControl-run[data-run="browser-run"]')
    card.wait_for()
    assert card.get_attribute("data-state") == "running"
    assert words(card.locator(".jp-TrainControl-where")) == f"train_with_control.py · pid {script.process.pid}"
    # Two epochs done: a loss chart with a line for loss and one for val_loss.
    card.locator("polyline.jp-TrainControl-chartValLoss").wait_for(timeout=60_000)
    # Two bars, labelled: the epoch in progress and the whole run.
    assert re.fullmatch(r"Epoch \d+/200 · batch \d+/14", words(card.locator(".jp-mod-epoch .jp-TrainControl-barLabel")))
    assert re.fullmatch(r"Run \d+%", words(card.locator(".jp-mod-run .jp-TrainControl-barLabel")))
    assert re.fullmatch(r"\d+s elapsed", words(card.locator(".jp-TrainControl-progressText")))
    assert words(card.locator(".jp-TrainControl-metrics")).startswith("loss ")
    assert [b.inner_text() for b in card.locator("button").all()] == ["Save", "Stop", "Abort", "Pause", "Rollback"]
    screenshot(panel, "panel-running")
    screenshot(page.locator("#jp-main-statusbar"), "statusbar-running")
    screenshot(page, "lab-running")

    # Abort asks first; cancelling leaves the run alone.
    card.get_by_role("button", name="Abort", exact=True).click()
    dialog = page.locator(".jp-Dialog")
    dialog.get_by_text("Abort browser-run?").wait_for()
    dialog.get_by_role("button", name="Cancel").click()
    dialog.wait_for(state="detached")
    assert card.get_attribute("data-state") == "running"

    card.get_by_role("button", name="Stop", exact=True).click()
    card.locator(".jp-TrainControl-feedback").filter(has_text="Sent stop to browser-run.").wait_for()
    page.wait_for_selector('.jp-TrainControl-run[data-run="browser-run"][data-state="stopped"]', timeout=30_000)
    assert "jp-mod-ended" in card.get_attribute("class")
    assert not card.locator(".jp-TrainControl-buttons").is_visible()
    shown = [item.get_attribute("data-path") for item in card.locator(".jp-TrainControl-checkpoint").all()]
    assert len(shown) == 1 and shown[0].endswith(".keras")
    status.wait_for(state="hidden")  # no active run: the status item goes
    screenshot(panel, "panel-stopped")

    code, result, err = script.finish()
    assert code == 0, err
    assert result["state"] == "stopped" and result["checkpoints"] == shown
    assert read_sidecar(shown[0])["reason"] == "stop"


def test_an_unreachable_server_extension_is_shown_as_such(jupyter, page):
    server = jupyter("lab", server_extension=False)
    open_lab(page, server)
    page.locator(PANEL_TAB).click()
    banner = page.locator(f"{PANEL} .jp-TrainControl-banner.jp-mod-error")
    banner.wait_for()
    assert words(banner).startswith("Server extension not found\nThe jupyter_traincontrol server extension is not enabled")
    assert page.locator(f"{PANEL} .jp-TrainControl-run").count() == 0
    screenshot(page.locator(PANEL), "panel-unreachable")


def run_from_palette(page, label: str) -> None:
    """Runs a command through the command palette, as a user would."""
    page.keyboard.press("Control+Shift+C")
    search = page.locator(".lm-CommandPalette-input")
    search.wait_for()
    search.fill(label)
    page.locator(".lm-CommandPalette-item", has_text=label).first.wait_for()
    search.press("Enter")


def test_notebook_7_view_menu_pause_resume_and_palette_commands(jupyter, page, training, tmp_path):
    script = training(
        "--name", "nb7-run", "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "200", "--batch-sleep", "0.05",
        linger=True,
    )
    server = jupyter("notebook")
    page.goto(f"{server.url}/tree?token={TOKEN}")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell")
    assert page.locator("#jp-main-statusbar").count() == 0  # Notebook 7 has no status bar

    page.locator(".lm-MenuBar-itemLabel", has_text="View").click()
    page.locator(".lm-Menu-itemLabel", has_text="Training Runs").click()
    card = page.locator(f'{PANEL} .jp-TrainControl-run[data-run="nb7-run"]')
    card.wait_for()
    assert card.get_attribute("data-state") == "running"
    lr = card.locator(".jp-TrainControl-lrInput")
    wait_until(lambda: lr.input_value() == "0.01", timeout=10, message="the card's learning rate")
    lr.fill("5e-3")
    lr.press("Enter")
    wait_until(lambda: lr.input_value() == "0.005", timeout=10, message="the learning rate set")
    screenshot(card, "notebook7-card-learning-rate")

    card.get_by_role("button", name="Pause", exact=True).click()
    page.wait_for_selector('.jp-TrainControl-run[data-run="nb7-run"][data-state="paused"]')
    resume = card.get_by_role("button", name="Resume", exact=True)
    resume.wait_for()
    screenshot(page, "notebook7-paused")
    resume.click()
    page.wait_for_selector('.jp-TrainControl-run[data-run="nb7-run"][data-state="running"]')

    run_from_palette(page, "Save All Training Runs")
    page.locator(".jp-TrainControl-checkpointSummary", has_text="1 checkpoint").wait_for()
    run_from_palette(page, "Stop All Training Runs")
    page.wait_for_selector('.jp-TrainControl-run[data-run="nb7-run"][data-state="stopped"]', timeout=30_000)
    screenshot(page, "notebook7-stopped")

    code, result, err = script.finish()
    assert code == 0, err
    assert result["state"] == "stopped"
    assert [read_sidecar(path)["reason"] for path in result["checkpoints"]] == ["save", "stop"]


def test_side_panel_stops_a_notebook_run_while_the_kernel_is_busy(jupyter, page, tmp_path):
    start_training_notebook(jupyter, page, tmp_path)
    page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea-output button.widget-button").first.wait_for()
    wait_idle(page)

    page.locator(PANEL_TAB).click()
    busy_card = page.locator(f'{PANEL} .jp-TrainControl-run[data-run="nb-busy"]')
    busy_card.wait_for()
    assert words(busy_card.locator(".jp-TrainControl-where")) == "train.ipynb"
    busy_card.locator(".jp-TrainControl-metrics").wait_for()

    run_cell(page, 2)  # the foreground cell keeps the kernel busy for two minutes
    wait_until(lambda: kernel_state(page) == "connected/busy", timeout=10, message="a busy kernel")
    busy_card.get_by_role("button", name="Stop", exact=True).click()
    page.wait_for_selector('.jp-TrainControl-run[data-run="nb-busy"][data-state="stopped"]', timeout=30_000)
    assert_kernel_still_busy(page)
    (checkpoint,) = [item.get_attribute("data-path") for item in busy_card.locator(".jp-TrainControl-checkpoint").all()]
    assert read_sidecar(checkpoint)["reason"] == "stop"
    screenshot(page, "notebook-busy-kernel-run-stopped")

    page.evaluate("() => window.jupyterapp.commands.execute('notebook:interrupt-kernel')")
    wait_idle(page, timeout=30)
    run_cell(page, 3)
    idle_output = page.locator(".jp-Notebook .jp-Cell").nth(3).locator(".jp-OutputArea-output")
    idle_card = page.locator(f'{PANEL} .jp-TrainControl-run[data-run="nb-idle"]')
    idle_card.locator(".jp-TrainControl-metrics").wait_for()
    idle_output.locator("button.widget-button", has_text="Stop").wait_for()
    wait_idle(page)
    labels = [button.inner_text().strip() for button in idle_output.locator("button.widget-button").all()]
    assert labels == ["Save", "Stop", "Abort", "Pause", "Rollback"], labels
    idle_output.locator("button.widget-button", has_text="Stop").click()
    page.wait_for_selector('.jp-TrainControl-run[data-run="nb-idle"][data-state="stopped"]', timeout=30_000)
    (checkpoint,) = [item.get_attribute("data-path") for item in idle_card.locator(".jp-TrainControl-checkpoint").all()]
    assert read_sidecar(checkpoint)["reason"] == "stop"
    screenshot(page, "notebook-idle-kernel-widget-stop")


def test_notebook_panel_buttons_act_at_once_while_the_kernel_is_busy(jupyter, page, tmp_path):
    start_training_notebook(jupyter, page, tmp_path)
    panel = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".traincontrol-panel.traincontrol-run-nb-busy")
    panel.locator("button.traincontrol-command-stop").wait_for()
    wait_idle(page)
    wait_until(lambda: record_of("nb-busy").get("step"), timeout=60, message="nb-busy training")
    # The labextension marks the panels whose clicks it sends to the server.
    page.locator(".traincontrol-panel.traincontrol-run-nb-busy.traincontrol-direct").wait_for()

    run_cell(page, 2)  # a foreground time.sleep loop: the kernel is busy for two minutes
    wait_until(lambda: kernel_state(page) == "connected/busy", timeout=10, message="a busy kernel")

    panel.locator("button.traincontrol-command-save").click()
    seconds = timed(lambda: record_of("nb-busy").get("checkpoints"), 30, "the checkpoint of Save")
    print(f"save while busy: checkpoint listed after {seconds:.2f} s")
    assert_kernel_still_busy(page)
    (save,) = [ack for ack in record_of("nb-busy")["acks"] if ack["command"] == "save"]
    assert save["ids"][0].startswith("nbpanel-"), save  # the log says "by the notebook panel", not the side panel

    panel.locator("button.traincontrol-command-pause").click()
    seconds = timed(lambda: record_of("nb-busy").get("state") == "paused", 30, "paused")
    print(f"pause while busy: paused after {seconds:.2f} s")
    assert_kernel_still_busy(page)
    # The panel's widgets are updated from the training side (IOPub), busy or not.
    resume = panel.locator("button.traincontrol-command-resume", has_text="Resume")
    resume.wait_for(timeout=10_000)
    waits = panel.locator(".traincontrol-busy-note").all()  # the busy notice, and the kernel's once-only note
    assert waits and not [note for note in waits if note.is_visible()], "clicks do not wait here: no such notice"
    screenshot(panel, "notebook-panel-paused-busy-kernel")
    resume.click()
    seconds = timed(lambda: record_of("nb-busy").get("state") == "running", 30, "running again")
    print(f"resume while busy: running after {seconds:.2f} s")
    assert_kernel_still_busy(page)

    panel.locator("button.traincontrol-command-stop").click()
    seconds = timed(lambda: record_of("nb-busy").get("state") == "stopped", 30, "stopped")
    print(f"stop while busy: stopped after {seconds:.2f} s")
    assert_kernel_still_busy(page)
    record = record_of("nb-busy")
    assert [read_sidecar(path)["reason"] for path in record["checkpoints"]] == ["save", "stop"]
    assert record["checkpoints_this_run"] == 2
    screenshot(page, "notebook-panel-stopped-busy-kernel")

    page.evaluate("() => window.jupyterapp.commands.execute('notebook:interrupt-kernel')")
    wait_idle(page, timeout=30)

    # A --wait run keeps its own cell busy: its panel's Stop acts at once too.
    run_cell(page, 4)
    wait_panel = page.locator(".jp-Notebook .jp-Cell").nth(4).locator(".traincontrol-panel.traincontrol-run-nb-wait")
    wait_panel.locator("button.traincontrol-command-stop").wait_for()
    wait_until(lambda: record_of("nb-wait").get("step"), timeout=60, message="nb-wait training")
    assert kernel_state(page) == "connected/busy"
    page.locator(".traincontrol-panel.traincontrol-run-nb-wait.traincontrol-direct").wait_for()
    wait_panel.locator("button.traincontrol-command-stop").click()
    seconds = timed(lambda: record_of("nb-wait").get("state") == "stopped", 30, "nb-wait stopped")
    print(f"stop of a --wait run: stopped after {seconds:.2f} s")  # its 200 epochs take minutes
    page.locator(".jp-Notebook .jp-Cell").nth(4).locator(".jp-OutputArea-output").get_by_text("wait cell done", exact=True).wait_for(timeout=30_000)
    wait_idle(page, timeout=30)
    screenshot(page, "notebook-wait-run-stopped")


def test_the_learning_rate_is_steered_from_the_side_panel_and_the_notebook_panel(jupyter, page, tmp_path):
    start_training_notebook(jupyter, page, tmp_path)
    panel = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".traincontrol-panel.traincontrol-run-nb-busy")
    field = panel.locator(".traincontrol-field.traincontrol-tunable-learning_rate input")
    page.wait_for_function("(el) => el.value === '0.01'", arg=field.element_handle(timeout=60_000), timeout=60_000)
    wait_idle(page)

    # The side panel: the run's card shows the learning rate; Enter sets it.
    page.locator(PANEL_TAB).click()
    card = page.locator(f'{PANEL} .jp-TrainControl-run[data-run="nb-busy"]')
    card_lr = card.locator(".jp-TrainControl-lrInput")
    card_lr.wait_for()
    wait_until(lambda: card_lr.input_value() == "0.01", timeout=10, message="the card's learning rate")
    screenshot(card, "side-panel-card-learning-rate")
    card_lr.fill("3e-4")
    card_lr.press("Enter")
    seconds = timed(lambda: (record_of("nb-busy").get("tunables") or {}).get("learning_rate") == pytest.approx(3e-4),
                    30, "the learning rate set from the side panel")
    print(f"set lr from the side panel: in the record after {seconds:.2f} s")
    change = record_of("nb-busy")["changes"][-1]
    assert change["by"].startswith("'set learning_rate=0.0003' #rest-") and change["old"] == pytest.approx(0.01)
    card.locator(".jp-TrainControl-feedback", has_text="Sent set learning_rate=0.0003").wait_for()
    # The notebook panel shows the new value too (the kernel updates its widget), written as the side panel writes it.
    page.wait_for_function("(el) => el.value === '3e-4'", arg=field.element_handle(), timeout=10_000)
    wait_until(lambda: card_lr.input_value() == "3e-4", timeout=10, message="the card's learning rate, as 3e-4")
    screenshot(panel, "notebook-panel-learning-rate")

    # While the kernel is busy, the notebook panel's field and Rollback go through the server.
    run_cell(page, 2)
    wait_until(lambda: kernel_state(page) == "connected/busy", timeout=10, message="a busy kernel")
    page.locator(".traincontrol-panel.traincontrol-run-nb-busy.traincontrol-direct").wait_for()
    field.fill("0.001")
    field.press("Enter")
    seconds = timed(lambda: (record_of("nb-busy").get("tunables") or {}).get("learning_rate") == pytest.approx(0.001),
                    30, "the learning rate set from the notebook panel")
    print(f"set lr from the notebook panel, kernel busy: in the record after {seconds:.2f} s")
    assert_kernel_still_busy(page)
    field.blur()  # the widget's own sync is held back: the value is sent once
    panel.locator("button.traincontrol-command-save").click()
    wait_until(lambda: record_of("nb-busy").get("checkpoints"), timeout=30, message="a checkpoint")
    assert [c["new"] for c in record_of("nb-busy")["changes"]] == [0.0003, 0.001]
    panel.locator("button.traincontrol-command-rollback").click()
    dialog = page.locator(".jp-Dialog")
    dialog.get_by_text("Roll back nb-busy?").wait_for()
    screenshot(page, "notebook-panel-rollback-confirm")
    dialog.get_by_role("button", name="Roll back").click()
    wait_until(lambda: any(c["name"] == "rollbacks" for c in record_of("nb-busy")["changes"]), timeout=30,
               message="the rollback")
    assert record_of("nb-busy")["tunables"]["learning_rate"] == pytest.approx(0.001)  # steered values stay

    page.set_viewport_size({"width": 760, "height": 900})  # narrow
    screenshot(page, "steering-narrow")
    screenshot(card, "side-panel-card-learning-rate-narrow")
    card.get_by_role("button", name="Stop", exact=True).click()
    page.wait_for_selector('.jp-TrainControl-run[data-run="nb-busy"][data-state="stopped"]', timeout=30_000)
    assert read_sidecar(record_of("nb-busy")["checkpoints"][-1])["tunables"] == {"learning_rate": 0.001}


def test_notebook_7_shows_the_steering_controls_of_the_notebook_panel(jupyter, page, tmp_path):
    start_training_notebook(jupyter, page, tmp_path, app="notebook")
    panel = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".traincontrol-panel.traincontrol-run-nb-busy")
    field = panel.locator(".traincontrol-field.traincontrol-tunable-learning_rate input")
    page.wait_for_function("(el) => el.value === '0.01'", arg=field.element_handle(timeout=60_000), timeout=60_000)
    wait_idle(page)
    panel.locator("button.traincontrol-command-save").click()
    wait_until(lambda: record_of("nb-busy").get("checkpoints"), timeout=30, message="a checkpoint")
    field.fill("0.003")
    field.press("Enter")
    wait_until(lambda: (record_of("nb-busy").get("tunables") or {}).get("learning_rate") == pytest.approx(0.003),
               timeout=30, message="the learning rate set")
    panel.locator("button.traincontrol-command-rollback:not([disabled])").wait_for()
    screenshot(panel, "notebook7-notebook-panel-steering")
    page.set_viewport_size({"width": 700, "height": 900})
    screenshot(page, "notebook7-notebook-panel-steering-narrow")
    page.set_viewport_size({"width": 600, "height": 900})  # as tests/test_browser_notebook6.py's ipywidgets 7 shots
    panel.scroll_into_view_if_needed()
    screenshot(panel, "notebook7-ipywidgets8-600-panel")
    panel.locator("button.traincontrol-command-stop").click()
    wait_until(lambda: record_of("nb-busy").get("state") == "stopped", timeout=30, message="stopped")
    panel.locator(".traincontrol-outcome").wait_for()
    screenshot(panel, "notebook7-ipywidgets8-600-panel-stopped")
    assert [c["new"] for c in record_of("nb-busy")["changes"]] == [0.003]
