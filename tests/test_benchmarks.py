"""Each benchmark runs as a smoke test (``--quick``) and ends with its summary line.

These are not timed tests: the figures are not checked here (this machine
is shared and noisy); `benchmarks/README.md` holds the measured ones. The
exception is `command_path.py`, whose figures are counts, not times: the
ones docs/architecture.md shows must be what it traces now.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from helpers import REPO, child_env


@pytest.mark.parametrize("script", [
    "latency", "checkpoint_cost", "rest_api", "loop_overhead", "chart_rebuild", "short_fit_parts", "registry_tricks",
    "callback_state_cost", "send_cost",
    # A 2-process JAX job (jax is in the test extra).
    pytest.param("distributed", marks=pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs jax")),
    # A 2-rank torchrun DDP job (gloo on CPU) under TrainLoop.
    pytest.param("torch_job", marks=pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")),
])
def test_benchmark_quick_run_prints_its_summary(script, tmp_path):
    quick_run(script, tmp_path)


def test_autosave_cost_prints_the_cost_at_the_default_and_a_short_interval(tmp_path):
    """``autosave_cost.py`` on one backend: the fit without autosave, at the
    default interval and at a short one, and the cost derived for the default."""
    result = quick_run("autosave_cost", tmp_path, "--backend", "tensorflow")
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith("SUMMARY autosave_cost: tensorflow: at the default 600 s: "), summary
    assert "; every 1 s: " in summary and " a fit)" in summary and "x CPU" in summary


def test_overhead_measures_each_backend_in_its_own_process(tmp_path):
    """``overhead.py`` (``--backend all``, the default) runs itself once per
    backend and ends with one summary naming all three."""
    result = quick_run("overhead", tmp_path, timeout=240)
    for backend in ("tensorflow", "jax", "torch"):
        assert f"overhead on {backend} (Keras " in result.stdout
        assert f"\n{backend}: overhead: ControlCallback " in result.stdout
    summary = result.stdout.strip().splitlines()[-1]
    assert [name for name in ("tensorflow", "jax", "torch") if f" {name} " in summary] == ["tensorflow", "jax", "torch"]
    assert summary.count("x part by part") == 3 and summary.endswith("(goal <= 1.02x each)")


def test_overhead_short_fits_measures_a_loop_of_fits_with_the_defaults(tmp_path):
    """``overhead.py --short-fits``: the 2-batch fits, then a loop of fits
    with ``save_at_end`` on, a run each fit beside a with block, then fits
    with a new unnamed callback each."""
    result = quick_run("overhead", tmp_path, "--short-fits", "--backend", "jax")
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith("SUMMARY overhead: short fits on jax: ") and " ms in a with block " in summary
    assert "(each writes its end checkpoint; 3 kept)" in summary and "(1 checkpoint, as the block ends)" in summary
    assert "; 20 fits with a new unnamed ControlCallback each: " in summary


def test_gpu_benchmark_measures_every_part_beside_its_peer(tmp_path):
    """``gpu.py`` on torch (on CPU here): the step overhead, the stop, the
    save hold against model.save and beside PyTorch's async checkpointer."""
    result = quick_run("gpu", tmp_path, "--backend", "torch")
    for part in ("\n1. Step overhead: ", "\n2. Stop: 2 stops ", "\n3. Save hold against model.save",
                 "our save command beside torch.distributed.checkpoint.async_save"):
        assert part in result.stdout
    assert "skipped" not in result.stdout
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith("SUMMARY gpu: torch: overhead 1 ms ") and " held " in summary


def test_gpu_benchmark_starts_nothing_once_its_budget_is_spent(tmp_path):
    """A lease is minutes: past ``--budget-s`` each part is skipped, saying so."""
    result = quick_run("gpu", tmp_path, "--backend", "torch", "--budget-s", "0", measured=False)
    for part in ("step overhead", "stop latency", "saves of 0.001 GB"):
        assert f"(skipped: {part}, the --budget-s is spent)" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "SUMMARY gpu: torch: nothing measured"


def test_command_path_traces_each_path_and_the_docs_show_what_it_traces_now(tmp_path):
    """``command_path.py`` (TensorFlow) traces a CLI ``stop`` and ``abort``,
    a panel click and a `TrainLoop` ``stop``; its figures are deterministic,
    and the block of them in docs/architecture.md is what it prints now."""
    result = quick_run("command_path", tmp_path, measured=False, timeout=240)
    summary = result.stdout.strip().splitlines()[-1]
    figures = r"\d+ / \d+ / \d+"
    assert re.fullmatch(
        rf"SUMMARY command_path: tensorflow: whole command \(modules / hops / re-entries\) cli-stop {figures}; "
        rf"cli-abort {figures}; panel-stop {figures}; loop-stop {figures}; targets met [0-4] of 4; rounds agree",
        summary), summary
    begin, end = "<!-- command-path:begin -->", "<!-- command-path:end -->"
    printed = result.stdout[result.stdout.index(begin):result.stdout.index(end) + len(end)]
    docs = (REPO / "docs" / "architecture.md").read_text()
    assert docs.count(begin) == 1 and docs.count(end) == 1
    shown = docs[docs.index(begin):docs.index(end) + len(end)]
    assert shown == printed, ("docs/architecture.md shows other command path figures than the benchmark traces now: "
                              "run `python benchmarks/command_path.py --write-docs`\n" + printed)


def quick_run(script: str, tmp_path, *options: str, timeout: float = 120, measured: bool = True
              ) -> subprocess.CompletedProcess:
    """Runs ``benchmarks/SCRIPT.py --quick``; checks its summary line (with
    figures, if `measured`) and that it cleaned up."""
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / f"{script}.py"), "--quick", "--dir", str(tmp_path), *options],
        capture_output=True, text=True, timeout=timeout, env=child_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines and lines[-1].startswith(f"SUMMARY {script}: "), result.stdout[-2000:]
    assert not measured or "x" in lines[-1] or "ms" in lines[-1]
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith("traincontrol-bench-")]
    assert leftovers == []  # the scratch folder (checkpoints, FIFOs, runs) is gone
    return result


@pytest.mark.parametrize("script", ["kernel_background", "kernel_interrupt", "panel_traffic", "kernel_restart_save"])
def test_kernel_benchmark_quick_run_prints_its_summary(script):
    """The benchmarks that drive a real kernel (%%interruptible_fit), as smoke runs."""
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / f"{script}.py"), "--quick"],
        capture_output=True, text=True, timeout=240, env=child_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines and lines[-1].startswith(f"SUMMARY {script}: "), result.stdout[-2000:]
