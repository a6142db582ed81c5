"""What `ControlCallback` costs while nothing is sent: `fit` time against a plain `fit`.

A small MLP whose training step takes about 1 ms (so a per-batch cost shows;
the goal is stated for such steps) is trained with `fit` in four ways,
alternating round after round. Backends differ in speed (the same 32-16-16-1
MLP steps in about 0.3 ms on JAX, 1.2 ms on TensorFlow, 2.5 ms on torch
here), so the hidden layers start 16 wide and double until a plain step
takes at least 80 % of ``--step-ms`` (default 1 ms; 0 keeps 16):

- ``plain``: no callbacks;
- ``ControlCallback``: ours (registry record, FIFO and the run's thread are
  opened and closed in every `fit`, so that cost is included);
- ``naive FIFO``: the common recipe, a callback that opens, reads and closes
  a FIFO after every batch (nobody writes to it);
- ``BackupAndRestore``: Keras's own, backing up at every epoch end.

Each `fit` trains the same number of batches; the whole call is measured,
in wall time and in CPU time of the process (all its threads: TensorFlow's
and the run's thread). CPU time is much less disturbed by other processes
on a shared machine. Reported: medians per variant, and the median of the
per-round ratios to ``plain``.

On a shared machine a few percent of noise remains in those ratios, so the
cost of ``ControlCallback`` is also measured part by part, each free of that
noise:

- per batch: inside a real `fit`, its batch hook (and the naive FIFO
  callback's) is called 20,000 times in a row and timed;
- per `fit`: opening and closing the run (registry record, FIFO, the run's
  thread, SIGINT handler): fits of 2 batches with and without it, alternated;
- in the background: the CPU time the run's thread used during the
  measured fits (from ``/proc/self/task/TID/schedstat``, in nanoseconds).

Their sum, over a plain fit's time, is the estimated overhead.

Every `ControlCallback` here has ``save_at_end=False``: what is measured is
the cost of control, not the checkpoint a finished run writes by default
(code that calls `fit` in a loop passes ``save_at_end=False`` too).

A fifth variant, ``no-op batch hook`` (a callback whose batch-end hook does
nothing and is not async-safe), shows what Keras's synchronous dispatch of
batch-end hooks costs by itself: on JAX and torch, `fit` calls them on a
thread pool unless a callback like this one (or ``ControlCallback``, which
must act between two steps) is in the list.

The Keras backend is fixed when Keras is imported, so ``--backend all`` (the
default) measures each backend in its own subprocess and ends with one
summary of all three. On torch the benchmark uses one intra-op thread unless
``OMP_NUM_THREADS`` says otherwise: on a small shared machine torch's thread
pool makes the steps of this tiny model several times slower and the
rounds far noisier, for every variant alike.

Usage::

    python benchmarks/overhead.py                     # each backend: 15 rounds of 5 epochs x 200 batches
    python benchmarks/overhead.py --backend jax       # one backend
    python benchmarks/overhead.py --quick             # 2 rounds of 1 x 50 batches (a smoke run)
    python benchmarks/overhead.py --short-fits        # what a run costs a 2-batch fit (reused, new, in a with
                                                      # block), then loops of 25 fits with the defaults,
                                                      # then 600 fits with a new unnamed callback each
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

_common.prepare_environment()

GOAL_RATIO = 1.02
SHORT_FIT_GOAL_MS = 1.0  # opening and closing the run, a fit, with a reused callback
LOOP_FITS = 25  # fits in each loop of `default_loops`
UNNAMED_FITS = 600  # fits of `unnamed_growth`: each a new run
FEATURES, BATCH_SIZE = 32, 32
BACKENDS = ("tensorflow", "jax", "torch")


def no_op_batch_hook():
    """A callback whose batch-end hook does nothing (and is not async-safe)."""
    import keras

    class NoOpBatchHook(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    return NoOpBatchHook()


def naive_fifo_callback(path: Path):
    """The common recipe: open, read and close a FIFO after every batch."""
    import keras

    class NaiveFifo(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                data = os.read(fd, 4096)
            finally:
                os.close(fd)
            if b"stop" in data:
                self.model.stop_training = True

    return NaiveFifo()


def keras_dispatches_batch_hooks_async() -> bool:
    """Whether `fit` on this backend may call batch-end hooks on a thread
    pool (Keras: backends marked thread-safe, JAX and torch)."""
    from keras.src import backend

    return bool(getattr(backend, "IS_THREAD_SAFE", False))


def calibrated_model(x, y, step_ms: float, seed: int):
    """The MLP with the narrowest hidden layers (16, 32, ... 2048 wide) whose
    plain step takes at least 80 % of `step_ms`; returns it with its width."""
    width = 16
    while True:
        model = _common.dense_model(FEATURES, [width, width], seed=seed)
        model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0)  # trace the train function once
        if step_ms <= 0 or width >= 2048:
            return model, width
        times = []
        for _ in range(3):
            begin = time.perf_counter()
            model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, shuffle=False, verbose=0)
            times.append(time.perf_counter() - begin)
        if _common.median(times) / (len(x) // BATCH_SIZE) * 1e3 >= 0.8 * step_ms:
            return model, width
        width *= 2


def hook_cost(model, x, y, callbacks: dict, calls: int) -> dict[str, float]:
    """Seconds per call of each callback's `on_train_batch_end`, inside a real fit.

    Args:
        callbacks: Name to a callback; each is part of the fit, so it is set
            up (for `ControlCallback`: registry record, FIFO, the run's thread).
        calls: Calls per callback.
    """
    import keras

    costs = {}

    class Timer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if costs:
                return
            for name, callback in callbacks.items():
                begin = time.perf_counter()
                for index in range(calls):
                    callback.on_train_batch_end(index, logs)
                costs[name] = (time.perf_counter() - begin) / calls

    model.fit(x[:BATCH_SIZE * 2], y[:BATCH_SIZE * 2], batch_size=BATCH_SIZE, epochs=1, verbose=0,
              callbacks=[*callbacks.values(), Timer()])
    return costs


_HOOKS = ("on_train_begin", "on_epoch_begin", "on_train_batch_begin", "on_train_batch_end", "on_epoch_end",
          "on_train_end")


def clock_hooks(callback) -> list[float]:
    """Times every hook `fit` calls on `callback` (on the training thread:
    the one that calls ``on_train_begin``). Returns the list that gets, at
    each ``on_train_end``, the seconds the hooks of that `fit` held it."""
    held, spent = [], [0.0]
    for hook in _HOOKS:
        method = getattr(callback, hook)

        def timed(*args, _method=method, _hook=hook, **kwargs):
            begin = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - begin
                if _hook == "on_train_end":
                    held.append(spent[0])
                    spent[0] = 0.0

        setattr(callback, hook, timed)
    return held


def short_fits(model, x, y, make_fresh, reused, spanning, rounds: int) -> dict[str, float]:
    """Median extra seconds of a 2-batch fit over plain fits (the four
    alternating in one process): with one `ControlCallback` reused for
    every fit (``reused``: a run each fit), with a new one each time
    (``fresh``), and with `spanning` in a with block (``block``: one run
    for every fit); and how long the hooks of the reused callback
    (``held``), of the new ones (``held_fresh``) and of the spanning one
    (``held_block``) held the training thread, a fit's median (free of the
    noise of the fit itself, but not counting what their threads take from
    the training's CPU)."""
    held, held_block, held_fresh = clock_hooks(reused), clock_hooks(spanning), []

    def clocked_fresh():
        callbacks = make_fresh()
        for callback in callbacks:
            held_fresh.append(clock_hooks(callback))  # filled as its fit ends
        return callbacks

    def timed(callbacks):
        def run():
            chosen = callbacks()
            begin = time.perf_counter()
            model.fit(x[:BATCH_SIZE * 2], y[:BATCH_SIZE * 2], batch_size=BATCH_SIZE, epochs=1, verbose=0, callbacks=chosen)
            return time.perf_counter() - begin

        return run

    with spanning:
        times = _common.alternate({"plain": timed(lambda: []), "reused": timed(lambda: [reused]),
                                   "fresh": timed(clocked_fresh), "block": timed(lambda: [spanning])}, rounds,
                                  label="short fits")
    return {name: _common.median([ours - plain for ours, plain in zip(times[name], times["plain"])])
            for name in ("reused", "fresh", "block")} | {"plain": _common.median(times["plain"]),
                                                           "held": _common.median(held),
                                                           "held_fresh": _common.median([sum(one) for one in held_fresh]),
                                                           "held_block": _common.median(held_block)}


def short_fit_words(short: dict[str, float]) -> str:
    """What `short_fits` measured, in one sentence's words."""
    return (f"{short['reused'] * 1e3:.2f} ms a fit with a reused ControlCallback (hooks held {short['held'] * 1e3:.2f} ms), "
            f"{short['fresh'] * 1e3:.2f} ms with a new one each fit (hooks held {short['held_fresh'] * 1e3:.2f} ms), "
            f"{short['block'] * 1e3:.2f} ms in a with block "
            f"(one run for every fit: {short['block'] * 1e3 / SHORT_FIT_GOAL_MS:.2f}x the goal of {SHORT_FIT_GOAL_MS:g} ms; "
            f"hooks held {short['held_block'] * 1e3:.2f} ms)")


def default_loops(model, x, y, scratch: Path, fits: int, rounds: int) -> dict[str, float]:
    """A loop of `fits` 2-batch fits with `ControlCallback`'s defaults
    (``save_at_end`` on), alternating with a plain loop: ``each``, a run
    each fit (each writes its end checkpoint), and ``block``, the loop in
    a with block (one run, one end checkpoint as the block ends). Median
    extra seconds a fit over the plain loop's, and the checkpoints each
    loop wrote."""
    from jupyter_traincontrol import ControlCallback

    written = {}

    def loop(kind: str):
        def run():
            folder = scratch / f"ck-loop-{kind}"
            control = ControlCallback(name=f"bench-loop-{kind}", checkpoint_dir=folder, verbose=False)
            callbacks = [] if kind == "plain" else [control]
            begin = time.perf_counter()
            with control if kind == "block" else contextlib.nullcontext():
                for _ in range(fits):
                    model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0, callbacks=callbacks)
            spent = time.perf_counter() - begin
            written[kind] = len(control.checkpoints)
            shutil.rmtree(folder, ignore_errors=True)  # the next round's loop starts from an empty folder
            return spent / fits

        return run

    times = _common.alternate({kind: loop(kind) for kind in ("plain", "each", "block")}, rounds, label="loops")
    return {kind: _common.median([ours - plain for ours, plain in zip(times[kind], times["plain"])])
            for kind in ("each", "block")} | {f"{kind}_checkpoints": written[kind] for kind in ("each", "block")}


