"""Every figure that needs a GPU, in one short run: each backend in its own process.

Device time on a GPU machine is counted in minutes, so one run prints all
of these, each beside its baseline or peer, measured alternating in one
process per backend:

1. Step overhead (``overhead``): `fit` with `ControlCallback` against a
   plain `fit` (``verbose=0``) for MLPs widened until a plain step takes
   about 1, 5 and 20 ms on the device (``--steps``); whole-fit ratios,
   medians of alternating rounds. On a GPU this is where a forced host
   sync per step would show (the host waiting for each step's loss
   instead of queuing the next).
2. Stop latency (``stop``): ``stop`` written into the run's FIFO at a
   random moment of a `fit` with 5 ms steps, until `fit` has returned (its
   checkpoint on disk); and the part beyond the batch in flight.
3. Save hold (``saves``) at 1 and 10 GB (a one-layer Adam model: weights
   and two moments): the training thread held by a plain ``model.save``,
   by our ``save`` command and by the backend's async peer (TensorFlow's
   async ``tf.train.Checkpoint``, JAX's Orbax ``CheckpointManager``,
   PyTorch's Distributed Checkpoint ``async_save``), with the step after
   each save and the steps during the write (`checkpoint_peers`), keeping
   one checkpoint each. 10 GB needs about 40 GB of host memory and 30 GB
   of disk at a time: a size whose disk is not free is skipped, with a
   line that says so.

A lease is minutes, so ``--budget-s`` bounds a process: a part, step time
(``--steps``) or size that would start after it is skipped with a line
that says so, and everything measured until then is printed as it comes.
``--backend all`` measures each backend that is installed (a GPU machine
may lack TensorFlow's GPU build), saying which it skipped.

Never run in CI (``--quick`` is a smoke run on CPU: tiny steps, 1 MB).
Needs the GPU builds (``tensorflow[and-cuda]``, ``jax[cuda12]``, a CUDA
torch) and ``orbax-checkpoint``; put the figures in the README with the
date and the device.

Usage::

    python benchmarks/gpu.py                              # every installed backend
    python benchmarks/gpu.py --backend jax --sizes 1      # one backend, 1 GB saves only
    python benchmarks/gpu.py --parts saves --sizes 10 --budget-s 240
    python benchmarks/gpu.py --backend jax --parts overhead --steps 5
    python benchmarks/gpu.py --quick                      # a smoke run on CPU (seconds)
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

BACKENDS = ("tensorflow", "jax", "torch")
PARTS = ("overhead", "stop", "saves")
FEATURES, BATCH_SIZE = 256, 256


def device_name() -> str:
    """The accelerator this process trains on, in words."""
    import keras

    if keras.backend.backend() == "jax":
        import jax

        device = jax.devices()[0]
        return f"{device.platform}: {getattr(device, 'device_kind', device)}"
    if keras.backend.backend() == "torch":
        import torch

        return f"gpu: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "cpu"
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return f"gpu: {tf.config.experimental.get_device_details(tf.config.list_physical_devices('GPU')[0]).get('device_name', gpus[0].name)}" if gpus else "cpu"


#: The widest MLP tried: 4 layers of 24576 units are 2.4e9 weights, about 40 GB with Adam's moments and
#: the gradients (the one before it may not be freed yet).
MOST_WIDTH = 24576
#: Batches a width's step is timed on, while searching.
SEARCH_BATCHES = 40
#: Step ms to the width found for it in this process: a search starts from
#: the width found for it, or for the longest shorter step (else 256 units).
WIDTHS: dict[float, int] = {}


def model_for_step(step_ms: float, x, y, seed: int, quick: bool):
    """An MLP widened (by 1.4-2x at a time) until a plain step takes `step_ms`; with its step time."""
    shorter = [found for shorter_ms, found in WIDTHS.items() if shorter_ms < step_ms]
    width = 64 if quick else WIDTHS.get(step_ms) or max(shorter, default=256)
    x, y = x[:SEARCH_BATCHES * BATCH_SIZE], y[:SEARCH_BATCHES * BATCH_SIZE]
    while True:
        started = time.perf_counter()
        model = _common.dense_model(FEATURES, [width] * 4, seed=seed)
        model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0)  # compile once
        begin = time.perf_counter()
        model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, shuffle=False, verbose=0)
        step = (time.perf_counter() - begin) / (len(x) // BATCH_SIZE)
        # Said as it goes: where a lease's minutes went, even if the run is cut short.
        print(f"  (for {step_ms:g} ms steps: {width} units, {step * 1e3:.2f} ms a step; built, compiled and timed "
              f"in {time.perf_counter() - started:.1f} s)", flush=True)
        if quick or step * 1e3 >= 0.8 * step_ms or width >= MOST_WIDTH:
            WIDTHS[step_ms] = width
            return model, step
        width = min(MOST_WIDTH, int(width * max(1.4, min(2.0, (step_ms / (step * 1e3)) ** 0.5))))


def step_overhead(folder: Path, rounds: int, quick: bool, seed: int, budget: "Budget",
                  steps_ms=(1.0, 5.0, 20.0)) -> list[list]:
    """Whole-fit time with `ControlCallback` over plain, at each of `steps_ms` (those `budget` allows)."""
    import numpy as np

    from jupyter_traincontrol import ControlCallback

    batches = 20 if quick else 200
    rng = np.random.default_rng(seed)
    x = rng.random((batches * BATCH_SIZE, FEATURES), dtype="float32")
    y = x.sum(axis=1, keepdims=True)
    rows = []
    for step_ms in steps_ms:
        if not budget.allows(f"step overhead at {step_ms:g} ms steps"):
            break
        model, step = model_for_step(step_ms, x, y, seed, quick)
        control = ControlCallback(save_at_end=False, name=f"gpu-{step_ms:g}", checkpoint_dir=folder / f"ck-{step_ms:g}", verbose=False,
                                  handle_sigint=False)

        def fit(callbacks):
            def run():
                begin = time.perf_counter()
                model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
                return time.perf_counter() - begin
            return run

        times = _common.alternate({"plain": fit([]), "control": fit([control])}, rounds, label=f"{step_ms:g} ms steps")
        ratio = _common.median(_common.paired_ratios(times, "plain")["control"])
        rows.append([f"{step_ms:g} ms", step * 1e3, _common.median(times["plain"]) / batches * 1e3,
                     _common.median(times["control"]) / batches * 1e3, ratio])
        print(f"  ({step_ms:g} ms steps: control / plain {ratio:.3f}x)", flush=True)
    return rows


def stop_latency(folder: Path, stops: int, quick: bool, seed: int) -> list[float]:
    """Seconds from ``stop`` written into the FIFO to `fit` returned (checkpoint on disk), and the batch time."""
    import numpy as np

    from jupyter_traincontrol import ControlCallback
    from jupyter_traincontrol.transport.channels import deliver

    rng = np.random.default_rng(seed)
    x = rng.random((40 * BATCH_SIZE, FEATURES), dtype="float32")
    y = x.sum(axis=1, keepdims=True)
    model, step = model_for_step(5, x, y, seed, quick)
    pick = random.Random(seed)
    latencies = []
    for index in range(stops):
        control = ControlCallback(save_at_end=False, name=f"gpu-stop-{index}", checkpoint_dir=folder / f"stop-{index}", verbose=False,
                                  handle_sigint=False)
        sent = {}

        def sender():
            time.sleep(pick.uniform(0.5, 1.5) if not quick else 0.3)
            sent["at"] = time.perf_counter()
            deliver(control.fifo, "stop")

        thread = threading.Thread(target=sender, name="bench-stop")

        class Start(__import__("keras").callbacks.Callback):
            def on_train_begin(self, logs=None):
                thread.start()

        model.fit(x, y, batch_size=BATCH_SIZE, epochs=10_000, verbose=0, callbacks=[control, Start()])
        latencies.append(time.perf_counter() - sent["at"])
        thread.join()
        assert control.state == "stopped", control.state
    return latencies, step


class Budget:
    """The seconds this process may still start work in (``--budget-s``; None: no limit)."""

    def __init__(self, seconds: float | None):
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def allows(self, what: str) -> bool:
        """Whether `what` may start now; if not, says it is skipped."""
        if self.deadline is None or time.monotonic() < self.deadline:
            return True
        print(f"\n(skipped: {what}, the --budget-s is spent)", flush=True)
        return False


def disk_allows(folder: Path, megabytes: float) -> bool:
    """Whether `folder`'s disk has room for the saves of one size (4.5 files at a time); if not, says so."""
    free = shutil.disk_usage(folder).free
    if free >= 4.5 * megabytes * 1e6:
        return True
    print(f"\n(skipped: saves of {megabytes / 1000:g} GB, {free / 1e9:.1f} GB free on the disk of {folder}; "
          f"they need about {4.5 * megabytes / 1000:g} GB)", flush=True)
    return False


