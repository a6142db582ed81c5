"""Kernel restart during a run: the largest model whose checkpoint makes it to disk.

Restarting a kernel (Kernel > Restart, ``KernelManager.restart_kernel()``)
interrupts it, asks it to shut down, sends SIGTERM after half of
jupyter_client's ``shutdown_wait_time`` (5 s by default) and SIGKILL at
the end of it. The extension stops active runs first: the run's ``stop``
checkpoint, of the batch in flight, must be on disk before the kernel dies.

For each size (MB of ``.keras`` file: one Dense layer trained with Adam, as
in `checkpoint_cost.py`), a fresh kernel builds the model, starts
``%%interruptible_fit`` (batches of about 50 ms) and, once it trains, is
restarted. Then the checkpoint folder is read: a checkpoint counts only if
it is listed with its sidecar (reason ``stop`` or ``interrupt``) and the
restarted kernel loads it with `keras.models.load_model`, with the same
number of parameters. Per size it prints the time from the restart request
to the sidecar on disk and to the old kernel's exit, how jupyter_client ended the old kernel (it exited,
SIGTERM or SIGKILL), and whether the checkpoint is complete; the summary
gives the largest size that made it.

Usage::

    python benchmarks/kernel_restart_save.py                      # 50, 200, 500, 1000 MB
    python benchmarks/kernel_restart_save.py --sizes 500,1000,1500
    python benchmarks/kernel_restart_save.py --sizes 1000,2000 --shutdown-wait-time 20   # a server configured for it
    python benchmarks/kernel_restart_save.py --quick              # 1 MB (a smoke run)
"""

from __future__ import annotations

import math
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))
import _common  # noqa: E402

_common.prepare_environment()
from notebook_runner import KernelSession  # noqa: E402

SETUP = """
import time, numpy as np, keras
%load_ext jupyter_traincontrol
import jupyter_traincontrol
keras.utils.set_random_seed(0)
units = {units}
model = keras.Sequential([keras.Input((units,)), keras.layers.Dense(units, use_bias=False)])
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
x = np.zeros((64, units), "float32")
model.fit(x[:1], x[:1], batch_size=1, epochs=1, verbose=0)
class Pace(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None): time.sleep(0.05)
"""
CELL = "%%interruptible_fit --name restart --checkpoint-dir {folder}\nmodel.fit(x, x, batch_size=1, epochs=100000, callbacks=[Pace()])\n"
CHECK = """
import json, keras
from jupyter_traincontrol.checkpoint import CheckpointStore
with CheckpointStore({folder!r}, keep=3, run="restart") as _store:
    _listed = [(str(c.path), c.info.get("reason")) for c in _store.list()]
_params = keras.models.load_model(_listed[-1][0]).count_params() if _listed else None
print(json.dumps([_listed, _params]))
"""


def units_for(megabytes: float) -> int:
    """Units of the square Dense kernel whose file (weights + two Adam moments) has about `megabytes` MB."""
    return max(8, round(math.sqrt(megabytes * 1e6 / (3 * 4))))