def unnamed_growth(model, x, y, scratch: Path, fits: int) -> tuple[float, float]:
    """`fits` 2-batch fits, each with a new `ControlCallback` given no name
    (each a new run, ``run-N``, whose record stays while the process
    lives): the median seconds a fit of the first tenth and of the last."""
    from jupyter_traincontrol import ControlCallback

    times = []
    for index in range(fits):
        control = ControlCallback(save_at_end=False, checkpoint_dir=scratch / "ck-unnamed" / str(index), verbose=False)
        begin = time.perf_counter()
        model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0, callbacks=[control])
        times.append(time.perf_counter() - begin)
    tenth = max(1, fits // 10)
    return _common.median(times[:tenth]), _common.median(times[-tenth:])


def thread_cpu_seconds(native_id: int) -> float:
    """CPU time a thread of this process has used (Linux schedstat, ns precision)."""
    with open(f"/proc/self/task/{native_id}/schedstat") as handle:
        return int(handle.read().split()[0]) / 1e9


class ReaderCpu:
    """A callback to put *before* `ControlCallback`: at train end (before the
    control callback closes its channel) it adds up the run's thread's CPU."""

    def __new__(cls, run_name: str):
        import threading

        import keras

        class _ReaderCpu(keras.callbacks.Callback):
            total = 0.0

            def on_train_end(self, logs=None):
                for thread in threading.enumerate():
                    if thread.name == f"traincontrol-reader-{run_name}" and os.path.exists("/proc/self/task"):
                        type(self).total += thread_cpu_seconds(thread.native_id)

        return _ReaderCpu()


def main(argv=None) -> int:
    parser = _common.make_parser(__doc__, rounds=15, quick_rounds=2)
    parser.add_argument("--epochs", type=int, default=5, help="epochs per fit (default 5)")
    parser.add_argument("--steps", type=int, default=200, help="batches per epoch (default 200)")
    parser.add_argument("--step-ms", type=float, default=1.0,
                        help="widen the MLP until a plain step takes about this long (default 1; 0: 16 units)")
    parser.add_argument("--backend", choices=[*BACKENDS, "all"], default="all",
                        help="the Keras backend to measure; all: each in its own subprocess (default all)")
    parser.add_argument("--short-rounds", type=int, default=41,
                        help="rounds of the short fits (2 batches; plain, reused and new callback; default 41)")
    parser.add_argument("--short-fits", action="store_true",
                        help="measure only what opening and closing a run costs a short fit (one backend: "
                             "KERAS_BACKEND's, or --backend)")
    parser.add_argument("--loops", action="store_true",
                        help="measure TrainLoop in custom training loops (GradientTape, torch) instead: "
                             "runs loop_overhead.py, passing --quick on")
    args = _common.parse_args(parser, argv)
    if args.loops:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loop_overhead.py")
        return subprocess.call([sys.executable, script, *(["--quick"] if args.quick else [])])
    if args.short_fits:
        if args.backend == "all":
            args.backend = os.environ.get("KERAS_BACKEND", "tensorflow")
        return measure_short_fits(args)
    if args.backend == "all":
        return measure_all(sys.argv[1:] if argv is None else list(argv))
    return measure(args)


def measure_all(argv: list[str]) -> int:
    """Runs this script once per backend, each in a new process, passing its
    output through; ends with one summary line of all backends."""
    summaries = _common.run_per_backend(__file__, argv, BACKENDS)
    if isinstance(summaries, int):
        return summaries
    parts = []
    for backend, summary in zip(BACKENDS, summaries):
        estimate = re.search(r"ControlCallback ([0-9.]+)x part by part", summary)
        whole = re.search(r"whole fits \(wall, CPU\): ControlCallback ([0-9.]+)x ([0-9.]+)x", summary)
        no_op = re.search(r"no-op batch hook ([0-9.]+)x", summary)
        batch = re.search(r"([0-9.]+) ms/batch, hidden ([0-9]+) wide\)", summary)
        parts.append(f"{backend} {estimate.group(1)}x part by part, "
                     f"{whole.group(1)}x wall {whole.group(2)}x CPU whole fits"
                     f" (no-op batch hook {no_op.group(1)}x; {batch.group(1)} ms/batch, hidden {batch.group(2)} wide)")
    _common.print_summary(f"overhead: ControlCallback on {'; '.join(parts)} (goal <= {GOAL_RATIO}x each)")
    return 0


def measure_short_fits(args) -> int:
    """``--short-fits``: many 2-batch fits, plain, with a reused callback and with a new one each fit."""
    os.environ["KERAS_BACKEND"] = args.backend
    import keras
    import numpy as np

    from jupyter_traincontrol import ControlCallback

    rng = np.random.default_rng(args.seed)
    x = rng.random((BATCH_SIZE * 2, FEATURES), dtype="float32")
    y = x.sum(axis=1, keepdims=True)
    model = _common.dense_model(FEATURES, [16, 16], seed=args.seed)
    model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0)
    rounds = 3 if args.quick else args.short_rounds
    with _common.scratch_folder(args.dir, "traincontrol-bench-overhead-") as scratch:
        reused = ControlCallback(save_at_end=False, name="bench-reused", checkpoint_dir=scratch / "ck-reused", verbose=False)
        spanning = ControlCallback(save_at_end=False, name="bench-block", checkpoint_dir=scratch / "ck-block", verbose=False)
        short = short_fits(model, x, y, lambda: [ControlCallback(save_at_end=False, name="bench-fresh", checkpoint_dir=scratch / "ck",
                                                                  verbose=False)], reused, spanning, rounds)
        fits = 4 if args.quick else LOOP_FITS
        loops = default_loops(model, x, y, scratch, fits, 1 if args.quick else 5)
        unnamed = 20 if args.quick else UNNAMED_FITS
        first, last = unnamed_growth(model, x, y, scratch, unnamed)
    print(f"short fits on {keras.backend.backend()}: {rounds} rounds of 2-batch fits (plain {short['plain'] * 1e3:.1f} ms), "
          f"alternating plain, a reused ControlCallback, a new one each fit and one in a with block; medians of the "
          f"paired differences to plain: {short_fit_words(short)}")
    loop_words = (f"a loop of {fits} fits with the defaults (save_at_end on): {loops['each'] * 1e3:.2f} ms a fit over plain "
                  f"with a run each fit (each writes its end checkpoint; {loops['each_checkpoints']} kept), {loops['block'] * 1e3:.2f} ms in a with "
                  f"block ({loops['block_checkpoints']} checkpoint, as the block ends): {loops['block'] / loops['each']:.3f}x")
    print(f"{loop_words} (medians of alternating rounds)")
    growth_words = (f"{unnamed} fits with a new unnamed ControlCallback each: {first * 1e3:.2f} ms a fit in the first "
                    f"tenth, {last * 1e3:.2f} ms in the last: {last / first:.2f}x")
    print(growth_words)
    _common.print_summary(f"overhead: short fits on {keras.backend.backend()}: {short_fit_words(short)}; {loop_words}; "
                          f"{growth_words}")
    return 0


