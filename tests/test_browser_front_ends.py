"""The notebook panel where its clicks go through the kernel, in a real browser.

JupyterLab with this package's server extension turned off stands in for
the front ends that have none (VS Code, Colab, classic Notebook): the
JupyterLab extension then sends no click to the server, and each travels
as a comm message that waits while another cell runs. The panel says so at
once (a click on a button shows its line, with no kernel involved), says
once per kernel what the server extension would add, and a click that the
run's end outran is said not applied. With the server extension on, none
of those notes shows.
"""

from __future__ import annotations

import time

from browser_harness import (  # noqa: F401  (browser, page, jupyter: fixtures)
    NEEDS_CHROMIUM,
    TRAIN_CELLS,
    browser,
    jupyter,
    kernel_state,
    notebook_json,
    open_notebook,
    page,
    record_of,
    run_cell,
    screenshot,
    wait_idle,
    words,
)
from helpers import wait_until

pytestmark = NEEDS_CHROMIUM

#: A foreground cell that keeps the kernel busy; interrupted, it ends only
#: once the run has ended, so the clicks queued behind it come after that.
BUSY_UNTIL_THE_RUN_ENDS = """import jupyter_traincontrol
run = jupyter_traincontrol.runs()[-1]
try:
    for _ in range(1200):
        time.sleep(0.1)
except KeyboardInterrupt:
    while run.state not in ("stopped", "aborted", "finished", "failed"):
        time.sleep(0.05)
    raise"""


def open_training_notebook(jupyter, page, tmp_path, server_extension: bool):
    server = jupyter("lab", server_extension=server_extension)
    cells = [cell.replace("{ck}", str(tmp_path / "ck")) for cell in TRAIN_CELLS[:2] + [BUSY_UNTIL_THE_RUN_ENDS]]
    (server.root / "train.ipynb").write_text(notebook_json(cells))
    open_notebook(page, server)
    run_cell(page, 0)
    wait_idle(page)
    run_cell(page, 1)
    panel = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".traincontrol-panel.traincontrol-run-nb-busy")
    panel.locator("button.traincontrol-command-stop").wait_for()
    wait_idle(page)
    wait_until(lambda: record_of("nb-busy").get("step"), timeout=60, message="nb-busy training")
    return panel


def test_without_the_server_extension_the_panel_says_clicks_wait_and_which_were_not_applied(jupyter, page, tmp_path):
    panel = open_training_notebook(jupyter, page, tmp_path, server_extension=False)
    server_note = panel.locator(".traincontrol-server-note")
    server_note.wait_for(state="visible", timeout=15_000)  # after a few seconds: no JupyterLab extension hid it
    assert "Here the panel's clicks go through the kernel" in words(server_note)
    assert "traincontrol-direct" not in (panel.get_attribute("class") or "")
    screenshot(panel, "front-ends-no-server-extension-note")

    run_cell(page, 2)  # the kernel is busy from here
    wait_until(lambda: kernel_state(page) == "connected/busy", timeout=10, message="a busy kernel")
    busy = panel.locator("span.traincontrol-busy-note", has_text="The kernel is busy with a cell")
    busy.wait_for(state="visible", timeout=10_000)
    click_waits = panel.locator(".traincontrol-click-waits")
    assert not click_waits.is_visible()
    started = time.monotonic()
    panel.locator("button.traincontrol-command-save").click()
    click_waits.wait_for(state="visible", timeout=5_000)  # at once: the browser shows it, the kernel is busy
    print(f"'this click waits' shown {time.monotonic() - started:.2f} s after the click")
    assert "This click waits for the kernel" in words(click_waits)
    assert not record_of("nb-busy").get("checkpoints"), "the save waits for the kernel"
    screenshot(panel, "front-ends-click-waits")

    page.evaluate("() => window.jupyterapp.commands.execute('notebook:interrupt-kernel')")
    not_applied = panel.locator(".traincontrol-not-applied")
    not_applied.wait_for(state="visible", timeout=60_000)
    assert words(not_applied).startswith(
        "Save: 'save' not applied: the run had ended (Stopped by a kernel interrupt) when the kernel took the click")
    assert record_of("nb-busy")["state"] == "stopped"
    assert not server_note.is_visible()  # an ended run's panel drops it
    screenshot(panel, "front-ends-click-not-applied")


def test_with_the_server_extension_the_panel_shows_none_of_those_notes(jupyter, page, tmp_path):
    panel = open_training_notebook(jupyter, page, tmp_path, server_extension=True)
    page.locator(".traincontrol-panel.traincontrol-run-nb-busy.traincontrol-direct").wait_for()
    assert panel.locator(".traincontrol-server-note").count() == 1  # written: the page hides it
    time.sleep(4)  # past the server note's delay
    assert not panel.locator(".traincontrol-server-note").is_visible()
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:interrupt-kernel')")  # stops the run
    wait_until(lambda: record_of("nb-busy").get("state") == "stopped", timeout=60, message="nb-busy stopped")
