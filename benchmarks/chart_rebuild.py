"""How long the notebook panel's loss chart takes to rebuild, at any run length.

The panel rebuilds its chart (an inline SVG, `notebook.chart_svg`) up to 5
times a second. For runs of 1,000, 10,000 and 100,000 epochs (two batches
each, a loss and a validation loss per epoch), this times a rebuild two
ways, alternating round after round:

- ``panel``: what the panel does, from the bounded series the run keeps
  (`RunHistory.chart_series`: loss per batch, validation loss and the
  newest epochs, each in at most a few hundred points);
- ``whole history``: the chart handed every epoch's logs, as the panel did
  before the series were kept (the chart now averages a long series down
  to its bounded size, so even this path draws a bounded SVG).

It prints each rebuild's median time and the SVG's size, against the goal
(under 5 ms a rebuild at any length).

Usage::

    python benchmarks/chart_rebuild.py            # 1,000 / 10,000 / 100,000 epochs, 21 rounds
    python benchmarks/chart_rebuild.py --quick    # 1,000 and 10,000 epochs, 3 rounds
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

_common.prepare_environment()

GOAL_MS = 5.0


def long_run(epochs: int):
    from jupyter_traincontrol.run.history import RunHistory

    history = RunHistory()
    for epoch in range(epochs):
        for _ in range(2):
            history.add_loss(1.0 / (epoch + 1))
        history.record_epoch(epoch, {"loss": 1.0 / (epoch + 1), "val_loss": 1.2 / (epoch + 1)})
    return history


def main(argv=None) -> int:
    parser = _common.make_parser(__doc__, rounds=21, quick_rounds=3)
    args = _common.parse_args(parser, argv)
    from jupyter_traincontrol.notebook.chart_svg import loss_chart_svg

    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    rows, summary = [], []
    for epochs in sizes:
        history = long_run(epochs)
        sizes_kb = {}

        def timed(build, name):
            def run():
                begin = time.perf_counter()
                svg = build()
                elapsed = time.perf_counter() - begin
                sizes_kb[name] = len(svg) / 1e3
                return elapsed
            return run

        times = _common.alternate({
            "panel": timed(lambda: loss_chart_svg(**history.chart_series()), "panel"),
            "whole history": timed(lambda: loss_chart_svg(history.epochs, history.loss_curve.points()), "whole history"),
        }, args.rounds, label=f"{epochs} epochs")
        panel, whole = _common.median(times["panel"]) * 1e3, _common.median(times["whole history"]) * 1e3
        rows.append([f"{epochs:,}", panel, sizes_kb["panel"], whole, sizes_kb["whole history"], panel / GOAL_MS])
        summary.append(f"{epochs} epochs {panel:.2f} ms ({panel / GOAL_MS:.2f}x the goal)")
    print(f"chart_rebuild: {args.rounds} rounds per length, the two ways alternating (ms, medians; SVG in KB)")
    _common.print_table(["epochs", "panel ms", "panel KB", "whole history ms", "whole history KB", "panel / 5 ms"], rows)
    _common.print_summary(f"chart_rebuild: a rebuild takes {', '.join(summary)} (goal < {GOAL_MS:g} ms at any length)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