def _running(pid: int) -> bool:
    """True while process `pid` runs (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _watch(folder: Path, pid: int, stop: threading.Event, found: dict) -> None:
    """Notes when the first sidecar appears in `folder` and when `pid` exits."""
    while not stop.is_set() and ("sidecar" not in found or "exit" not in found):
        now = time.perf_counter()
        if "sidecar" not in found and any(folder.glob("ckpt-*.json")):
            found["sidecar"] = now
        if "exit" not in found and not _running(pid):
            found["exit"] = now
        time.sleep(0.002)


def restart_during_run(scratch: Path, megabytes: float, wait_time: float | None = None) -> dict:
    """One kernel, one run of a model of `megabytes`, one restart; what was left on disk.

    Args:
        scratch: Folder for the kernel's files.
        megabytes: The checkpoint's size.
        wait_time: jupyter_client's ``shutdown_wait_time`` (None: its
            default, 5 s); the kernel's ``TrainControlMagics.shutdown_grace``
            is set half a second below it.
    """
    folder = scratch / f"ckpt-{megabytes:g}MB"
    units = units_for(megabytes)
    kernel = KernelSession(scratch, {"JUPYTER_RUNTIME_DIR": str(scratch / "runtime")})
    result = {"size": megabytes, "file MB": units * units * 3 * 4 / 1e6}
    try:
        setup = kernel.execute(SETUP.format(units=units), timeout=600)
        if setup.status != "ok":
            raise RuntimeError(f"setup failed: {setup.ename}: {setup.evalue}")
        if wait_time is not None:
            kernel.km.shutdown_wait_time = wait_time
            kernel.execute(f"%config TrainControlMagics.shutdown_grace = {wait_time - 0.5}")
        kernel.execute(CELL.format(folder=folder))
        kernel.wait_for("jupyter_traincontrol.runs()[-1].lifecycle.progress.step > 1", timeout=120, interval=0.05)
        stop, found = threading.Event(), {}
        pid = kernel.km.provisioner.process.pid
        watcher = threading.Thread(target=_watch, args=(folder, pid, stop, found), daemon=True)
        watcher.start()
        started = time.perf_counter()
        kernel.km.restart_kernel(now=False)
        stop.set()
        watcher.join()
        status = getattr(kernel.km, "_shutdown_status", None)
        result["ended by"] = {"ShutdownRequest": "exited", "SigtermRequest": "SIGTERM", "SigkillRequest": "SIGKILL"}.get(
            getattr(status, "name", str(status)), str(status))
        result["sidecar s"] = found["sidecar"] - started if "sidecar" in found else math.nan
        result["exit s"] = found["exit"] - started if "exit" in found else math.nan
        kernel.kc.wait_for_ready(timeout=90)
        check = kernel.execute(CHECK.format(folder=str(folder)), timeout=600)
        if check.status != "ok":
            result["complete"] = f"no ({check.ename}: {check.evalue})"
        else:
            import json

            listed, params = json.loads(check.stdout.strip().splitlines()[-1])
            ok = bool(listed) and listed[-1][1] in ("stop", "interrupt") and params == units * units
            result["complete"] = "yes" if ok else f"no ({len(listed)} listed, {params} parameters)"
    finally:
        kernel.shutdown()
    return result


def main(argv=None) -> int:
    parser = _common.make_parser(__doc__, rounds=1, quick_rounds=1)
    parser.add_argument("--sizes", default="50,200,500,1000", help="checkpoint sizes in MB, comma-separated (default 50,200,500,1000)")
    parser.add_argument("--shutdown-wait-time", type=float, default=None,
                        help="jupyter_client's KernelManager.shutdown_wait_time (default its own, 5 s); the kernel's "
                             "TrainControlMagics.shutdown_grace is set 0.5 s below it")
    args = _common.parse_args(parser, argv)
    sizes = [1.0] if args.quick else [float(s) for s in args.sizes.split(",")]
    rows, made_it = [], []
    with _common.scratch_folder(args.dir, "traincontrol-bench-restart-") as scratch:
        print(f"kernel_restart_save: one kernel restart during a run per size; in {scratch}", flush=True)
        for megabytes in sizes:
            result = restart_during_run(scratch, megabytes, args.shutdown_wait_time)
            rows.append([f"{result['file MB']:.0f} MB", result["sidecar s"] * 1e3, result["exit s"] * 1e3, result["ended by"],
                         result["complete"]])
            print(f"  {rows[-1]}", flush=True)
            if result["complete"] == "yes":
                made_it.append(result["file MB"])
    print("\nKernel restarted (restart_kernel(now=False)) while the run trained: restart request -> sidecar on disk and\n"
          "-> old kernel process gone (ms), how jupyter_client ended the old kernel, and whether the checkpoint is listed and loads.")
    _common.print_table(["file", "sidecar ms", "exit ms", "old kernel", "checkpoint complete"], rows)
    largest = f"{max(made_it):.0f} MB" if made_it else "none"
    wait = f"{args.shutdown_wait_time:g} s" if args.shutdown_wait_time is not None else "default (5 s)"
    _common.print_summary(f"kernel_restart_save: largest checkpoint complete after a restart = {largest} "
                          f"(of {', '.join(f'{r[0]}' for r in rows)}; shutdown_wait_time {wait})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
