"""Background training speed: `%%interruptible_fit` in a real kernel against a plain script.

Usage: python benchmarks/kernel_background.py [--repeats 5] [--epochs 30] [--quick]

The same `fit` (a small model, steps of about 1 ms) runs, alternating, as:

- ``script``: a plain Python process, verbose=0 (the baseline);
- ``thread-verbose``: a plain `threading.Thread` in a kernel, Keras's default
  progress bar on (what people do today to keep the notebook usable);
- ``thread-quiet``: the same thread with verbose=0;
- ``magic``: ``%%interruptible_fit`` in the kernel (the panel replaces the
  progress bar).

It prints the median fit time and the longest gap between two batches of
each, and ends with the ratios. Goal: magic / script at most 1.05, with no
stalls.
"""

from __future__ import annotations

import argparse
import shutil
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))
from notebook_runner import KernelSession  # noqa: E402

SETUP = """
import gc, time, threading, json, numpy as np, keras
_gc_pauses = []
def _gc_timer(phase, info, _started=[0.0], _pauses=_gc_pauses):
    if phase == "start":
        _started[0] = time.perf_counter()
    else:
        _pauses.append((info["generation"], time.perf_counter() - _started[0]))
gc.callbacks.append(_gc_timer)
rng = np.random.default_rng(0)
x = rng.normal(size=({samples}, 256)).astype("float32")
y = rng.normal(size=({samples}, 1)).astype("float32")
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
class Gaps(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.last = time.perf_counter(); self.gaps = []; self.start = self.last
    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter(); self.gaps.append(now - self.last); self.last = now
    def on_train_end(self, logs=None):
        self.total = time.perf_counter() - self.start
def summary(g):
    pauses = [p for _, p in _gc_pauses]; _gc_pauses.clear()
    return json.dumps({{"total": g.total, "max_gap": max(g.gaps[1:]), "stalls": sum(1 for v in g.gaps if v > 0.5),
                        "max_gc": max(pauses, default=0.0)}})
model.fit(x, y, batch_size=32, epochs=1, verbose=0)  # warm up: trace the train function once
"""

FIT = "model.fit(x, y, batch_size=32, epochs={epochs}, verbose={verbose}, callbacks=[g])"

THREAD = """
g = Gaps()
_t = threading.Thread(target=lambda: """ + FIT + """)
_t.start(); _t.join()
print(summary(g))
"""

MAGIC_START = "g = Gaps()\n"
# --wait keeps the cell busy until the run ends, as the thread variants' join() does.
MAGIC = "%%interruptible_fit --name bench-{index} --wait\n" + FIT + "\n"


def run_script(setup: str, epochs: int) -> dict:
    code = setup.replace("%load_ext jupyter_traincontrol", "") + "\ng = Gaps()\n" + FIT.format(epochs=epochs, verbose=0) + "\nprint(summary(g))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if result.returncode:
        raise RuntimeError(result.stderr)
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_in_kernel(kernel: KernelSession, code: str) -> dict:
    result = kernel.execute(code, timeout=600)
    if result.status != "ok":
        raise RuntimeError(f"{result.ename}: {result.evalue}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_magic(kernel: KernelSession, index: int, epochs: int) -> dict:
    kernel.execute(MAGIC_START)
    result = kernel.execute(MAGIC.format(index=index, epochs=epochs, verbose=0), timeout=600)
    if result.status != "ok":
        raise RuntimeError(f"{result.ename}: {result.evalue}")
    return run_in_kernel(kernel, "print(summary(g))")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 repeat, 2 epochs")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.epochs = 1, 2
    setup = SETUP.format(samples=32 * 40)
    workdir = Path(tempfile.mkdtemp(prefix="traincontrol-bench-"))
    kernel = KernelSession(workdir, {"JUPYTER_RUNTIME_DIR": str(workdir / "runtime")})
    results: dict[str, list[dict]] = {name: [] for name in ("script", "thread-verbose", "thread-quiet", "magic")}
    try:
        kernel.execute(setup + "\n%load_ext jupyter_traincontrol\nimport jupyter_traincontrol\n", timeout=300)
        variants = {
            "script": lambda index: run_script(setup, args.epochs),
            "thread-verbose": lambda index: run_in_kernel(kernel, THREAD.format(epochs=args.epochs, verbose=1)),
            "thread-quiet": lambda index: run_in_kernel(kernel, THREAD.format(epochs=args.epochs, verbose=0)),
            "magic": lambda index: run_magic(kernel, index, args.epochs),
        }
        names = list(variants)
        for index in range(args.repeats):  # alternate the variants, rotating their order, so noise cancels
            for name in names[index % 4:] + names[: index % 4]:
                results[name].append(variants[name](index))
    finally:
        kernel.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"fit of {args.epochs} epochs x 40 batches, {args.repeats} alternating repeats "
          "(median seconds; longest gap between batches and longest garbage-collector pause over all repeats)")
    medians = {}
    for name, runs in results.items():
        medians[name] = statistics.median(r["total"] for r in runs)
        print(f"  {name:15s} {medians[name]:7.3f} s   longest gap {max(r['max_gap'] for r in runs) * 1000:7.1f} ms   "
              f"gaps > 0.5 s: {sum(r['stalls'] for r in runs)}   longest GC pause {max(r['max_gc'] for r in runs) * 1000:6.1f} ms")
    print(
        "SUMMARY kernel_background: "
        f"magic/script {medians['magic'] / medians['script']:.3f}x, "
        f"thread-verbose/script {medians['thread-verbose'] / medians['script']:.3f}x, "
        f"thread-quiet/script {medians['thread-quiet'] / medians['script']:.3f}x; "
        f"longest gap with magic {max(r['max_gap'] for r in results['magic']) * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
