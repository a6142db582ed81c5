"""How soon a command written to the FIFO takes effect, beyond the batch in flight.

A command can act only at a batch boundary, so the figure that matters is
the latency minus the rest of the batch that was running when the command
was written. For batch times of about 1 ms and about 100 ms (real compute,
not sleeps: the reader thread competes with TensorFlow for the CPU), a
writer thread writes commands to the run's FIFO at random moments (seeded)
of real `fit` calls and measures, with ``time.perf_counter``:

- ``pause``: until the training thread holds (state ``paused``);
- ``save``: until the checkpoint file exists;
- ``stop``: until `fit` returns (after its checkpoint and `on_train_end`).

Each `fit` gets one ``pause`` (then ``resume``) and one ``save``, in
alternating order, then a ``stop`` that ends it. A callback placed before
`ControlCallback` timestamps every boundary, so each command's *remaining
batch time* is the time from its write to the next boundary, and its
*excess* is the latency minus that. ``acted`` is when the training thread
took the command (its "received" event); for ``save`` and ``stop`` the gap
from there to the effect is the checkpoint (and for ``stop`` the end of
`fit`). Each `fit` checkpoints into a fresh folder, so no save has to
flush an older checkpoint first (that cost is measured by
checkpoint_cost.py); the checkpoint of ``stop`` is flushed to disk at once,
and that is part of its effect.

Usage::

    python benchmarks/latency.py           # 34 fits per batch time: 102 commands each
    python benchmarks/latency.py --quick   # 1 ms batches, 3 fits (a smoke run)
"""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

_common.prepare_environment()

GOAL_EXCESS_MS = 20.0
COMMANDS = ("pause", "save", "stop")
_EVENT_TIMEOUT = 30.0


class EventRecorder:
    """Keeps every event of a run with the `perf_counter` time it happened.

    The listener runs on the thread that logs the event (for commands,
    states and checkpoints: the training thread), at the moment it happens.
    """

    def __init__(self):
        self.events: list[tuple[float, str, str]] = []
        self._changed = threading.Condition()

    def __call__(self, _control, event) -> None:
        if event is None:
            return
        with self._changed:
            self.events.append((time.perf_counter(), event["kind"], event["message"]))
            self._changed.notify_all()

    def wait_for(self, kind: str, message: str, after: int) -> float:
        """Waits for an event at index >= `after`; returns its time."""
        deadline = time.monotonic() + _EVENT_TIMEOUT
        with self._changed:
            while True:
                for moment, got_kind, got_message in self.events[after:]:
                    if got_kind == kind and got_message.startswith(message):
                        return moment
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"No {kind} event {message!r} within {_EVENT_TIMEOUT} s: {self.events[after:]}")
                self._changed.wait(left)

    def mark(self) -> int:
        """The index the next event will have."""
        with self._changed:
            return len(self.events)


def calibrated_model(target_ms: float, seed: int):
    """Returns ``(model, x, y, batch_size)`` with a training step of about `target_ms`."""
    import numpy as np

    if target_ms <= 2:
        features, widths, batch_size = 32, [16, 16], 32
    else:
        features, widths, batch_size = 256, [512, 512], 256
    model = _common.dense_model(features, widths, seed=seed)
    rng = np.random.default_rng(seed)

    def step_ms(batch):
        x = rng.random((batch * 20, features), dtype="float32")
        model.fit(x, x[:, :1], batch_size=batch, epochs=1, verbose=0)  # trace for this shape
        clock = _common.BatchClock()
        model.fit(x, x[:, :1], batch_size=batch, epochs=1, verbose=0, callbacks=[clock])
        gaps = [b - a for a, b in zip(clock.times[1:-1], clock.times[2:-1])]
        return _common.median(gaps) * 1e3

    if target_ms > 2:
        for _attempt in range(4):  # the step time is about proportional to the batch
            measured = step_ms(batch_size)
            if abs(measured - target_ms) < 0.1 * target_ms:
                break
            batch_size = max(8, round(batch_size * target_ms / measured))
    steps = 20 if target_ms > 2 else 200
    x = rng.random((steps * batch_size, features), dtype="float32")
    return model, x, x.sum(axis=1, keepdims=True), batch_size