def measure(args) -> int:
    """Measures the overhead on `args.backend` in this process."""
    os.environ["KERAS_BACKEND"] = args.backend  # before Keras is imported
    epochs, steps = (1, 50) if args.quick else (args.epochs, args.steps)
    if args.backend == "torch" and "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(1)

    import keras
    import numpy as np

    from jupyter_traincontrol import ControlCallback

    rng = np.random.default_rng(args.seed)
    x = rng.random((steps * BATCH_SIZE, FEATURES), dtype="float32")
    y = x.sum(axis=1, keepdims=True)
    model, width = calibrated_model(x[:BATCH_SIZE * 100], y[:BATCH_SIZE * 100], 0 if args.quick else args.step_ms,
                                    args.seed)

    with _common.scratch_folder(args.dir, "traincontrol-bench-overhead-") as scratch:
        reader_cpu = ReaderCpu("bench-overhead")
        fifo = scratch / "naive-fifo"
        os.mkfifo(fifo, 0o600)
        callbacks = {
            "plain": lambda: [],
            "ControlCallback": lambda: [reader_cpu, ControlCallback(save_at_end=False, name="bench-overhead", checkpoint_dir=scratch / "ck", verbose=False)],
            "naive FIFO": lambda: [naive_fifo_callback(fifo)],
            "BackupAndRestore": lambda: [keras.callbacks.BackupAndRestore(str(scratch / "backup"))],
            "no-op batch hook": lambda: [no_op_batch_hook()],
        }

        cpu_times: dict[str, list[float]] = {name: [] for name in callbacks}

        def timed_fit(name):
            def run():
                chosen = callbacks[name]()
                begin, begin_cpu = time.perf_counter(), time.process_time()
                model.fit(x, y, batch_size=BATCH_SIZE, epochs=epochs, shuffle=False, verbose=0, callbacks=chosen)
                cpu_times[name].append(time.process_time() - begin_cpu)
                return time.perf_counter() - begin

            return run

        threads = ""
        if args.backend == "torch":
            threads = f", torch intra-op threads: {__import__('torch').get_num_threads()}"
        print(f"overhead on {keras.backend.backend()} (Keras {keras.__version__}{threads}): {args.rounds} rounds, "
              f"each a fit of {epochs} x {steps} batches per variant, alternating; MLP {FEATURES}-{width}-{width}-1")
        times = _common.alternate({name: timed_fit(name) for name in callbacks}, args.rounds, label="overhead")
        cpu_times = {name: values[-args.rounds:] for name, values in cpu_times.items()}  # drop the warm-up
        reader_seconds = type(reader_cpu).total / (args.rounds + 1)  # per fit, warm-up included
        hooks = hook_cost(model, x, y, {"ControlCallback": callbacks["ControlCallback"]()[1],
                                        "naive FIFO": callbacks["naive FIFO"]()[0]}, 2000 if args.quick else 20000)
        short = short_fits(model, x, y, lambda: callbacks["ControlCallback"]()[1:],
                           ControlCallback(save_at_end=False, name="bench-reused", checkpoint_dir=scratch / "ck-reused", verbose=False),
                           ControlCallback(save_at_end=False, name="bench-block", checkpoint_dir=scratch / "ck-block", verbose=False),
                           3 if args.quick else args.short_rounds)
        per_fit = short["reused"]

    batches = epochs * steps
    ratios, cpu_ratios = _common.paired_ratios(times, "plain"), _common.paired_ratios(cpu_times, "plain")
    batch_ms = _common.median(times["plain"]) / batches * 1e3
    rows = []
    for name, values in times.items():
        rows.append([
            name,
            _common.median(values) * 1e3,
            _common.median(values) / batches * 1e3,
            _common.median(ratios[name]),
            f"{min(ratios[name]):.2f}-{max(ratios[name]):.2f}",
            _common.median(cpu_times[name]) * 1e3,
            _common.median(cpu_ratios[name]),
            f"{min(cpu_ratios[name]):.2f}-{max(cpu_ratios[name]):.2f}",
        ])
    print("\nratio: median of the per-round ratios to plain fit (range: min-max of them)")
    _common.print_table(["variant", "wall ms", "ms/batch", "wall ratio", "range", "CPU ms", "CPU ratio", "range"], rows)
    print("\nbatch hook alone, called in a live fit (microseconds per batch; share of a plain batch)")
    _common.print_table(["callback", "us/batch", "share"],
                        [[name, cost * 1e6, f"{cost * 1e3 / batch_ms:.2%}"] for name, cost in hooks.items()])
    plain_fit = _common.median(times["plain"])
    print(f"\nshort fits (2 batches, {_common.median([short['plain']]) * 1e3:.1f} ms plain): {short_fit_words(short)}")
    parts = {
        f"batch hook x {batches}": hooks["ControlCallback"] * batches,
        "open and close the run (reused callback)": per_fit,
        "reader thread CPU": reader_seconds,
    }
    if keras_dispatches_batch_hooks_async():
        # ControlCallback is async-safe (see its `async_safe`): Keras calls
        # its batch-end hooks on its thread pool, as without it. A no-op
        # hook that is not async-safe makes every hook synchronous: its
        # extra wall time over plain fits is what that would cost, shown
        # beside the parts (not one of them).
        synchronous = _common.median([no_op - plain for no_op, plain in zip(times["no-op batch hook"], times["plain"])])
        print(f"\n(a synchronous batch-end hook, the no-op one, would cost {synchronous * 1e3:.1f} ms a fit: "
              f"{synchronous / plain_fit:.2%})")
    estimate = 1 + sum(parts.values()) / plain_fit
    print(f"\nControlCallback, part by part, in a fit of {batches} batches ({plain_fit * 1e3:.0f} ms plain)")
    _common.print_table(["part", "ms per fit", "share"],
                        [[name, value * 1e3, f"{value / plain_fit:.2%}"] for name, value in parts.items()]
                        + [["sum", (estimate - 1) * plain_fit * 1e3, f"{estimate - 1:.2%}"]])
    wall, cpu = _common.median(ratios["ControlCallback"]), _common.median(cpu_ratios["ControlCallback"])
    print(f"\ngoal for ControlCallback: <= {GOAL_RATIO}x: part by part {estimate:.3f}x "
          f"({'met' if estimate <= GOAL_RATIO else 'NOT met'}); whole fits {wall:.3f}x wall, {cpu:.3f}x CPU "
          f"(noise: per-round ratios of plain to itself would spread as widely as the ranges above)")
    _common.print_summary(
        f"overhead: ControlCallback {estimate:.3f}x part by part ({hooks['ControlCallback'] * 1e6:.1f} us/batch, "
        f"{per_fit * 1e3:.2f} ms/fit reused ({short['fresh'] * 1e3:.2f} ms fresh, {short['block'] * 1e3:.2f} ms in a with "
        f"block; goal <= {SHORT_FIT_GOAL_MS:g} ms), "
        f"reader {reader_seconds * 1e3:.1f} ms/fit); whole fits (wall, CPU): "
        + ", ".join(f"{name} {_common.median(ratios[name]):.3f}x {_common.median(cpu_ratios[name]):.3f}x"
                    for name in callbacks if name != "plain")
        + f" (goal <= {GOAL_RATIO}x; {batch_ms:.2f} ms/batch, hidden {width} wide)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
