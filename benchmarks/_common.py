"""What the benchmarks share: setup, models, alternation, statistics, output.

Every benchmark compares variants inside one process, alternating them round
after round in a rotating order, so that a noisy machine (other processes,
CPU frequency, page-cache writeback) slows every variant alike. It reports
medians of the rounds and the median of the per-round ratios, never a single
run, and ends with one line starting with ``SUMMARY`` that states the ratios.

Import this module before Keras: `prepare_environment` sets the backend and
quiets TensorFlow's start-up logging.

Example:

>>> from _common import alternate, median                   # doctest: +SKIP
>>> times = alternate({"a": run_a, "b": run_b}, rounds=7)   # doctest: +SKIP
>>> median(times["b"]) / median(times["a"])                 # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

__all__ = [
    "REPO",
    "prepare_environment",
    "make_parser",
    "add_backend_option",
    "parse_args",
    "scratch_folder",
    "rotation",
    "alternate",
    "median",
    "percentile",
    "paired_ratios",
    "print_table",
    "print_summary",
    "dense_model",
    "train_one_step",
    "BatchClock",
    "wait_for",
]

REPO = Path(__file__).resolve().parent.parent
SUMMARY_PREFIX = "SUMMARY"


def prepare_environment() -> None:
    """Picks the TensorFlow backend, quiets its logs, and makes the checkout
    importable (so the benchmarks run from a clone without installing)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


def make_parser(description: str, *, rounds: int, quick_rounds: int) -> argparse.ArgumentParser:
    """Returns an argument parser with the options every benchmark has.

    Args:
        description: What the benchmark measures (its module docstring).
        rounds: Default number of measured rounds.
        quick_rounds: Rounds used by ``--quick``.

    Returns:
        A parser with ``--quick``, ``--rounds``, ``--seed`` and ``--dir``;
        the caller may add options. After parsing, ``args.rounds`` is set.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds (used by the tests)")
    parser.add_argument("--rounds", type=int, default=None, help=f"measured rounds (default {rounds}; {quick_rounds} with --quick)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random moments and models (default 0)")
    parser.add_argument("--dir", default=None, help="folder for scratch files (default: a new temporary folder)")
    parser.set_defaults(_rounds=(rounds, quick_rounds))
    return parser


def add_backend_option(parser: argparse.ArgumentParser) -> None:
    """Adds ``--backend``: one Keras backend, by default ``KERAS_BACKEND``
    (tensorflow where it is not set: `prepare_environment`)."""
    parser.add_argument("--backend", default=os.environ["KERAS_BACKEND"], choices=("tensorflow", "jax", "torch"),
                        help="the Keras backend (default: KERAS_BACKEND, else tensorflow)")


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses `argv` and fills in ``args.rounds`` from ``--quick``."""
    args = parser.parse_args(argv)
    full, quick = args._rounds
    if args.rounds is None:
        args.rounds = quick if args.quick else full
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}.")
    return args


@contextlib.contextmanager
def scratch_folder(parent: str | None, prefix: str) -> Iterator[Path]:
    """A temporary folder with its own Jupyter runtime dir, removed afterwards.

    Runs started by a benchmark are listed under this runtime dir, not among
    the user's runs.

    Args:
        parent: Where to create it. Defaults to the system's temp folder.
        prefix: Start of the folder's name.
    """
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    runtime = folder / "runtime"
    runtime.mkdir(mode=0o700)
    previous = os.environ.get("JUPYTER_RUNTIME_DIR")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(runtime)
    try:
        yield folder
    finally:
        _join_run_threads()  # a run's thread may still free its files (chores left to it as the run closed)
        if previous is None:
            os.environ.pop("JUPYTER_RUNTIME_DIR", None)
        else:
            os.environ["JUPYTER_RUNTIME_DIR"] = previous
        shutil.rmtree(folder, ignore_errors=True)


def _join_run_threads(timeout: float = 30.0) -> None:
    """Waits for the threads of the package's runs (``traincontrol-*``) to end."""
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name.startswith("traincontrol-") and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


def rotation(names: Sequence[str], rounds: int, warmup: int = 1) -> list[tuple[int, str, bool]]:
    """The order in which to run variants: every round runs each once.

    Round r starts with variant ``r % len(names)``, so no variant always
    runs first (after a pause) or last (after the others warmed caches).

    Args:
        names: The variants.
        rounds: Measured rounds.
        warmup: Leading rounds whose results are discarded.

    Returns:
        ``(round, name, is_warmup)`` in running order; measured rounds are
        numbered from 0, warm-up rounds are negative.
    """
    schedule = []
    for index in range(warmup + rounds):
        shift = index % len(names)
        for name in [*names[shift:], *names[:shift]]:
            schedule.append((index - warmup, name, index < warmup))
    return schedule