def save_holds(scratch: Path, args, budget: Budget, summary: list[str]) -> None:
    """Part 3: the save hold of each size against ``model.save``, then beside the backend's async peer."""
    import checkpoint_cost
    import checkpoint_peers

    sizes = [size * 1000.0 for size in args.sizes] if not args.quick else [1.0]
    for megabytes in sizes:
        if not budget.allows(f"saves of {megabytes / 1000:g} GB") or not disk_allows(scratch, megabytes):
            continue
        model = checkpoint_cost.model_with_file_size(megabytes, seed=args.seed)
        folder = scratch / f"hold-{megabytes:g}"
        folder.mkdir()
        times = checkpoint_cost.measure_hold_times(model, folder, args.save_rounds, written_back=False, keep=1)
        shutil.rmtree(folder, ignore_errors=True)
        ratio = _common.median(_common.paired_ratios(times, "model.save")["save command"])
        print(f"\n3. Save hold against model.save (overwriting one file), training thread held, ms "
              f"({args.save_rounds} rounds):")
        _common.print_table(["file", "model.save", "save command", "ratio"],
                            [[f"{megabytes / 1000:g} GB", _common.median(times["model.save"]) * 1e3,
                              _common.median(times["save command"]) * 1e3, ratio]])
        summary.append(f"{megabytes / 1000:g}GB save {ratio:.3f}x model.save")
        summary.append(checkpoint_peers.report([megabytes], lambda size, seed: model, scratch, args.save_rounds,
                                               False, args.seed, keep=1))
        del model


