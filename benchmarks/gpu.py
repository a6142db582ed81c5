"""Every figure that needs a GPU, in one short run: TensorFlow and JAX, each in its own process.

Device time on a GPU machine is counted in minutes, so one run prints all
of these, each beside its baseline or peer, measured alternating in one
process per backend:

1. Step overhead: `fit` with `ControlCallback` against a plain `fit`
   (``verbose=0``) for MLPs widened until a plain step takes about 1, 5
   and 20 ms on the device; whole-fit ratios, medians of alternating
   rounds. On a GPU this is where a forced host sync per step would show
   (the host waiting for each step's loss instead of queuing the next).
2. Stop latency: ``stop`` written into the run's FIFO at a random moment
   of a `fit` with 5 ms steps, until `fit` has returned (its checkpoint on
   disk); and the part beyond the batch in flight.
3. Save hold at 1 and 10 GB (a one-layer Adam model: weights and two
   moments): the training thread held by a plain ``model.save``, by our
   ``save`` command and by the backend's async peer (TensorFlow's async
   ``tf.train.Checkpoint``, JAX's Orbax ``CheckpointManager``), with the
   step after each save and the steps during the write
   (`checkpoint_peers`), keeping one checkpoint each. 10 GB needs about
   40 GB of host memory and 30 GB of disk at a time.

Never run in CI (``--quick`` is a smoke run on CPU: tiny steps, 1 MB).
Needs the GPU builds (``tensorflow[and-cuda]``, ``jax[cuda12]``) and
``orbax-checkpoint``; put the figures in the README with the date and the
device.

Usage::

    python benchmarks/gpu.py                  # both backends (about 8 minutes on an H200)
    python benchmarks/gpu.py --backend jax    # one
    python benchmarks/gpu.py --quick          # a smoke run on CPU (seconds)
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

BACKENDS = ("tensorflow", "jax")
FEATURES, BATCH_SIZE = 256, 256


def device_name() -> str:
    """The accelerator this process trains on, in words."""
    import keras

    if keras.backend.backend() == "jax":
        import jax

        device = jax.devices()[0]
        return f"{device.platform}: {getattr(device, 'device_kind', device)}"
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return f"gpu: {tf.config.experimental.get_device_details(tf.config.list_physical_devices('GPU')[0]).get('device_name', gpus[0].name)}" if gpus else "cpu"


def model_for_step(step_ms: float, x, y, seed: int, quick: bool):
    """An MLP widened (256, 512, ... units) until a plain step takes `step_ms`; with its step time."""
    width = 64 if quick else 256
    while True:
        model = _common.dense_model(FEATURES, [width] * 4, seed=seed)
        model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0)  # compile once
        begin = time.perf_counter()
        model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, shuffle=False, verbose=0)
        step = (time.perf_counter() - begin) / (len(x) // BATCH_SIZE)
        if quick or step * 1e3 >= 0.8 * step_ms or width >= 65536:
            return model, step
        width = int(width * max(1.4, min(2.0, (step_ms / (step * 1e3)) ** 0.5)))


def step_overhead(folder: Path, rounds: int, quick: bool, seed: int) -> list[list]:
    """Whole-fit time with `ControlCallback` over plain, at 1, 5, 20 ms steps."""
    import numpy as np

    from jupyter_traincontrol import ControlCallback

    batches = 20 if quick else 200
    rng = np.random.default_rng(seed)
    x = rng.random((batches * BATCH_SIZE, FEATURES), dtype="float32")
    y = x.sum(axis=1, keepdims=True)
    rows = []
    for step_ms in (1, 5, 20):
        model, step = model_for_step(step_ms, x, y, seed, quick)
        control = ControlCallback(save_at_end=False, name=f"gpu-{step_ms}", checkpoint_dir=folder / f"ck-{step_ms}", verbose=False,
                                  handle_sigint=False)

        def fit(callbacks):
            def run():
                begin = time.perf_counter()
                model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
                return time.perf_counter() - begin
            return run

        times = _common.alternate({"plain": fit([]), "control": fit([control])}, rounds, label=f"{step_ms} ms steps")
        ratio = _common.median(_common.paired_ratios(times, "plain")["control"])
        rows.append([f"{step_ms} ms", step * 1e3, _common.median(times["plain"]) / batches * 1e3,
                     _common.median(times["control"]) / batches * 1e3, ratio])
    return rows


def stop_latency(folder: Path, stops: int, quick: bool, seed: int) -> list[float]:
    """Seconds from ``stop`` written into the FIFO to `fit` returned (checkpoint on disk), and the batch time."""
    import numpy as np

    from jupyter_traincontrol import ControlCallback
    from jupyter_traincontrol.transport.send import deliver

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


def run_backend(args) -> int:
    """Every figure of this process's backend."""
    os.environ["KERAS_BACKEND"] = args.backend
    _common.prepare_environment()
    import checkpoint_cost
    import checkpoint_peers
    import keras

    print(f"gpu.py on {keras.backend.backend()} (Keras {keras.__version__}), {device_name()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    summary = []
    with _common.scratch_folder(args.dir, "traincontrol-bench-gpu-") as scratch:
        rows = step_overhead(scratch, args.rounds, args.quick, args.seed)
        print("\n1. Step overhead: whole fits of 200 batches, ControlCallback over plain fit (verbose=0), medians")
        _common.print_table(["target step", "step ms", "plain ms/batch", "control ms/batch", "control / plain"], rows)
        summary.append("overhead " + ", ".join(f"{r[0]} {r[4]:.3f}x" for r in rows))

        latencies, step = stop_latency(scratch, 2 if args.quick else 5, args.quick, args.seed)
        latency = _common.median(latencies) * 1e3
        print(f"\n2. Stop: {len(latencies)} stops at random moments, {step * 1e3:.1f} ms steps: write to fit returned "
              f"{latency:.1f} ms median (max {max(latencies) * 1e3:.1f}); beyond the batch in flight at most "
              f"{latency - step * 1e3:.1f} ms")
        summary.append(f"stop {latency:.0f} ms")

        sizes = [1.0] if args.quick else [1000.0, 10000.0]
        print("\n3. Save hold against model.save (overwriting one file), training thread held, ms:")
        plain_rows = []
        for megabytes in sizes:
            model = checkpoint_cost.model_with_file_size(megabytes, seed=args.seed)
            folder = scratch / f"hold-{megabytes:g}"
            folder.mkdir()
            times = checkpoint_cost.measure_hold_times(model, folder, args.save_rounds, written_back=False, keep=1)
            ratio = _common.median(_common.paired_ratios(times, "model.save")["save command"])
            plain_rows.append([f"{megabytes / 1000:g} GB", _common.median(times["model.save"]) * 1e3,
                               _common.median(times["save command"]) * 1e3, ratio])
            summary.append(f"{megabytes / 1000:g}GB save {ratio:.3f}x model.save")
            del model
            for leftover in folder.rglob("*.keras"):
                leftover.unlink()
        _common.print_table(["file", "model.save", "save command", "ratio"], plain_rows)
        summary.append(checkpoint_peers.report(sizes, checkpoint_cost.model_with_file_size, scratch,
                                               args.save_rounds, False, args.seed, keep=1))
    _common.print_summary(f"gpu: {keras.backend.backend()}: " + "; ".join(summary))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _common.make_parser(__doc__, rounds=5, quick_rounds=2)
    parser.add_argument("--backend", choices=[*BACKENDS, "all"], default="all",
                        help="the backend to measure; all: each in its own process (default all)")
    parser.add_argument("--save-rounds", type=int, default=None, help="measured saves per variant and size (default 2)")
    args = _common.parse_args(parser, argv)
    args.save_rounds = args.save_rounds or (1 if args.quick else 2)
    if args.backend != "all":
        return run_backend(args)
    summaries = _common.run_per_backend(__file__, argv, BACKENDS)
    if isinstance(summaries, int):
        return summaries
    _common.print_summary("gpu: " + " | ".join(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