def run_fit(model, x, y, batch_size, order, rng, spread_s, folder) -> dict[str, dict[str, float]]:
    """One `fit`, commanded by a writer thread at random moments.

    Args:
        order: The first two commands (``pause``/``save`` in some order);
            ``stop`` always comes last.
        rng: Draws the random moments.
        spread_s: Moments are drawn uniformly from this many seconds after
            the previous command's effect.

    Returns:
        Command to its times: ``write``, ``boundary`` (the first boundary at
        or after the write), ``acted`` and ``effect``; and the median time
        between two boundaries.
    """
    from jupyter_traincontrol import ControlCallback
    from jupyter_traincontrol.transport.channels import deliver

    control = ControlCallback(save_at_end=False, name="bench-latency", checkpoint_dir=folder, verbose=False, handle_sigint=False)
    recorder = EventRecorder()
    control.lifecycle.add_listener(recorder)
    clock = _common.BatchClock()
    times: dict[str, dict[str, float]] = {}
    failure: list[BaseException] = []

    def command(word, effect_kind, effect_message):
        time.sleep(rng.uniform(0, spread_s))
        mark = recorder.mark()
        written = time.perf_counter()
        deliver(control.fifo, word)
        acted = recorder.wait_for("command", f"{word} received", mark)
        effect = recorder.wait_for(effect_kind, effect_message, mark) if effect_kind else None
        times[word] = {"write": written, "acted": acted, "effect": effect}

    def drive():
        try:
            _common.wait_for(lambda: len(clock.times) > 1, _EVENT_TIMEOUT, "the first batch")
            for word in order:
                if word == "pause":
                    command("pause", "state", "paused")
                    mark = recorder.mark()
                    deliver(control.fifo, "resume")
                    recorder.wait_for("state", "running", mark)
                else:
                    command("save", "checkpoint", "save")
            command("stop", None, None)
        except BaseException as error:  # reported by the main thread
            failure.append(error)
            if control.fifo:
                deliver(control.fifo, "abort")

    writer = threading.Thread(target=drive, name="bench-latency-writer")
    writer.start()
    model.fit(x, y, batch_size=batch_size, epochs=10**6, shuffle=False, verbose=0, callbacks=[clock, control])
    returned = time.perf_counter()
    writer.join()
    if failure:
        raise failure[0]
    times["stop"]["effect"] = returned
    for values in times.values():
        values["boundary"] = clock.first_after(values["write"])
    gaps = [b - a for a, b in zip(clock.times, clock.times[1:])]
    return times, _common.median(gaps)


def summarize(batch_ms: float, samples: dict[str, list[dict[str, float]]]) -> tuple[list[list[object]], dict[str, float]]:
    """Table rows (ms), and the worst p95 of ``acted`` and of ``excess``."""
    rows, worst = [], {"acted": 0.0, "excess": 0.0}
    for word in COMMANDS:
        measured = samples[word]
        latency = [(s["effect"] - s["write"]) * 1e3 for s in measured]
        remaining = [(s["boundary"] - s["write"]) * 1e3 for s in measured]
        acted = [(s["acted"] - s["boundary"]) * 1e3 for s in measured]
        work = [(s["effect"] - s["acted"]) * 1e3 for s in measured]
        excess = [(s["effect"] - s["boundary"]) * 1e3 for s in measured]
        worst["acted"] = max(worst["acted"], _common.percentile(acted, 95))
        worst["excess"] = max(worst["excess"], _common.percentile(excess, 95))
        rows.append([
            f"{batch_ms:.0f} ms", word, len(measured),
            _common.median(latency), _common.median(remaining),
            _common.median(acted), _common.percentile(acted, 95), max(acted),
            _common.median(work),
            _common.median(excess), _common.percentile(excess, 95), max(excess),
        ])
    return rows, worst


def main(argv=None) -> int:
    parser = _common.make_parser(__doc__, rounds=34, quick_rounds=3)
    parser.add_argument("--batch-ms", default="1,100", help="target batch times in ms, comma-separated (default 1,100)")
    args = _common.parse_args(parser, argv)
    targets = [1.0] if args.quick else [float(v) for v in args.batch_ms.split(",")]
    rng = random.Random(args.seed)

    rows, summary, plain_rows = [], [], []
    with _common.scratch_folder(args.dir, "traincontrol-bench-latency-") as scratch:
        print(f"latency: {args.rounds} fits per batch time, each with pause, save and stop at random moments "
              f"({3 * args.rounds} commands per batch time)")
        for target in targets:
            model, x, y, batch_size = calibrated_model(target, args.seed)
            spread_s = max(0.05, 3 * target / 1e3)
            samples: dict[str, list[dict[str, float]]] = {word: [] for word in COMMANDS}
            batch_times, plain_saves = [], []
            for index in range(args.rounds):
                order = ("pause", "save") if index % 2 == 0 else ("save", "pause")
                folder = scratch / f"ck-{target:g}-{index}"  # fresh: no save has to flush an older checkpoint
                result, batch_time = run_fit(model, x, y, batch_size, order, rng, spread_s, folder)
                batch_times.append(batch_time)
                for word, values in result.items():
                    samples[word].append(values)
                begin = time.perf_counter()  # for comparison: what the disk does to a plain save
                model.save(scratch / "plain.keras")
                plain_saves.append((time.perf_counter() - begin) * 1e3)
            batch_ms = _common.median(batch_times) * 1e3
            target_rows, worst = summarize(batch_ms, samples)
            rows += target_rows
            plain_rows.append([f"{batch_ms:.0f} ms", len(plain_saves), _common.median(plain_saves),
                               _common.percentile(plain_saves, 95), max(plain_saves)])
            summary.append(f"{batch_ms:.0f} ms batches: acted p95 {worst['acted']:.1f} ms, effect p95 {worst['excess']:.1f} ms")
            del model
    print("\nms, medians unless marked. latency: write to effect; remaining: write to the next batch boundary; "
          "acted: boundary to the command taken by the training thread;\nwork: command taken to effect (the "
          "checkpoint; for stop also the end of fit); excess: latency - remaining = acted + work "
          f"(goal: <= {GOAL_EXCESS_MS:.0f} ms)")
    _common.print_table(
        ["batch", "command", "n", "latency", "remaining", "acted", "acted p95", "acted max", "work",
         "excess", "excess p95", "excess max"], rows
    )
    print("\nFor comparison: a plain model.save of the same model after each fit (ms)")
    _common.print_table(["batch", "n", "median", "p95", "max"], plain_rows)
    _common.print_summary(f"latency: {'; '.join(summary)} (beyond the batch in flight; goal <= {GOAL_EXCESS_MS:.0f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
