"""Panel traffic: widget messages and bytes sent to the front end during a run.

Usage: python benchmarks/panel_traffic.py [--batches 10000] [--quick]

In a real kernel, a ``%%interruptible_fit`` run of many fast batches is
watched from the client side: every ``comm_msg`` on IOPub is counted with
its size. Two batch rates are compared (as fast as possible, and about
1 ms a batch). Goal: about 5 panel updates a second, whatever the rate.
"""

from __future__ import annotations

import argparse
import shutil
import json
import queue
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))
from notebook_runner import KernelSession  # noqa: E402

SETUP = """
import time, numpy as np, keras
%load_ext jupyter_traincontrol
import jupyter_traincontrol
x = np.random.default_rng(0).random((1000, 4), dtype="float32"); y = x.sum(1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
class Pace(keras.callbacks.Callback):
    def __init__(self, seconds): super().__init__(); self.seconds = seconds
    def on_train_batch_begin(self, batch, logs=None):
        if self.seconds: time.sleep(self.seconds)
model.fit(x, y, batch_size=10, epochs=1, verbose=0)
"""
CELL = "%%interruptible_fit --name {name}\nmodel.fit(x, y, batch_size=10, epochs={epochs}, callbacks=[Pace({pace})])\n"


def watch(kernel: KernelSession, name: str, epochs: int, pace: float) -> dict:
    kernel.kc.execute(CELL.format(name=name, epochs=epochs, pace=pace))
    messages = 0
    size = 0
    ended = False
    while not ended:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=1.0)
        except queue.Empty:
            ended = not kernel.value("jupyter_traincontrol.runs()[-1].active")
            continue
        if msg["msg_type"] == "comm_msg":
            messages += 1
            size += len(json.dumps(msg["content"]))
    duration = kernel.value("jupyter_traincontrol.runs()[-1].lifecycle.ended - jupyter_traincontrol.runs()[-1].lifecycle.started")
    updates = kernel.value("jupyter_traincontrol.runs()[-1].panel.updates")
    return {"duration": duration, "messages": messages, "bytes": size, "updates": updates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=10000)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1,000 batches")
    args = parser.parse_args()
    batches = 1000 if args.quick else args.batches
    epochs = max(1, batches // 100)  # 100 batches an epoch
    workdir = Path(tempfile.mkdtemp(prefix="traincontrol-bench-"))
    kernel = KernelSession(workdir, {"JUPYTER_RUNTIME_DIR": str(workdir / "runtime")})
    rows = {}
    try:
        kernel.execute(SETUP, timeout=300)
        for label, pace in (("fastest", 0.0), ("~1 ms", 0.001)):
            rows[label] = watch(kernel, f"traffic-{pace}", epochs, pace)
    finally:
        kernel.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{epochs * 100} batches per run; what the front end receives")
    for label, row in rows.items():
        rate = batches / row["duration"]
        print(f"  {label:8s} {row['duration']:6.1f} s, {rate:7.0f} batches/s: {row['updates'] / row['duration']:4.1f} panel redraws/s, "
              f"{row['messages'] / row['duration']:5.1f} comm messages/s, {row['bytes'] / row['duration'] / 1024:5.1f} KiB/s, {row['bytes'] / 1024:7.1f} KiB in all")
    print("SUMMARY panel_traffic: " + "; ".join(
        f"{label}: {row['messages'] / row['duration']:.1f} msgs/s, {row['bytes'] / row['duration'] / 1024:.1f} KiB/s" for label, row in rows.items()))


if __name__ == "__main__":
    main()
