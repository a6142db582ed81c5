"""What `ControlCallback` costs while nothing is sent: `fit` time against a plain `fit`.

A small MLP whose training step takes about 1 ms (so a per-batch cost shows)
is trained with `fit` in four ways, alternating round after round:

- ``plain``: no callbacks;
- ``ControlCallback``: ours (registry record, FIFO and reader thread are
  opened and closed in every `fit`, so that cost is included);
- ``naive FIFO``: the common recipe, a callback that opens, reads and closes
  a FIFO after every batch (nobody writes to it);
- ``BackupAndRestore``: Keras's own, backing up at every epoch end.

Each `fit` trains the same number of batches; the time of the whole call is
measured. Reported: medians per variant, and the median of the per-round
ratios to ``plain``.

Usage::

    python benchmarks/overhead.py            # 9 rounds of 5 epochs x 200 batches
    python benchmarks/overhead.py --quick    # 2 rounds of 1 x 50 batches (a smoke run)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

_common.prepare_environment()

GOAL_RATIO = 1.02
FEATURES, BATCH_SIZE = 32, 32


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


def main(argv=None) -> int:
    parser = _common.make_parser(__doc__, rounds=9, quick_rounds=2)
    parser.add_argument("--epochs", type=int, default=5, help="epochs per fit (default 5)")
    parser.add_argument("--steps", type=int, default=200, help="batches per epoch (default 200)")
    args = _common.parse_args(parser, argv)
    epochs, steps = (1, 50) if args.quick else (args.epochs, args.steps)

    import keras
    import numpy as np

    from jupyter_traincontrol import ControlCallback

    rng = np.random.default_rng(args.seed)
    x = rng.random((steps * BATCH_SIZE, FEATURES), dtype="float32")
    y = x.sum(axis=1, keepdims=True)
    model = _common.dense_model(FEATURES, [16, 16], seed=args.seed)

    with _common.scratch_folder(args.dir, "traincontrol-bench-overhead-") as scratch:
        fifo = scratch / "naive-fifo"
        os.mkfifo(fifo, 0o600)
        callbacks = {
            "plain": lambda: [],
            "ControlCallback": lambda: [ControlCallback(name="bench-overhead", checkpoint_dir=scratch / "ck", verbose=False)],
            "naive FIFO": lambda: [naive_fifo_callback(fifo)],
            "BackupAndRestore": lambda: [keras.callbacks.BackupAndRestore(str(scratch / "backup"))],
        }

        def timed_fit(name):
            def run():
                chosen = callbacks[name]()
                begin = time.perf_counter()
                model.fit(x, y, batch_size=BATCH_SIZE, epochs=epochs, shuffle=False, verbose=0, callbacks=chosen)
                return time.perf_counter() - begin

            return run

        model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0)  # trace the train function once
        print(f"overhead: {args.rounds} rounds, each a fit of {epochs} x {steps} batches per variant, alternating")
        times = _common.alternate({name: timed_fit(name) for name in callbacks}, args.rounds, label="overhead")

    batches = epochs * steps
    ratios = _common.paired_ratios(times, "plain")
    rows = []
    for name, values in times.items():
        rows.append([
            name,
            _common.median(values) * 1e3,
            _common.median(values) / batches * 1e3,
            _common.median(ratios[name]),
            min(ratios[name]),
            max(ratios[name]),
            _common.median(values) / _common.median(times["plain"]),
        ])
    print()
    _common.print_table(["variant", "fit ms", "ms/batch", "ratio", "min", "max", "ratio of medians"], rows)
    ours = _common.median(ratios["ControlCallback"])
    print(f"\nratio = median of per-round ratios to plain fit; goal for ControlCallback: <= {GOAL_RATIO}x "
          f"({'met' if ours <= GOAL_RATIO else 'NOT met'})")
    _common.print_summary(
        "overhead: fit time / plain fit = "
        + ", ".join(f"{name} {_common.median(ratios[name]):.3f}x" for name in callbacks if name != "plain")
        + f" (goal for ControlCallback <= {GOAL_RATIO}x; {_common.median(times['plain']) / batches * 1e3:.2f} ms/batch)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
