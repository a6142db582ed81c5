"""A headless tour: train in one process, control it from "another terminal".

Run with ``make demo``. It starts examples/train_with_control.py in a child
process, then drives it with the real ``jupyter-traincontrol`` CLI and a
plain ``echo pause > FIFO``, stops it with a checkpoint, and resumes from
that checkpoint in a fresh process. Every command it runs is printed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLI = str(Path(sys.executable).parent / "jupyter-traincontrol")


def shell(*args: str) -> str:
    print(f"$ {shlex.join(args)}", flush=True)
    result = subprocess.run(args, capture_output=True, text=True)
    output = (result.stdout + result.stderr).rstrip()
    if output:
        print("  " + output.replace("\n", "\n  "), flush=True)
    return result.stdout


def record(name: str) -> dict:
    runs = json.loads(subprocess.run([CLI, "list", "--json"], capture_output=True, text=True).stdout)
    return next(run for run in runs if run["name"] == name)


def start_training(*args: str) -> subprocess.Popen:
    print(f"$ python examples/train_with_control.py {' '.join(args)} &", flush=True)
    child = subprocess.Popen(
        [sys.executable, str(HERE / "train_with_control.py"), *args],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    for line in child.stdout:
        if line.startswith("READY"):
            return child
    raise SystemExit("The training script ended before training began.")


def finish(child: subprocess.Popen) -> dict:
    out, _ = child.communicate(timeout=300)
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"The training script printed no result:\n{out}")


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="traincontrol-demo-"))
    os.environ["JUPYTER_RUNTIME_DIR"] = str(workdir / "runtime")  # keep the demo's runs to itself
    checkpoints = str(workdir / "checkpoints")
    try:
        print("== 1. Train in the background (a script with ControlCallback)")
        child = start_training("--name", "demo", "--checkpoint-dir", checkpoints, "--epochs", "40")
        time.sleep(1.0)
        shell(CLI, "list")

        print("\n== 2. Pause it with plain echo into its FIFO, then look")
        fifo = record("demo")["fifo"]
        shell("sh", "-c", f"echo pause > {fifo}")
        time.sleep(1.0)
        shell(CLI, "list")

        print("\n== 3. Save while paused, then resume")
        shell(CLI, "send", "demo", "save", "--wait", "30")
        shell(CLI, "send", "demo", "resume", "--wait", "30")
        time.sleep(1.0)

        print("\n== 4. Stop: a checkpoint, then fit ends gracefully")
        shell(CLI, "send", "demo", "stop")
        stopped = finish(child)
        sidecar = json.loads(Path(stopped["checkpoints"][-1]).with_suffix(".json").read_text())
        print(f"state: {stopped['state']}")
        print(f"History.epoch: {stopped['epochs']}")
        print(f"checkpoint: {stopped['checkpoints'][-1]}")
        print(f"  epoch {sidecar['epoch'] + 1}, batch {sidecar['step_in_epoch']}, optimizer step {sidecar['global_step']}")

        print("\n== 5. Resume in a fresh process: it continues where it stopped")
        child = start_training("--name", "demo", "--checkpoint-dir", checkpoints, "--epochs", str(sidecar["resume_epoch"] + 2), "--resume", "--batch-sleep", "0")
        resumed = finish(child)
        print(f"state: {resumed['state']}")
        print(f"History.epoch: {resumed['epochs']} (starts at the checkpoint's epoch, not 0)")
        print(f"optimizer step: {sidecar['global_step']} at the checkpoint -> {resumed['optimizer_step']} now")
        assert resumed["epochs"][0] == sidecar["resume_epoch"], "resume did not continue the epoch"
        assert resumed["optimizer_step"] > sidecar["global_step"], "resume did not continue the optimizer"
        print("\nDemo complete.")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
