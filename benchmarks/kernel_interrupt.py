"""Kernel interrupt latency: from `interrupt_kernel()` to the checkpoint on disk.

Usage: python benchmarks/kernel_interrupt.py [--repeats 10] [--quick]

In a real kernel, a ``%%interruptible_fit`` run trains with batches of about
1 ms and of about 100 ms; at a random moment the benchmark calls
`KernelManager.interrupt_kernel()` (the toolbar's Interrupt) and watches the
checkpoint folder until the checkpoint's sidecar appears. It prints the
median, 95th percentile and maximum, and the latency minus the batch time
(the goal: within the rest of the current batch plus 20 ms).
"""

from __future__ import annotations

import argparse
import shutil
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))
from notebook_runner import KernelSession  # noqa: E402
from _common import percentile  # noqa: E402

SETUP = """
import time, numpy as np, keras
%load_ext jupyter_traincontrol
import jupyter_traincontrol
x = np.random.default_rng(0).random((4096, 32), dtype="float32"); y = x.sum(1, keepdims=True)
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
model.compile("adam", "mse")
class Pace(keras.callbacks.Callback):
    def __init__(self, seconds): super().__init__(); self.seconds = seconds
    def on_train_batch_begin(self, batch, logs=None):
        if self.seconds: time.sleep(self.seconds)
model.fit(x, y, batch_size=32, epochs=1, verbose=0)
"""
CELL = "%%interruptible_fit --name {name} --checkpoint-dir {folder}\nmodel.fit(x, y, batch_size=32, epochs=1000, callbacks=[Pace({pace})])\n"


def measure(kernel: KernelSession, workdir: Path, name: str, pace: float, rng: random.Random) -> float:
    folder = workdir / name
    kernel.execute(CELL.format(name=name, folder=folder, pace=pace))
    kernel.wait_for("jupyter_traincontrol.runs()[-1].lifecycle.progress.step > 0", timeout=60, interval=0.05)
    time.sleep(rng.uniform(0.2, 0.6))
    started = time.perf_counter()
    kernel.interrupt()
    while not any(folder.glob("ckpt-*.json")):
        time.sleep(0.0005)
    latency = time.perf_counter() - started
    kernel.wait_for("not jupyter_traincontrol.runs()[-1].active", timeout=60, interval=0.05)
    return latency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="interrupts per batch time")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 interrupts per batch time")
    args = parser.parse_args()
    repeats = 2 if args.quick else args.repeats
    rng = random.Random(0)
    workdir = Path(tempfile.mkdtemp(prefix="traincontrol-bench-"))
    kernel = KernelSession(workdir, {"JUPYTER_RUNTIME_DIR": str(workdir / "runtime")})
    latencies: dict[float, list[float]] = {0.0: [], 0.1: []}
    try:
        kernel.execute(SETUP, timeout=300)
        for index in range(repeats):  # alternate the batch times
            for pace in latencies:
                latencies[pace].append(measure(kernel, workdir, f"int-{index}-{int(pace * 1000)}", pace, rng))
    finally:
        kernel.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"interrupt_kernel() -> checkpoint sidecar on disk, {repeats} interrupts per batch time (ms)")
    parts = []
    for pace, values in latencies.items():
        batch_ms = pace * 1000 + 1
        ms = [v * 1000 for v in values]
        print(f"  batch ~{batch_ms:5.0f} ms: median {statistics.median(ms):7.1f}  p95 {percentile(ms, 95):7.1f}  max {max(ms):7.1f}"
              f"   minus one batch: max {max(ms) - batch_ms:7.1f}")
        parts.append(f"~{batch_ms:.0f} ms batches median {statistics.median(ms):.1f} ms, max-minus-batch {max(ms) - batch_ms:.1f} ms")
    print("SUMMARY kernel_interrupt: " + "; ".join(parts))


if __name__ == "__main__":
    main()
