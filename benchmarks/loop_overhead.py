"""What `TrainLoop` costs a custom training loop while nothing is sent.

A GradientTape step (a ``tf.function``) on an MLP widened until a step
takes about ``--step-ms`` (default 1 ms, the size of step the goal is
stated for), and the same model as a PyTorch loop, are trained in two ways
each, alternating round after round:

- ``plain``: ``for epoch in range(E): for batch in batches: step(batch)``;
- ``TrainLoop``: the same body in ``loop.epochs(E)`` / ``loop.batches(...)``
  with ``loop.log(loss=...)`` (the run opened and closed in every round:
  registry record, FIFO, reader thread, publisher; ``save_at_end=False``).

Both read the loss as a Python float every step (``loop.log`` needs one,
and reading it in ``plain`` too keeps the comparison to the loop's part).
Reported: medians of wall and CPU time, the median of per-round ratios,
and, free of the machine's noise, the loop's part measured alone: one
item's boundary (``batches`` yielding an item, ``log``) timed over 20,000
items with an empty body, as a share of a plain step.

Usage::

    python benchmarks/loop_overhead.py            # 15 rounds of 5 epochs x 200 items
    python benchmarks/loop_overhead.py --quick    # a smoke run
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

_common.prepare_environment()

GOAL_RATIO = 1.02
FEATURES, BATCH_SIZE = 32, 32


def tape_loop(width: int, steps: int, seed: int):
    """A GradientTape step over `steps` batches; returns (model, optimizer, step, batches)."""
    import numpy as np
    import tensorflow as tf

    model = _common.dense_model(FEATURES, [width, width], seed=seed)  # compiled: its optimizer is the loop's
    optimizer = model.optimizer
    rng = np.random.default_rng(seed)
    x = rng.random((steps * BATCH_SIZE, FEATURES), dtype="float32")
    batches = [(tf.constant(x[i:i + BATCH_SIZE]), tf.constant(x[i:i + BATCH_SIZE].sum(1, keepdims=True)))
               for i in range(0, len(x), BATCH_SIZE)]

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return dict(model=model, optimizer=optimizer), lambda batch: float(step(*batch)), batches


def torch_loop(width: int, steps: int, seed: int):
    """The same MLP as a PyTorch loop; returns (state, step, batches)."""
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(1)  # this tiny model's steps are slower and noisier on the thread pool
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.rand(steps * BATCH_SIZE, FEATURES, generator=torch.Generator().manual_seed(seed))
    batches = [(x[i:i + BATCH_SIZE], x[i:i + BATCH_SIZE].sum(1, keepdim=True)) for i in range(0, len(x), BATCH_SIZE)]

    def step(batch):
        optimizer.zero_grad()
        loss = ((model(batch[0]) - batch[1]) ** 2).mean()
        loss.backward()
        optimizer.step()
        return loss.item()

    return {"state": {"model": model, "optimizer": optimizer}}, step, batches


def calibrated(make, step_ms: float, seed: int, steps: int):
    """The narrowest hidden width (16 to 2048) whose plain step takes at least 80 % of `step_ms`."""
    width = 16
    while True:
        parts, step, batches = make(width, steps, seed)
        for batch in batches[:20]:
            step(batch)  # traced, warm
        if step_ms <= 0 or width >= 2048:
            return width, (parts, step, batches)
        begin = time.perf_counter()
        for batch in batches:
            step(batch)
        if (time.perf_counter() - begin) / len(batches) * 1e3 >= 0.8 * step_ms:
            return width, (parts, step, batches)
        width *= 2


def measure(kind: str, make, args, scratch: Path) -> dict:
    """Plain against TrainLoop for one kind of loop; returns the figures."""
    from jupyter_traincontrol import TrainLoop

    epochs, steps = (1, 50) if args.quick else (args.epochs, args.steps)
    width, (parts, step, batches) = calibrated(make, 0 if args.quick else args.step_ms, args.seed, steps)
    cpu: dict[str, list[float]] = {"plain": [], "TrainLoop": []}

    def plain():
        begin, begin_cpu = time.perf_counter(), time.process_time()
        for _ in range(epochs):
            for batch in batches:
                step(batch)
        cpu["plain"].append(time.process_time() - begin_cpu)
        return time.perf_counter() - begin

    def controlled():
        begin, begin_cpu = time.perf_counter(), time.process_time()
        with TrainLoop(name=f"bench-{kind}", checkpoint_dir=scratch / kind, verbose=False, save_at_end=False,
                       handle_sigint=False, **parts) as loop:
            for _ in loop.epochs(epochs):
                for batch in loop.batches(batches):
                    loop.log(loss=step(batch))
        cpu["TrainLoop"].append(time.process_time() - begin_cpu)
        return time.perf_counter() - begin

    times = _common.alternate({"plain": plain, "TrainLoop": controlled}, args.rounds, label=kind)
    cpu = {name: values[-args.rounds:] for name, values in cpu.items()}
    items = 2000 if args.quick else 20000
    with TrainLoop(name=f"bench-{kind}-items", checkpoint_dir=scratch / f"{kind}-items", verbose=False,
                   save_at_end=False, handle_sigint=False, **parts) as loop:
        for _ in loop.epochs(1):
            begin = time.perf_counter()
            for _item in loop.batches(range(items)):
                loop.log(loss=0.5)
            per_item = (time.perf_counter() - begin) / items
    plain_step = _common.median(times["plain"]) / (epochs * len(batches))
    return dict(kind=kind, width=width, items=epochs * len(batches), step_ms=plain_step * 1e3, per_item=per_item,
                wall=_common.median(_common.paired_ratios(times, "plain")["TrainLoop"]),
                cpu=_common.median(_common.paired_ratios(cpu, "plain")["TrainLoop"]),
                part=1 + per_item / plain_step, times=times)


def main(argv=None) -> int:
    parser = _common.make_parser(__doc__, rounds=15, quick_rounds=2)
    parser.add_argument("--epochs", type=int, default=5, help="epochs per round (default 5)")
    parser.add_argument("--steps", type=int, default=200, help="items per epoch (default 200)")
    parser.add_argument("--step-ms", type=float, default=1.0, help="widen the MLP until a step takes this long (default 1)")
    parser.add_argument("--kinds", default="tape,torch", help="loops to measure: tape, torch (default both)")
    args = _common.parse_args(parser, argv)
    makers = {"tape": tape_loop, "torch": torch_loop}
    kinds = [kind.strip() for kind in args.kinds.split(",") if kind.strip()]
    unknown = [kind for kind in kinds if kind not in makers]
    if unknown:
        parser.error(f"--kinds: unknown {', '.join(unknown)}; expected tape and/or torch.")
    results = []
    with _common.scratch_folder(args.dir, "traincontrol-bench-loop-") as scratch:
        for kind in kinds:
            print(f"{kind}: {args.rounds} rounds, plain and TrainLoop alternating", flush=True)
            results.append(measure(kind, makers[kind], args, scratch))
    rows = [[r["kind"], r["width"], r["items"], r["step_ms"], r["per_item"] * 1e6, r["part"], r["wall"], r["cpu"]]
            for r in results]
    print("\nratio: median of the per-round ratios to the plain loop; part: 1 + one item's boundary / a plain step")
    _common.print_table(["loop", "hidden", "items", "ms/step", "us/item", "part ratio", "wall ratio", "CPU ratio"], rows)
    _common.print_summary("loop_overhead: " + "; ".join(
        f"{r['kind']} TrainLoop {r['part']:.3f}x part by part ({r['per_item'] * 1e6:.1f} us/item), whole loops "
        f"{r['wall']:.3f}x wall {r['cpu']:.3f}x CPU ({r['step_ms']:.2f} ms/step)" for r in results)
        + f" (goal <= {GOAL_RATIO}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
