"""What keeping the user's callbacks' state costs a checkpoint, beside one without it.

A checkpoint carries the state of the fit's stateful callbacks inside its
model file (`fit.callback_states`): a few numbers for `ModelCheckpoint` and
`ReduceLROnPlateau`, and for `EarlyStopping(restore_best_weights=True)` a
second copy of the weights (its best ones). This measures, for MLPs of
several sizes, a checkpoint's write as the tool makes it (the model's
``.keras`` file, then the attachments appended to it), alternating round
after round in one process:

- ``plain``: no stateful callback (nothing attached);
- ``counters``: `ModelCheckpoint` and `ReduceLROnPlateau` (a few numbers);
- ``best``: those and `EarlyStopping(restore_best_weights=True)` holding
  its best weights.

Reported per size: the medians of the per-round ratios of write time to
``plain``, the file sizes, and what the training thread spends to take
the states (`capture`: references, no copy; the arrays are encoded by the
write, which a ``save`` or autosave does on the writer's thread).

Usage::

    python benchmarks/callback_state_cost.py             # 7 rounds, 1, 17 and 100 MB of weights
    python benchmarks/callback_state_cost.py --quick     # 1 round, 1 MB
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

_common.prepare_environment()

#: Hidden widths of the MLPs measured: about 1, 17 and 100 MB of float32 weights.
SIZES = {"small": [512, 512], "medium": [1024, 2048, 1024], "large": [2048, 4096, 4096]}
FEATURES = 64


def main(argv=None) -> int:
    parser = _common.make_parser(__doc__, rounds=7, quick_rounds=1)
    args = _common.parse_args(parser, argv)
    import keras
    import numpy as np

    from jupyter_traincontrol.checkpoint import Attached
    from jupyter_traincontrol.fit.callback_states import capture

    sizes = {"small": SIZES["small"]} if args.quick else SIZES
    parts = []
    with _common.scratch_folder(args.dir, "traincontrol-bench-callback-state-") as scratch:
        for widths in sizes.values():
            model = _common.dense_model(FEATURES, widths, seed=args.seed)
            label = f"{sum(int(np.prod(v.shape)) for v in model.weights) * 4 / 1e6:.0f} MB"
            x = np.random.default_rng(args.seed).random((64, FEATURES), dtype="float32")
            model.fit(x, x.sum(axis=1, keepdims=True), batch_size=64, epochs=1, verbose=0)  # Adam's slots exist
            counters = [keras.callbacks.ModelCheckpoint(str(scratch / "best.keras"), save_best_only=True),
                        keras.callbacks.ReduceLROnPlateau()]
            early = keras.callbacks.EarlyStopping(restore_best_weights=True)
            early.best_weights = model.get_weights()
            callbacks = {"plain": [], "counters": counters, "best": [*counters, early]}
            captured: dict[str, list[float]] = {name: [] for name in callbacks}
            written: dict[str, int] = {}

            def write(name: str):
                def once() -> float:
                    path = scratch / f"{name}.keras"
                    path.unlink(missing_ok=True)
                    begin = time.perf_counter()
                    files = capture(callbacks[name])
                    captured[name].append(time.perf_counter() - begin)
                    (Attached(model, files) if files else model).save(path)
                    elapsed = time.perf_counter() - begin
                    written[name] = path.stat().st_size
                    return elapsed
                return once

            results = _common.alternate({name: write(name) for name in callbacks}, args.rounds, label=label)
            ratios = _common.paired_ratios(results, "plain")
            plain = _common.median(results["plain"])
            print(f"{label} of weights ({written['plain'] / 1e6:.1f} MB file): plain write {plain * 1e3:.0f} ms; "
                  f"counters {_common.median(ratios['counters']):.3f}x ({written['counters'] / 1e6:.1f} MB), "
                  f"best weights {_common.median(ratios['best']):.3f}x ({written['best'] / 1e6:.1f} MB); "
                  f"capture on the training thread {_common.median(captured['best'][-args.rounds:]) * 1e6:.0f} us")
            parts.append(f"{label}: counters {_common.median(ratios['counters']):.3f}x, best weights "
                         f"{_common.median(ratios['best']):.3f}x (file {written['best'] / written['plain']:.2f}x), "
                         f"capture {_common.median(captured['best'][-args.rounds:]) * 1e6:.0f} us")
    _common.print_summary(f"callback_state_cost: write time with the callbacks' state / without: {'; '.join(parts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
