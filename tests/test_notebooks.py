"""The example notebooks, executed cell by cell in a real kernel: with the
interrupts and restarts their cells' tags ask for (a person following the
text), and top to bottom with nobody pressing anything (Run All, a slow
reader). Either way no cell fails and no output is longer than a screen."""

from __future__ import annotations

import shutil
import sys

import pytest

from helpers import REPO, child_env

sys.path.insert(0, str(REPO / "examples"))
from notebook_runner import NotebookRunner  # noqa: E402

pytestmark = pytest.mark.timeout(300)

#: What "no longer than a screen" means for a cell's text output.
SCREEN_LINES, SCREEN_CHARACTERS = 25, 2500


def run_notebook(name, tmp_path, runtime_dir, follow_tags=True, interrupt_in=None):
    runtime_dir.parent.mkdir(exist_ok=True)
    shutil.copy(REPO / "notebooks" / name, tmp_path)
    with NotebookRunner(tmp_path, child_env(runtime_dir.parent)) as runner:
        cells = list(runner.run(tmp_path / name, follow_tags=follow_tags, interrupt_in=interrupt_in))
    for cell, outputs in cells:
        text = outputs.text()
        assert len(text.splitlines()) <= SCREEN_LINES and len(text) <= SCREEN_CHARACTERS, (
            f"a cell's output is longer than a screen ({len(text.splitlines())} lines, {len(text)} characters; "
            f"expected at most {SCREEN_LINES} and {SCREEN_CHARACTERS}):\n{''.join(cell['source'])}\n---\n{text[:600]}"
        )
    return cells


def output_of(cells, fragment, exact=False):
    """The text output of the first cell whose source contains (or is) `fragment`."""
    for cell, outputs in cells:
        source = "".join(cell["source"])
        if (source == fragment) if exact else (fragment in source):
            return outputs.text()
    raise AssertionError(f"No cell with {fragment!r}")


def test_quickstart(tmp_path, runtime_dir):
    cells = run_notebook("quickstart.ipynb", tmp_path, runtime_dir)
    assert "state: stopped" in output_of(cells, "run.wait()")
    checkpoint = output_of(cells, "checkpoint = run.checkpoints[-1]")
    assert "ckpt-000001-" in checkpoint and "reason: interrupt, epoch " in checkpoint
    assert "resume_state" not in checkpoint  # what a person reads, not the random state
    resumed = output_of(cells, "resumed at epoch")
    assert "finished at 40" in resumed and "resumed at epoch 1 " not in resumed
    assert "optimizer step now: 1040" in resumed  # 40 epochs of 26 batches, exactly


def test_quickstart_run_all_then_interrupt_while_a_later_cell_waits(tmp_path, runtime_dir):
    """Run All, then Interrupt, as section 2 says: the waiting cell is busy
    when the interrupt comes; the run stops with a checkpoint, and no cell fails."""
    cells = run_notebook("quickstart.ipynb", tmp_path, runtime_dir, follow_tags=False, interrupt_in="run.wait()")
    assert "state: stopped" in output_of(cells, "run.wait()")
    assert "reason: interrupt, epoch " in output_of(cells, "checkpoint = run.checkpoints[-1]")
    resumed = output_of(cells, "resumed at epoch")
    assert "finished at 40" in resumed and "optimizer step now: 1040" in resumed


def test_quickstart_top_to_bottom_with_nobody_pressing_interrupt(tmp_path, runtime_dir):
    cells = run_notebook("quickstart.ipynb", tmp_path, runtime_dir, follow_tags=False)
    ended = output_of(cells, "run.wait()")
    assert "state: finished" in ended and "epochs in History: 30 (the last one: epoch 30)" in ended
    checkpoint = output_of(cells, "checkpoint = run.checkpoints[-1]")
    assert "reason: end, epoch 30, batch 26, optimizer step 780" in checkpoint
    assert "optimizer step in the checkpoint: 780" in output_of(cells, "restored = keras.models.load_model")
    resumed = output_of(cells, "resumed at epoch")
    assert "resumed at epoch 31 and finished at 40" in resumed  # 10 more epochs after the end checkpoint
    assert "optimizer step now: 1040" in resumed


def test_terminal_control(tmp_path, runtime_dir):
    cells = run_notebook("terminal_control.ipynb", tmp_path, runtime_dir)
    listing = output_of(cells, "!jupyter-traincontrol list", exact=True)
    assert "terminal-demo  running" in listing
    assert "terminal-demo  paused" in output_of(cells, "send terminal-demo pause")
    assert "ckpt-000001" in output_of(cells, "echo save")
    assert "stopped" in output_of(cells, "send terminal-demo stop")
    errors = output_of(cells, "frobnicate")
    assert "Unknown command 'frobnicate'" in errors and "exit code 2" in errors
    assert "No run named 'no-such-run'" in errors and "exit code 3" in errors


def test_resume_after_restart(tmp_path, runtime_dir):
    cells = run_notebook("resume_after_restart.ipynb", tmp_path, runtime_dir)
    before = output_of(cells, "checkpoint taken before the restart")
    assert "ckpt-000001-" in before
    resumed = output_of(cells, "History starts at epoch")
    assert "(not 1)" in resumed and "History starts at epoch 1 " not in resumed
    assert "-> 960" in resumed  # 30 epochs of 32 batches, exactly


def test_resume_after_restart_top_to_bottom_without_a_restart(tmp_path, runtime_dir):
    cells = run_notebook("resume_after_restart.ipynb", tmp_path, runtime_dir, follow_tags=False)
    assert "(reason: end)" in output_of(cells, "checkpoint taken before the restart")
    resumed = output_of(cells, "History starts at epoch")
    assert "Nothing left to train" in resumed and "960 -> 960" in resumed  # the resume starts no new epoch


def test_custom_loop(tmp_path, runtime_dir):
    cells = run_notebook("custom_loop.ipynb", tmp_path, runtime_dir)
    waited = output_of(cells, "run.wait()")
    assert "state: stopped - the loop says: stopped" in waited
    checkpoint = output_of(cells, "checkpoint = run.checkpoints[-1]")
    assert "reason: interrupt" in checkpoint
    step = int(checkpoint.split("optimizer step in the file: ")[1].split()[0])
    assert 0 < step < 20 * 16 and f"optimizer step {step}" in checkpoint
    resumed = output_of(cells, "optimizer step now")
    assert "state: finished" in resumed
    assert "optimizer step now: 480 " in resumed  # every batch of 30 epochs trained once, none twice
