"""Where a short `fit`'s control cost goes: a reused `ControlCallback`'s hooks, part by part.

`overhead.py --short-fits` measures what a run each `fit` adds to a 2-batch
`fit` (about 2 ms here, against a goal of 1 ms). This benchmark says where
the training thread's share of it goes. One `ControlCallback` is reused for
many 2-batch fits (a run each fit, ``save_at_end=False``, as code that calls
`fit` in a loop has it); its hooks are timed, and so are the parts of the
package they call that touch the file system or start a thread, each
wrapped by a timer that counts only calls on the training thread:

- the run's record written (`RunFolder.write_record`): once as the run
  opens (senders find it as `fit` starts), once as it closes (its final
  state, on disk when `fit` returns);
- the checkpoint folder taken (`CheckpointStore.acquire`: made, checked
  and locked before the first step, so a folder another run holds fails
  the `fit` at once) and let go (`CheckpointStore.release`: removed again
  when the run left it empty);
- the command channel: its FIFO made and opened (`FifoChannel.__init__`),
  the run's thread started (`RunThread.start`), its end
  (`RunThread.end`);
- the epoch hooks (the random states as the epoch began, for exact
  resume; the steered values into the epoch's logs).

"the rest" is the hooks' time less those parts: the Python work of opening
and closing the parts of a run. Reported: the median per fit of each, over
``--rounds`` fits (default 300) after 20 fits of warm-up, on one backend
(``--backend``; default ``KERAS_BACKEND``, else tensorflow).

Usage::

    python benchmarks/short_fit_parts.py --backend jax         # 300 fits, ~10 s
    python benchmarks/short_fit_parts.py --backend tensorflow
    python benchmarks/short_fit_parts.py --quick               # a smoke run
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

_common.prepare_environment()

BATCH_SIZE = 32
FEATURES = 32
WARMUP_FITS = 20
HOOKS = ("on_train_begin", "on_epoch_begin", "on_train_batch_begin", "on_train_batch_end", "on_epoch_end",
         "on_train_end")
EPOCH_HOOKS = ("on_epoch_begin", "on_epoch_end")


def package_parts() -> list[tuple[str, type, str]]:
    """``(label, class, method)`` of each part of the package timed."""
    from jupyter_traincontrol.checkpoint import CheckpointStore
    from jupyter_traincontrol.registry import RunFolder
    from jupyter_traincontrol.run.run_thread import RunThread
    from jupyter_traincontrol.transport.fifo import FifoChannel

    return [("record writes", RunFolder, "write_record"),
            ("checkpoint folder taken", CheckpointStore, "acquire"),
            ("checkpoint folder let go", CheckpointStore, "release"),
            ("FIFO made", FifoChannel, "__init__"),
            ("run's thread started", RunThread, "start"),
            ("channel ended", RunThread, "end")]


class Clock:
    """Seconds spent in wrapped callables, by label, on one thread only.

    Args:
        thread: The ident of the thread whose calls count (the training thread).
    """

    def __init__(self, thread: int):
        self.thread = thread
        self.spent: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._undo: list = []

    def wrap(self, owner, name: str, label: str) -> None:
        """Times ``owner.name`` (a class's method, or an object's bound one) under `label`."""
        own = name in vars(owner)
        method = getattr(owner, name)

        @functools.wraps(method)
        def timed(*args, **kwargs):
            if threading.get_ident() != self.thread:
                return method(*args, **kwargs)
            begin = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.spent[label] += time.perf_counter() - begin
                self.calls[label] += 1

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, method) if own else delattr(owner, name))

    def take(self) -> tuple[dict[str, float], dict[str, int]]:
        """What was spent since the last `take`, and how many calls."""
        taken = dict(self.spent), dict(self.calls)
        self.spent.clear()
        self.calls.clear()
        return taken

    def unwrap(self) -> None:
        """Puts every wrapped callable back."""
        while self._undo:
            self._undo.pop()()


def measure(args) -> dict[str, list[float]]:
    """Per fit, the seconds of the hooks and of each part (lists, one entry a fit)."""
    os.environ["KERAS_BACKEND"] = args.backend
    import numpy as np

    from jupyter_traincontrol import ControlCallback

    rng = np.random.default_rng(args.seed)
    x = rng.random((BATCH_SIZE * 2, FEATURES), dtype="float32")
    y = x.sum(axis=1, keepdims=True)
    model = _common.dense_model(FEATURES, [16, 16], seed=args.seed)
    per_fit: dict[str, list[float]] = defaultdict(list)
    with _common.scratch_folder(args.dir, "traincontrol-bench-parts-") as scratch:
        callback = ControlCallback(save_at_end=False, name="bench-parts", checkpoint_dir=scratch / "ck", verbose=False)
        fit = functools.partial(model.fit, x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0, callbacks=[callback])
        for _ in range(2 if args.quick else WARMUP_FITS):
            fit()
        clock, parts = Clock(threading.get_ident()), package_parts()
        for label, owner, name in parts:
            clock.wrap(owner, name, label)
        for hook in HOOKS:
            clock.wrap(callback, hook, "epoch hooks" if hook in EPOCH_HOOKS else "other hooks")
        try:
            for _ in range(args.rounds):
                fit()
                spent, calls = clock.take()
                per_fit["hooks"].append(spent["epoch hooks"] + spent["other hooks"])
                per_fit["the rest"].append(spent["other hooks"] - sum(spent[label] for label, _, _ in parts))
                per_fit["epoch hooks"].append(spent["epoch hooks"])
                per_fit["record writes (calls)"].append(calls["record writes"])
                for label, _, _ in parts:
                    per_fit[label].append(spent[label])
        finally:
            clock.unwrap()
    return per_fit


def main(argv=None) -> int:
    parser = _common.make_parser(__doc__, rounds=300, quick_rounds=5)
    _common.add_backend_option(parser)
    args = _common.parse_args(parser, argv)
    per_fit = measure(args)
    medians = {label: _common.median(values) for label, values in per_fit.items()}
    order = ["record writes", "checkpoint folder taken", "checkpoint folder let go", "FIFO made", "run's thread started",
             "channel ended", "epoch hooks", "the rest", "hooks"]
    print(f"a reused ControlCallback, {args.rounds} 2-batch fits on {args.backend}: the training thread's time, "
          f"medians per fit")
    _common.print_table(["part", "ms a fit"], [[label, f"{medians[label] * 1e3:.3f}"] for label in order])
    writes = int(medians["record writes (calls)"])
    folder = medians["checkpoint folder taken"] + medians["checkpoint folder let go"]
    channel = medians["FIFO made"] + medians["run's thread started"] + medians["channel ended"]
    _common.print_summary(
        f"short_fit_parts: a reused ControlCallback on {args.backend}: hooks {medians['hooks'] * 1e3:.2f} ms a fit: "
        f"record writes {medians['record writes'] * 1e3:.2f} ({writes}), checkpoint folder {folder * 1e3:.2f}, "
        f"FIFO and thread {channel * 1e3:.2f}, epoch hooks {medians['epoch hooks'] * 1e3:.2f}, "
        f"the rest {medians['the rest'] * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