def run_backend(args) -> int:
    """Every part of this process's backend that its budget and disk allow."""
    os.environ["KERAS_BACKEND"] = args.backend
    _common.prepare_environment()
    import keras

    budget = Budget(args.budget_s)
    print(f"gpu.py on {keras.backend.backend()} (Keras {keras.__version__}), {device_name()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    summary = []
    with _common.scratch_folder(args.dir, "traincontrol-bench-gpu-") as scratch:
        if "overhead" in args.parts and budget.allows("step overhead"):
            rows = step_overhead(scratch, args.rounds, args.quick, args.seed, budget, args.steps)
            print(f"\n1. Step overhead: whole fits of {20 if args.quick else 200} batches, ControlCallback over "
                  f"plain fit (verbose=0), medians of {args.rounds} alternating rounds")
            _common.print_table(["target step", "step ms", "plain ms/batch", "control ms/batch", "control / plain"],
                                rows)
            summary.append("overhead " + ", ".join(f"{r[0]} {r[4]:.3f}x" for r in rows))
        if "stop" in args.parts and budget.allows("stop latency"):
            latencies, step = stop_latency(scratch, 2 if args.quick else 5, args.quick, args.seed)
            latency = _common.median(latencies) * 1e3
            print(f"\n2. Stop: {len(latencies)} stops at random moments, {step * 1e3:.1f} ms steps: write to fit "
                  f"returned {latency:.1f} ms median (max {max(latencies) * 1e3:.1f}); beyond the batch in flight "
                  f"at most {latency - step * 1e3:.1f} ms", flush=True)
            summary.append(f"stop {latency:.0f} ms")
        if "saves" in args.parts:
            save_holds(scratch, args, budget, summary)
    _common.print_summary(f"gpu: {keras.backend.backend()}: " + ("; ".join(summary) or "nothing measured"))
    return 0


def installed(backends) -> list[str]:
    """The backends of `backends` whose package imports here; says which are skipped."""
    found = [name for name in backends if importlib.util.find_spec(name) is not None]
    for name in sorted(set(backends) - set(found)):
        print(f"(skipped: backend {name}, its package is not installed)", flush=True)
    return found


def comma_list(kind, choices=None):
    """An argparse type: a comma-separated list of `kind`, each among `choices` if given."""
    def parse(text: str) -> list:
        values = [kind(part) for part in text.split(",") if part]
        wrong = [value for value in values if choices is not None and value not in choices]
        if not values or wrong:
            raise ValueError(text)
        return values
    parse.__name__ = "a comma-separated list" + (f" of {', '.join(choices)}" if choices else "")
    return parse


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _common.make_parser(__doc__, rounds=5, quick_rounds=2)
    parser.add_argument("--backend", choices=[*BACKENDS, "all"], default="all",
                        help="the backend to measure; all: each installed one in its own process (default all)")
    parser.add_argument("--parts", type=comma_list(str, PARTS), default=list(PARTS),
                        help=f"what to measure, comma-separated (default {','.join(PARTS)})")
    parser.add_argument("--steps", type=comma_list(float), default=[1.0, 5.0, 20.0],
                        help="plain step times in ms the overhead is measured at, comma-separated (default 1,5,20)")
    parser.add_argument("--sizes", type=comma_list(float), default=[1.0, 10.0],
                        help="file sizes of the saves in GB, comma-separated (default 1,10)")
    parser.add_argument("--save-rounds", type=int, default=None, help="measured saves per variant and size (default 2)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds after which a process starts no new part or size (default: no limit)")
    args = _common.parse_args(parser, argv)
    args.save_rounds = args.save_rounds or (1 if args.quick else 2)
    if args.backend != "all":
        return run_backend(args)
    summaries = _common.run_per_backend(__file__, argv, installed(BACKENDS))
    if isinstance(summaries, int):
        return summaries
    _common.print_summary("gpu: " + " | ".join(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
