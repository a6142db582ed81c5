"""How a run ends, as a person sees it in the browser: Abort asks first, a
finished run shows its outcome, and after a kernel restart the panel's
place shows how the run ended (read from the server), in JupyterLab and
Notebook 7; classic Notebook (the panel only) with its own confirm step.

Screenshots (1400 and 900 px wide, before and after a kernel restart) go
under ``test-artifacts/browser/``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from browser_harness import (  # noqa: F401  (browser, page, jupyter: fixtures)
    NEEDS_CHROMIUM,
    PANEL,
    TRAIN_CELLS,
    browser,
    jupyter,
    notebook_json,
    open_classic_notebook,
    open_notebook,
    page,
    record_of,
    restart_kernel,
    run_cell,
    screenshot,
    start_training_notebook,
    wait_idle,
    words,
)
from helpers import read_sidecar, wait_until
from jupyter_traincontrol.notebook.output_mime import RUN_MIME_TYPE

pytestmark = [NEEDS_CHROMIUM, pytest.mark.timeout(400)]

#: The setup, a run that finishes in a few seconds, and one that trains for minutes.
CELLS = [
    TRAIN_CELLS[0],
    """%%interruptible_fit --name nb-done --checkpoint-dir {ck}/nb-done
history = build_model().fit(x, y, epochs=3, validation_split=0.125, verbose=0)""",
    TRAIN_CELLS[1],
]


def cell(page, index: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def button_rows(panel) -> tuple[list[int], int]:
    """How many buttons each line of `panel` holds, top to bottom, and the
    spread of their widths in px, read in one go: a running panel swaps
    buttons (Pause, Resume), so boxes read one by one can vanish between reads."""
    boxes = panel.evaluate("""panel => [...panel.querySelectorAll("button.traincontrol-button")]
        .map(button => button.getBoundingClientRect())
        .filter(rect => rect.width > 0 && rect.height > 0)
        .map(rect => ({y: rect.y, width: rect.width}))""")
    tops = sorted({round(box["y"]) for box in boxes})
    widths = [box["width"] for box in boxes]
    return [sum(1 for box in boxes if round(box["y"]) == top) for top in tops], round(max(widths) - min(widths))


def open_side_panel(page) -> None:
    page.evaluate("() => { window.jupyterapp.commands.execute('traincontrol:open-panel'); }")
    page.locator(PANEL).wait_for(state="visible")


def place_of(page, index: int, name: str):
    """The run's place in cell `index`: where its panel's widgets were."""
    return cell(page, index).locator(f'.jp-TrainControl-place[data-run="{name}"]')


@pytest.mark.parametrize("app", ["lab", "notebook"])
def test_the_notebook_panel_asks_before_abort_shows_how_a_run_finished_and_keeps_its_place_after_a_restart(
        app, jupyter, page, tmp_path):
    start_training_notebook(jupyter, page, tmp_path, app=app, cells=CELLS)
    done = cell(page, 1).locator(".traincontrol-panel.traincontrol-run-nb-done")
    # A finished run's panel: how it ended, not a row of faded buttons.
    outcome = done.locator(".traincontrol-outcome")
    outcome.wait_for(timeout=60_000)
    assert words(outcome).startswith("Finished: training ran to its end at epoch 3/3")
    assert done.locator("button.traincontrol-button").evaluate_all("(buttons) => buttons.filter(b => b.offsetParent).length") == 0
    wait_idle(page)

    run_cell(page, 2)
    busy = cell(page, 2).locator(".traincontrol-panel.traincontrol-run-nb-busy")
    busy.locator("button.traincontrol-command-stop").wait_for()
    wait_until(lambda: record_of("nb-busy").get("step"), timeout=60, message="nb-busy training")
    busy.locator("button.traincontrol-command-save").click()
    wait_until(lambda: record_of("nb-busy").get("checkpoints"), timeout=30, message="the checkpoint of Save")
    open_side_panel(page)
    ended = page.locator(f'{PANEL} .jp-TrainControl-run[data-run="nb-done"]')
    ended.locator(".jp-TrainControl-outcomeText", has_text="Finished: training ran to its end").wait_for()
    assert "jp-mod-ended" in ended.get_attribute("class")
    screenshot(page, f"{app}-1400-running-and-finished")

    # Abort asks first, as the side panel does; cancelled, nothing is sent.
    busy.locator("button.traincontrol-command-abort").click()
    dialog = page.locator(".jp-Dialog")
    dialog.get_by_text("Abort nb-busy?").wait_for()
    screenshot(page, f"{app}-1400-abort-asks")
    dialog.get_by_role("button", name="Cancel").click()
    dialog.wait_for(state="detached")
    assert record_of("nb-busy")["state"] == "running"

    # At 900 px the buttons wrap into lines of about one length, all one width.
    page.set_viewport_size({"width": 900, "height": 900})
    busy.scroll_into_view_if_needed()
    rows, spread = button_rows(busy)
    assert max(rows) - min(rows) <= 1 and spread <= 2, f"buttons per line {rows}, widths spread {spread} px"
    screenshot(page, f"{app}-900-running")
    screenshot(busy, f"{app}-900-notebook-panel")

    # After a kernel restart the widgets are gone: the panel's place shows the run, read from the server.
    restart_kernel(page)
    for index, name in ((1, "nb-done"), (2, "nb-busy")):
        place_of(page, index, name).wait_for(timeout=30_000)
        assert not cell(page, index).locator(".traincontrol-panel").is_visible()
    assert "restarted" in words(place_of(page, 2, "nb-busy").locator(".jp-TrainControl-placeNote"))
    place_of(page, 2, "nb-busy").scroll_into_view_if_needed()
    screenshot(page, f"{app}-900-after-restart")
    page.set_viewport_size({"width": 1400, "height": 900})
    screenshot(page, f"{app}-1400-after-restart")


def test_ended_runs_stay_listed_with_how_they_ended_across_kernel_and_server_restarts(jupyter, page, tmp_path):
    server = start_training_notebook(jupyter, page, tmp_path, cells=CELLS)
    cell(page, 1).locator(".traincontrol-outcome").wait_for(timeout=60_000)
    wait_idle(page)
    run_cell(page, 2)
    busy = cell(page, 2).locator(".traincontrol-panel.traincontrol-run-nb-busy")
    busy.locator("button.traincontrol-command-save").click()
    wait_until(lambda: record_of("nb-busy").get("checkpoints"), timeout=60, message="the checkpoint of Save")
    restart_kernel(page)

    def check(where: str) -> None:
        """The ended runs as the side panel and the cells show them."""
        for scope in (page.locator(PANEL), place_of(page, 2, "nb-busy")):
            card = scope.locator('.jp-TrainControl-run[data-run="nb-busy"]')
            card.locator(".jp-TrainControl-outcomeText", has_text="Stopped when its kernel restarted").wait_for()
            assert card.get_attribute("data-end-reason") == "kernel-restart", where
            paths = [item.get_attribute("data-path") for item in card.locator(".jp-TrainControl-checkpoint").all()]
            # The save's, then the restart's (jupyter_client interrupts a kernel before it shuts it down).
            reasons = [read_sidecar(path)["reason"] for path in paths]
            assert len(reasons) == 2 and reasons[0] == "save" and reasons[1] in ("interrupt", "stop"), (where, reasons)
        # Newest first after the live ones: nb-busy ended after nb-done.
        names = [card.get_attribute("data-run") for card in page.locator(f"{PANEL} .jp-TrainControl-run").all()]
        assert names.index("nb-busy") < names.index("nb-done"), names
        for scope in (page.locator(PANEL), place_of(page, 1, "nb-done")):
            card = scope.locator('.jp-TrainControl-run[data-run="nb-done"]')
            card.locator(".jp-TrainControl-outcomeText", has_text="Finished: training ran to its end").wait_for()
            assert card.get_attribute("data-end-reason") == "finished", where
            (path,) = [item.get_attribute("data-path") for item in card.locator(".jp-TrainControl-checkpoint").all()]
            assert read_sidecar(path)["reason"] == "end", where  # save_at_end

    open_side_panel(page)
    check("after the kernel restart")
    screenshot(page, "lab-1400-ended-runs-after-kernel-restart")

    # The notebook, saved with its outputs, reopened on a new server: the same runs, the same words.
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_timeout(1000)
    server.stop()
    later = jupyter("lab")
    shutil.copy(server.root / "train.ipynb", later.root / "train.ipynb")
    open_notebook(page, later)
    open_side_panel(page)
    check("after a server restart")
    screenshot(page, "lab-1400-ended-runs-after-server-restart")


@pytest.mark.parametrize("app", ["lab", "notebook"])
def test_a_kernel_killed_for_memory_leaves_its_run_lost_with_an_autosave_and_how_to_continue(app, jupyter, page, tmp_path):
    """The kernel dies with SIGKILL (as the OOM killer ends it) while its
    run trains with a short autosave: the side panel and the cell's place
    say the run was lost, list its autosave and how to go on (--resume)."""
    cells = [TRAIN_CELLS[0], TRAIN_CELLS[1].replace("--name nb-busy", "--name nb-busy --autosave 1")]
    start_training_notebook(jupyter, page, tmp_path, app=app, cells=cells)
    wait_until(lambda: len(record_of("nb-busy").get("checkpoints") or []) >= 1, timeout=90, message="an autosave")
    newest = record_of("nb-busy")["checkpoints"][-1]
    assert read_sidecar(newest)["reason"] == "autosave"
    os.kill(record_of("nb-busy")["pid"], signal.SIGKILL)  # the kernel, as the OOM killer ends it
    hint = (f"Its newest checkpoint is {Path(newest).name}: continue from it with "
            "%%interruptible_fit --name nb-busy --resume.")
    open_side_panel(page)
    for scope in (page.locator(PANEL), place_of(page, 1, "nb-busy")):
        card = scope.locator('.jp-TrainControl-run[data-run="nb-busy"]')
        card.locator(".jp-TrainControl-outcomeText", has_text="Lost: its process ended").wait_for(timeout=60_000)
        assert words(card.locator(".jp-TrainControl-resumeHint")) == hint
    notice = page.locator(".jp-Dialog .jp-mod-accept")  # JupyterLab's "the kernel appears to have died"
    if notice.is_visible():
        notice.click()
    for width in (1400, 600):
        page.set_viewport_size({"width": width, "height": 900})
        place_of(page, 1, "nb-busy").scroll_into_view_if_needed()
        screenshot(page, f"{app}-{width}-kernel-killed")


@pytest.mark.parametrize("app", ["lab", "notebook"])
def test_a_run_the_history_let_go_is_named_in_its_place_without_claiming_checkpoints(app, jupyter, page, tmp_path):
    """A notebook opened long after its run (gone from the server's
    history): the output's place names the run, says why the server does
    not list it, and where its checkpoints would be, not that there are
    any (a run that wrote none left no folder)."""
    server = jupyter(app)
    notebook = json.loads(notebook_json(["# trained last month"]))
    run = {"name": "long-gone", "run_id": "0" * 32, "checkpoint_dir": str(tmp_path / "ck" / "long-gone")}
    notebook["cells"][0]["outputs"] = [{"output_type": "display_data", "metadata": {},
                                        "data": {RUN_MIME_TYPE: run, "text/plain": "run long-gone"}}]
    (server.root / "old.ipynb").write_text(json.dumps(notebook))
    open_notebook(page, server, "old.ipynb")
    place = place_of(page, 0, "long-gone")
    place.locator(".jp-mod-unlisted").wait_for()
    wait_until(lambda: "lists no such run" in words(place), timeout=30, message="the server's answer")
    text = words(place)
    assert "its history keeps ended runs for 7 days (the last 50, 5 of one name)" in text
    assert f"checkpoints, if it wrote any, in {run['checkpoint_dir']}" in text.replace("\n", "")
    for width in (1400, 600):
        page.set_viewport_size({"width": width, "height": 900})
        screenshot(place, f"{app}-{width}-run-place-unlisted")


@pytest.mark.skipif(importlib.util.find_spec("nbclassic") is None,
                    reason="classic Notebook (the nbclassic package) is not installed")
def test_classic_notebook_panel_asks_before_abort_and_old_notices_go(jupyter, page, tmp_path):
    """Classic Notebook loads no JupyterLab extension: clicks travel as comm
    messages, and the panel asks with its own "Confirm abort" step."""
    open_classic_notebook(page, jupyter("nbclassic"), CELLS, tmp_path)

    def run(index: int) -> None:
        page.evaluate(f"() => Jupyter.notebook.execute_cells([{index}])")

    run(0)
    wait_until(lambda: page.evaluate("() => Jupyter.notebook.get_cell(0).input_prompt_number") not in (None, "*"),
               timeout=120, message="the setup cell")
    run(1)
    done = page.locator(".cell").nth(1).locator(".traincontrol-panel")
    done.locator(".traincontrol-outcome").wait_for(timeout=60_000)
    run(2)
    busy = page.locator(".cell").nth(2).locator(".traincontrol-panel.traincontrol-run-nb-busy")
    busy.locator("button.traincontrol-command-stop").wait_for()
    wait_until(lambda: record_of("nb-busy").get("step"), timeout=60, message="nb-busy training")

    # Three clicks, two notices at most, and they go after a few seconds.
    for _ in range(3):
        busy.locator("button.traincontrol-command-save").click()
        page.wait_for_timeout(300)
    wait_until(lambda: words(busy).count("Save: sent") >= 1, timeout=10, message="a click's notice")
    assert words(busy).count("Save: sent") <= 2
    screenshot(page, "classic-1400-notices")
    wait_until(lambda: "Save: sent" not in words(busy), timeout=20, message="the notices to go")

    abort = busy.locator("button.traincontrol-command-abort")
    abort.click()
    wait_until(lambda: abort.inner_text().strip() == "Confirm abort", timeout=10, message="Abort to ask first")
    assert record_of("nb-busy")["state"] == "running"
    page.set_viewport_size({"width": 900, "height": 900})
    busy.scroll_into_view_if_needed()
    rows, spread = button_rows(busy)
    assert max(rows) - min(rows) <= 1 and spread <= 2, f"buttons per line {rows}, widths spread {spread} px"
    screenshot(page, "classic-900-confirm-abort")
    abort.click()
    wait_until(lambda: record_of("nb-busy").get("state") == "aborted", timeout=30, message="aborted")
    busy.locator(".traincontrol-outcome", has_text="Aborted").wait_for()
    screenshot(busy, "classic-900-aborted-panel")

    page.evaluate("() => Jupyter.notebook.kernel.restart()")
    page.wait_for_timeout(5000)
    screenshot(page, "classic-900-after-restart")
    page.set_viewport_size({"width": 1400, "height": 900})
    screenshot(page, "classic-1400-after-restart")
