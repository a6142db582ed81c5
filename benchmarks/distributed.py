"""What a multi-process job's agreement costs, and how fast a command stops every process.

Starts a JAX job of N processes on 127.0.0.1 (CPU devices, gloo), the way
`examples/train_job.py` does, each process running this file with
``--worker``. In the same processes, round after round:

- per-batch cost: `fit`s of the same batches, alternated in a rotating
  order: ``plain`` (no callback with a batch hook: Keras dispatches batch
  hooks on a thread pool and never waits for a step), ``sync`` (an empty
  batch hook: Keras then waits for every step to make its logs Python
  floats, as for any callback with a batch hook that is not
  ``async_safe``) and ``control`` (`ControlCallback` in the job, async-safe:
  its watcher thread, heartbeats, the per-batch checks). Each process times
  every epoch after the first; a round's time is its slowest process's
  median per batch; ratios are per round, then their median.
  ``control / plain`` is what the control costs a job (goal 1.05x);
  ``sync / plain`` is what any synchronous batch hook costs on JAX (what
  the control cost while it was not async-safe);
- the batch hook alone: inside a real `fit`, every process calls the
  control's ``on_train_batch_end`` 20,000 times in a row (the agreement's
  per-batch part: two checks); its time over a plain batch's is the
  overhead free of the machine's noise;
- stop latency: a `fit` with `ControlCallback`; at a random moment process
  0 writes ``stop`` into the job's FIFO, as ``echo`` would; every process
  notes when its `fit` returned. The latency is from the write to the last
  process's return (one clock: one machine).

Usage::

    python benchmarks/distributed.py                    # 2 and 4 processes, 5 rounds
    python benchmarks/distributed.py --processes 2      # one size
    python benchmarks/distributed.py --quick            # 2 processes, 1 round (a smoke run)
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

GOAL_RATIO = 1.05  # control / plain
VARIANTS = ["plain", "sync", "control"]
BATCHES, BATCH_SIZE = 32, 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The worker: one process of the job -------------------------------------------


def worker(process: int, processes: int, port: int, out: Path, rounds: int, epochs: int, stops: int, seed: int) -> None:
    os.environ["KERAS_BACKEND"] = "jax"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=processes, process_id=process)
    import keras
    import numpy as np
    import tensorflow as tf

    from jupyter_traincontrol import ControlCallback

    keras.utils.set_random_seed(0)
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
    x = np.random.default_rng(0).random((BATCHES * BATCH_SIZE, 8), dtype="float32")
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).batch(BATCH_SIZE)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    control = ControlCallback(save_at_end=False, name="bench-job", checkpoint_dir=str(out / "ck"), verbose=False)
    log = open(out / f"worker-{process}.jsonl", "a", buffering=1)

    class BatchTimes(keras.callbacks.Callback):
        """Each epoch's time after the first, per batch."""

        def on_train_begin(self, logs=None):
            self.times = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            float(logs["loss"])  # the epoch's last step has run
            if epoch > 0:  # the first epoch of a fit warms up
                self.times.append((time.perf_counter() - self.start) / BATCHES)

    class HookCost(keras.callbacks.Callback):
        """Once, mid-fit: calls the control's batch hook `calls` times in a
        row (every process alike, so their batch counts stay equal)."""

        def __init__(self, calls):
            super().__init__()
            self.calls, self.seconds = calls, None

        def on_train_batch_end(self, batch, logs=None):
            if self.seconds is None and batch == 3:
                start = time.perf_counter()
                for _ in range(self.calls):
                    control.on_train_batch_end(batch, logs)
                self.seconds = (time.perf_counter() - start) / self.calls

    timer = BatchTimes()
    model.fit(data, epochs=1, verbose=0, callbacks=[timer])  # warm-up: compile once
    hook = HookCost(2000 if rounds == 1 else 20000)
    model.fit(data, epochs=1, verbose=0, callbacks=[control, hook])
    log.write(json.dumps({"kind": "hook", "seconds": hook.seconds}) + "\n")
    class EmptyHook(keras.callbacks.Callback):
        """A batch hook that does nothing: Keras then calls every callback's
        batch hook synchronously, with the logs made Python floats (it
        waits for each step), as for any callback with a batch hook that
        does not declare itself ``async_safe``."""

        def on_train_batch_end(self, batch, logs=None):
            pass

    extra = {"plain": [], "sync": [EmptyHook()], "control": [control]}
    for round_ in range(rounds):
        order = VARIANTS[round_ % 3:] + VARIANTS[: round_ % 3]
        for variant in order:
            callbacks = extra[variant] + [timer]
            model.fit(data, epochs=epochs + 1, verbose=0, callbacks=callbacks)
            per_batch = sorted(timer.times)[len(timer.times) // 2]
            log.write(json.dumps({"kind": "batch", "round": round_, "variant": variant, "seconds": per_batch}) + "\n")

    rng = random.Random(seed)

    class SendStop(keras.callbacks.Callback):
        """Process 0: writes `stop` into the job's FIFO at a random batch."""

        def on_train_begin(self, logs=None):
            self.at, self.sent = rng.randrange(BATCHES, 3 * BATCHES), False

        def on_train_batch_end(self, batch, logs=None):
            self.at -= 1
            if self.at == 0 and not self.sent:
                self.sent = True
                sent = time.time()
                with open(control.fifo, "w") as fifo:
                    fifo.write("stop\n")
                log.write(json.dumps({"kind": "sent", "time": sent}) + "\n")

    for stop in range(stops):
        callbacks = [control] + ([SendStop()] if process == 0 else [])
        model.fit(data, epochs=1000, verbose=0, callbacks=callbacks)
        log.write(json.dumps({"kind": "returned", "stop": stop, "time": time.time(), "state": str(control.state)}) + "\n")
    log.close()


# The driver -------------------------------------------------------------------


def run_job(processes: int, folder: Path, rounds: int, epochs: int, stops: int, seed: int) -> dict:
    out = folder / f"job-{processes}"
    out.mkdir()
    port = _free_port()
    command = [sys.executable, __file__, "--worker", "--processes", str(processes), "--port", str(port),
               "--out", str(out), "--rounds", str(rounds), "--epochs", str(epochs), "--stops", str(stops),
               "--seed", str(seed)]
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": os.pathsep.join([str(_common.REPO), os.environ.get("PYTHONPATH", "")])}
    children = [subprocess.Popen(command + ["--process", str(i)], env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(processes)]
    try:
        errors = [child.communicate(timeout=900)[1] for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.communicate()
    if any(child.returncode for child in children):
        failed = next(i for i, child in enumerate(children) if child.returncode)
        raise SystemExit(f"process {failed} of the {processes}-process job failed:\n{errors[failed][-3000:]}")
    events = [[json.loads(line) for line in (out / f"worker-{i}.jsonl").read_text().splitlines()] for i in range(processes)]
    times = {v: [] for v in VARIANTS}
    ratios, sync_ratios, plain_ratios = [], [], []
    for round_ in range(rounds):
        # A job steps together: its per-batch time is its slowest process's.
        per = {v: max(e["seconds"] for log in events for e in log if e["kind"] == "batch" and e["round"] == round_
                      and e["variant"] == v) for v in VARIANTS}
        for v in VARIANTS:
            times[v].append(per[v])
        ratios.append(per["control"] / per["sync"])
        sync_ratios.append(per["sync"] / per["plain"])
        plain_ratios.append(per["control"] / per["plain"])
    sent = [e["time"] for e in events[0] if e["kind"] == "sent"]
    returned = [max(e["time"] for log in events for e in log if e["kind"] == "returned" and e["stop"] == stop)
                for stop in range(stops)]
    states = {e["state"] for log in events for e in log if e["kind"] == "returned"}
    if states != {"stopped"} or len(sent) != stops:
        raise SystemExit(f"the {processes}-process job did not stop as asked: states {states}, {len(sent)} of {stops} sent")
    hook = max(e["seconds"] for log in events for e in log if e["kind"] == "hook")
    return {**times, "ratios": ratios, "sync_ratios": sync_ratios, "plain_ratios": plain_ratios, "hook": hook,
            "latency": [end - start for start, end in zip(sent, returned)]}


def main(argv=None) -> int:
    parser = _common.make_parser(__doc__, rounds=5, quick_rounds=1)
    parser.add_argument("--processes", type=int, action="append", help="job size (repeatable; default 2 and 4; 2 with --quick)")
    parser.add_argument("--epochs", type=int, default=None, help="measured epochs per fit (default 4; 1 with --quick)")
    parser.add_argument("--stops", type=int, default=None, help="stop commands timed per job (default 5; 1 with --quick)")
    parser.add_argument("--worker", action="store_true", help=argparse_hidden())
    parser.add_argument("--process", type=int, help=argparse_hidden())
    parser.add_argument("--port", type=int, help=argparse_hidden())
    parser.add_argument("--out", help=argparse_hidden())
    args = _common.parse_args(parser, argv)
    epochs = args.epochs or (1 if args.quick else 4)
    stops = args.stops or (1 if args.quick else 5)
    if args.worker:
        worker(args.process, args.processes[0], args.port, Path(args.out), args.rounds, epochs, stops, args.seed)
        return 0
    _common.prepare_environment()
    sizes = args.processes or ([2] if args.quick else [2, 4])
    rows, summary = [], []
    with _common.scratch_folder(args.dir, "traincontrol-bench-") as folder:
        for processes in sizes:
            result = run_job(processes, folder, args.rounds, epochs, stops, args.seed)
            ratio = _common.median(result["plain_ratios"])
            latency = _common.median(result["latency"]) * 1000
            sync = _common.median(result["sync"])
            share = result["hook"] / sync  # what the hook adds to a batch, free of the machine's noise
            rows.append((processes, *(_common.median(result[v]) * 1000 for v in VARIANTS),
                         _common.median(result["sync_ratios"]), _common.median(result["ratios"]), ratio,
                         result["hook"] * 1e6, 1 + share,
                         latency, max(result["latency"]) * 1000))
            summary.append(f"{processes} processes control/plain {ratio:.3f}x per batch (hook {1 + share:.4f}x), "
                           f"stop in {latency:.0f} ms")
    _common.print_table(
        ["processes", "plain ms/b", "sync ms/b", "control ms/b", "sync/plain", "control/sync", "control/plain", "hook us",
         "hook ratio", "stop median ms", "stop max ms"], rows)
    print(f"goal: control/plain <= {GOAL_RATIO}; {args.rounds} rounds of {epochs} epochs x {BATCHES} batches, {stops} stops")
    _common.print_summary("distributed: " + "; ".join(summary) + f" (goal control/plain <= {GOAL_RATIO}x)")
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
