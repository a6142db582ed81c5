"""What autosave costs a long `fit`: at its default interval, and at a short one, beside no autosave.

A `fit` of a fixed number of batches (an MLP of about 2 MB of weights, so
with Adam's slots a checkpoint is about 7 MB) is trained four ways,
alternating round after round in one process:

- ``off``: ``ControlCallback(autosave=0)``;
- ``default``: ``ControlCallback()``: autosave every 600 s of training (a
  fit shorter than that writes none: what it pays is the clock the run's
  thread keeps, and nothing per batch);
- ``short``: ``ControlCallback(autosave=--short-interval)`` (5 s by
  default), the figure printed beside the default's;
- ``frequent``: an autosave every ``--frequent-interval`` (0.5 s), so many
  that their cost stands out of this shared machine's noise.

Each fit is measured in wall time and in CPU time of the process (all its
threads: the writer's too). Reported per backend: the medians of the
per-round ratios to ``off``; the autosaves a fit wrote; what one autosave
cost, ``(frequent - off) / autosaves`` in wall and CPU seconds; and from it
the cost at the default interval, ``1 + that / 600 s`` (the goal: at most
1.01x).

``--backend all`` (the default) measures each backend in its own
subprocess and ends with one summary of all three.

Usage::

    python benchmarks/autosave_cost.py                    # each backend: 5 rounds of 12 s fits
    python benchmarks/autosave_cost.py --backend jax --rounds 9
    python benchmarks/autosave_cost.py --quick            # 1 round of 2 s fits
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

_common.prepare_environment()

BACKENDS = ("tensorflow", "jax", "torch")
GOAL_RATIO = 1.01
DEFAULT_INTERVAL = 600.0
FEATURES, WIDTH, BATCH_SIZE = 64, 512, 64


def main(argv=None) -> int:
    parser = _common.make_parser(__doc__, rounds=5, quick_rounds=1)
    parser.add_argument("--backend", choices=[*BACKENDS, "all"], default="all",
                        help="the Keras backend to measure; all: each in its own subprocess (default all)")
    parser.add_argument("--fit-seconds", type=float, default=12.0, help="how long a plain fit trains (default 12)")
    parser.add_argument("--short-interval", type=float, default=5.0, help="the short autosave interval (default 5 s)")
    parser.add_argument("--frequent-interval", type=float, default=0.5,
                        help="the interval that measures one autosave's cost (default 0.5 s)")
    args = _common.parse_args(parser, argv)
    if args.quick:
        args.fit_seconds, args.short_interval = 2.0, 1.0
    if args.backend == "all":
        return measure_all(sys.argv[1:] if argv is None else list(argv))
    return measure(args)


def measure_all(argv: list[str]) -> int:
    summaries = _common.run_per_backend(__file__, argv, BACKENDS)
    if isinstance(summaries, int):
        return summaries
    parts = []
    for backend, summary in zip(BACKENDS, summaries):
        derived = re.search(r"at the default 600 s: ([0-9.]+)x wall, ([0-9.]+)x CPU", summary)
        short = re.search(r"every ([0-9.]+) s: ([0-9.]+)x", summary)
        default = re.search(r"default, none due: ([0-9.]+)x", summary).group(1)
        parts.append(f"{backend} {derived.group(1)}x wall {derived.group(2)}x CPU at 600 s ({default}x measured in "
                     f"fits with none due; {short.group(2)}x with one every {short.group(1)} s)")
    _common.print_summary(f"autosave_cost: {'; '.join(parts)} (goal <= {GOAL_RATIO}x at the default)")
    return 0


def measure(args) -> int:
    os.environ["KERAS_BACKEND"] = args.backend  # before Keras is imported
    if args.backend == "torch" and "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(1)  # as overhead.py: torch's pool makes a small model's steps noisy on 2 cores
    import keras
    import numpy as np

    from jupyter_traincontrol import ControlCallback

    rng = np.random.default_rng(args.seed)
    x = rng.random((BATCH_SIZE * 200, FEATURES), dtype="float32")
    y = x.sum(axis=1, keepdims=True)
    model = _common.dense_model(FEATURES, [WIDTH, WIDTH, WIDTH], seed=args.seed)
    step = _step_seconds(model, x, y)
    epochs = max(1, round(args.fit_seconds / step / 200))  # the data is 200 batches
    weights_mb = sum(int(np.prod(v.shape)) for v in model.weights) * 4 / 1e6
    written: dict[str, list[int]] = {"short": [], "frequent": []}
    cpu: dict[str, list[float]] = {"off": [], "default": [], "short": [], "frequent": []}
    intervals = {"off": 0, "default": DEFAULT_INTERVAL, "short": args.short_interval,
                 "frequent": args.frequent_interval}
    with _common.scratch_folder(args.dir, "traincontrol-bench-autosave-") as scratch:
        def run(name: str):
            def fit_once() -> float:
                control = ControlCallback(name=f"bench-{name}", checkpoint_dir=scratch / name, save_at_end=False,
                                          verbose=False, autosave=intervals[name], keep=1)
                begin, begin_cpu = time.perf_counter(), time.process_time()
                model.fit(x, y, batch_size=BATCH_SIZE, epochs=epochs, shuffle=False, verbose=0, callbacks=[control])
                elapsed = time.perf_counter() - begin
                cpu[name].append(time.process_time() - begin_cpu)
                if name in written:
                    written[name].append(_autosaves(control))
                return elapsed
            return fit_once

        results = _common.alternate({name: run(name) for name in intervals}, args.rounds, label="autosave")
    cpu = {name: values[-args.rounds:] for name, values in cpu.items()}  # the warm-up round's left out
    saves = {name: _common.median(values[-args.rounds:]) for name, values in written.items()}
    ratios, cpu_ratios = _common.paired_ratios(results, "off"), _common.paired_ratios(cpu, "off")
    per_save = _common.median([f - o for f, o in zip(results["frequent"], results["off"])]) / saves["frequent"]
    per_save_cpu = _common.median([f - o for f, o in zip(cpu["frequent"], cpu["off"])]) / saves["frequent"]
    derived, derived_cpu = 1 + per_save / DEFAULT_INTERVAL, 1 + per_save_cpu / DEFAULT_INTERVAL
    off = _common.median(results["off"])
    print(f"autosave cost on {keras.backend.backend()}: {args.rounds} rounds of fits of {epochs * 200} batches "
          f"({step * 1e3:.1f} ms a step, {off:.1f} s plain; {weights_mb:.1f} MB of weights, about 3x that a "
          f"checkpoint with Adam's slots); medians of the per-round ratios to off, wall / CPU")
    print(f"  default (600 s), none due: {_common.median(ratios['default']):.4f}x / "
          f"{_common.median(cpu_ratios['default']):.4f}x")
    for name in ("short", "frequent"):
        print(f"  every {intervals[name]:g} s: {_common.median(ratios[name]):.4f}x / "
              f"{_common.median(cpu_ratios[name]):.4f}x, {saves[name]:g} autosaves a fit")
    print(f"  one autosave: {per_save * 1e3:.0f} ms of fit time, {per_save_cpu * 1e3:.0f} ms of CPU")
    print(f"  at the default 600 s (one such autosave per 600 s of training): {derived:.4f}x wall, "
          f"{derived_cpu:.4f}x CPU")
    _common.print_summary(
        f"autosave_cost: {keras.backend.backend()}: at the default 600 s: {derived:.4f}x wall, {derived_cpu:.4f}x CPU "
        f"(one autosave {per_save * 1e3:.0f} ms); default, none due: {_common.median(ratios['default']):.4f}x; "
        f"every {args.short_interval:g} s: {_common.median(ratios['short']):.4f}x ({saves['short']:g} a fit)")
    return 0


def _step_seconds(model, x, y) -> float:
    """Seconds a plain training step takes (after tracing)."""
    model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0)
    begin = time.perf_counter()
    model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, shuffle=False, verbose=0)
    return (time.perf_counter() - begin) / (len(x) // BATCH_SIZE)


def _autosaves(control) -> int:
    """How many autosaves the run of `control` wrote (its log says each)."""
    events = control.lifecycle.record()["events"]
    return sum(event["kind"] == "checkpoint" and event["message"].startswith("autosave:") for event in events)


if __name__ == "__main__":
    sys.exit(main())