def alternate(
    variants: Mapping[str, Callable[[], float]], rounds: int, warmup: int = 1, label: str = ""
) -> dict[str, list[float]]:
    """Runs each variant once per round, in rotating order.

    Args:
        variants: Name to a function that runs the variant once and returns
            the measured value (seconds).
        rounds: Measured rounds.
        warmup: Rounds run first and discarded.
        label: Shown in the progress line on stderr.

    Returns:
        Name to the list of measured values, one per round, in round order.
    """
    results: dict[str, list[float]] = {name: [] for name in variants}
    schedule = rotation(list(variants), rounds, warmup)
    for done, (round_index, name, warming) in enumerate(schedule, 1):
        value = variants[name]()
        if not warming:
            results[name].append(value)
        _progress(f"{label} {done}/{len(schedule)}")
    _progress("", end=True)
    return results


def _progress(text: str, end: bool = False) -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r" + text.ljust(60) + ("\n" if end else ""))
        sys.stderr.flush()


def median(values: Sequence[float]) -> float:
    """The median (NaN for no values)."""
    return statistics.median(values) if values else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0-100), linearly interpolated; NaN for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def paired_ratios(results: Mapping[str, Sequence[float]], base: str) -> dict[str, list[float]]:
    """Per-round ratios of each variant to `base` (measured in the same round)."""
    return {
        name: [value / reference for value, reference in zip(values, results[base])]
        for name, values in results.items()
    }


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Prints a plain-text table with right-aligned columns after the first."""
    cells = [[str(h) for h in headers]] + [[_cell(value) for value in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for line_number, row in enumerate(cells):
        parts = [row[0].ljust(widths[0])] + [row[i].rjust(widths[i]) for i in range(1, len(row))]
        print("  ".join(parts).rstrip())
        if line_number == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()


def _cell(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def print_summary(text: str) -> None:
    """Prints the one-line summary the benchmark ends with."""
    print(f"{SUMMARY_PREFIX} {text}", flush=True)


def run_per_backend(script: str, argv: Sequence[str], backends: Sequence[str]) -> list[str] | int:
    """Runs benchmark `script` once per backend, each in a new process with
    ``--backend`` and ``KERAS_BACKEND`` set, passing its output through as
    it comes (a summary line as ``BACKEND: its text``).

    Returns:
        Each run's summary line, without `SUMMARY_PREFIX` and its own
        ``label: `` (in the order of `backends`); or, if a run failed, its
        exit status (after saying so on stderr).
    """
    import subprocess

    argv = [arg for index, arg in enumerate(argv)
            if not arg.startswith("--backend") and not (index and argv[index - 1] == "--backend")]
    summaries = []
    for backend in backends:
        print(f"\n=== backend: {backend} ===", flush=True)
        child = subprocess.Popen([sys.executable, script, *argv, "--backend", backend], text=True,
                                 stdout=subprocess.PIPE, env={**os.environ, "KERAS_BACKEND": backend})
        for line in child.stdout:
            if line.startswith(SUMMARY_PREFIX):
                text = line[len(SUMMARY_PREFIX):].strip()
                summaries.append(text.split(": ", 1)[-1])
                print(f"{backend}: {text}", flush=True)
            else:
                print(line, end="", flush=True)
        if child.wait() != 0:
            print(f"{os.path.basename(script)} --backend {backend} failed (exit status {child.returncode}).",
                  file=sys.stderr)
            return child.returncode
    return summaries


def dense_model(inputs: int, widths: Sequence[int], outputs: int = 1, *, bias: bool = True, seed: int = 0):
    """A compiled MLP (relu hidden layers, Adam, MSE).

    Args:
        inputs: Input features.
        widths: Units of each hidden layer.
        outputs: Units of the output layer.
        bias: Whether layers have biases.
        seed: Seed of the initial weights.
    """
    import keras

    keras.utils.set_random_seed(seed)
    layers = [keras.Input((inputs,))]
    layers += [keras.layers.Dense(width, activation="relu", use_bias=bias) for width in widths]
    layers.append(keras.layers.Dense(outputs, use_bias=bias))
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    return model


def train_one_step(model, batch_size: int = 1) -> None:
    """Trains one batch of zeros, so the optimizer state exists and is saved."""
    import numpy as np

    x = np.zeros((batch_size, model.input_shape[-1]), "float32")
    y = np.zeros((batch_size, model.output_shape[-1]), "float32")
    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0)


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.0005) -> object:
    """Polls `predicate` until truthy; raises TimeoutError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"Timed out after {timeout} s waiting for {what}.")
        time.sleep(interval)


class BatchClock:
    """Records when the training thread reaches each command-checking hook.

    Put it *before* `ControlCallback` in the callbacks list: its hooks then
    run just before the control callback checks for a waiting command, so
    its timestamps are the moments a queued command can be acted on.
    """

    def __new__(cls):
        import keras

        class _BatchClock(keras.callbacks.Callback):
            """Keeps ``time.perf_counter()`` of every batch boundary."""

            def __init__(self):
                super().__init__()
                self.times: list[float] = []

            def _mark(self, *args, **kwargs):
                self.times.append(time.perf_counter())

            on_epoch_begin = on_train_batch_end = on_epoch_end = on_test_batch_end = _mark

            def first_after(self, moment: float) -> float | None:
                """The first boundary at or after `moment`, or None."""
                import bisect

                index = bisect.bisect_left(self.times, moment)
                return self.times[index] if index < len(self.times) else None

        return _BatchClock()
