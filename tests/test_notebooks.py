"""The example notebooks, executed cell by cell in a real kernel (with real interrupts and restarts)."""

from __future__ import annotations

import shutil
import sys

import pytest

from helpers import REPO, child_env

sys.path.insert(0, str(REPO / "examples"))
from notebook_runner import NotebookRunner  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def run_notebook(name, tmp_path, runtime_dir):
    runtime_dir.parent.mkdir(exist_ok=True)
    shutil.copy(REPO / "notebooks" / name, tmp_path)
    with NotebookRunner(tmp_path, child_env(runtime_dir.parent)) as runner:
        return [(cell, outputs) for cell, outputs in runner.run(tmp_path / name)]


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
    assert "ckpt-000001-" in output_of(cells, "checkpoint = run.checkpoints[-1]")
    assert '"reason": "interrupt"' in output_of(cells, "checkpoint = run.checkpoints[-1]")
    resumed = output_of(cells, "resumed at epoch")
    assert "finished at 30" in resumed and "resumed at epoch 1 " not in resumed
    assert "optimizer step now: 780" in resumed  # 30 epochs of 26 batches, exactly


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
