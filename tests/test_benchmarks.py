"""Each benchmark runs as a smoke test (``--quick``) and ends with its summary line.

These are not timed tests: the figures are not checked here (this machine
is shared and noisy); `benchmarks/README.md` holds the measured ones.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from helpers import REPO, child_env


@pytest.mark.parametrize("script", [
    "overhead", "latency", "checkpoint_cost", "rest_api",
    # A 2-process JAX job (jax is in the test extra).
    pytest.param("distributed", marks=pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs jax")),
])
def test_benchmark_quick_run_prints_its_summary(script, tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / f"{script}.py"), "--quick", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines and lines[-1].startswith(f"SUMMARY {script}: "), result.stdout[-2000:]
    assert "x" in lines[-1] or "ms" in lines[-1]
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith("traincontrol-bench-")]
    assert leftovers == []  # the scratch folder (checkpoints, FIFOs, runs) is gone


@pytest.mark.parametrize("script", ["kernel_background", "kernel_interrupt", "panel_traffic"])
def test_kernel_benchmark_quick_run_prints_its_summary(script):
    """The benchmarks that drive a real kernel (%%interruptible_fit), as smoke runs."""
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / f"{script}.py"), "--quick"],
        capture_output=True, text=True, timeout=240, env=child_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines and lines[-1].startswith(f"SUMMARY {script}: "), result.stdout[-2000:]
