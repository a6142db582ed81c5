"""How long a `save` command holds the training thread, against a plain `model.save`.

For models whose checkpoint file is about 1 MB, 50 MB and 500 MB (one Dense
layer trained with Adam, so the file holds the weights and the optimizer's
two moment tensors), one real `fit` runs with the callbacks
``[probe, ControlCallback, stopwatch]``. At each measured batch boundary the
probe either

- ``model.save``: calls ``model.save(path)`` itself and times it, always to
  the same path, overwritten (what `ModelCheckpoint` with a fixed path
  does); or
- ``model.save, new file``: the same to a new file each time, the previous
  one deleted afterwards, untimed (what ``ModelCheckpoint("ckpt-{epoch}.keras")``
  does, and like for like with ours, which must write a new file); or
- ``save command``: writes ``save`` to the run's FIFO, waits until the
  reader thread has queued it, and starts a clock that the stopwatch stops
  right after `ControlCallback`'s batch hook: exactly the time the training
  thread is held. By default that is the snapshot (a host copy of the
  variables, `ModelSnapshot.take`); the checkpoint (staging, sidecar,
  renames, flushes, pruning to keep=3) is written by the writer thread,
  which the probe lets finish (untimed) before the next round, so plain
  saves never compete with it. With ``--foreground`` the run saves on the
  training thread (``save_in_background=False``), as before.

Memory: in a separate short fit (untimed), a thread samples the process's
resident memory every 2 ms around a plain ``model.save``, the first save
command (its host copy is mapped then) and a later one (which reuses it):
the peak above the level before each, and what stays resident once the
write is done (the host copy the run keeps for its next save).

The two alternate, round after round, in two spacings: ``written-back``
(before each measured save, `os.sync` has the kernel write all dirty data,
untimed, as it does by itself within about 30 s: how saves minutes apart
find the disk) and ``back-to-back`` (saves a batch apart: the worst case).
Then `CheckpointStore.save` alone is profiled (cProfile) to show what its
time is made of.

With ``--peers`` it measures instead our background save beside the best
async checkpointer of each backend (TensorFlow's async ``tf.train.Checkpoint``,
JAX's Orbax ``CheckpointManager``, PyTorch's Distributed Checkpoint
``async_save``), each backend in a process of its own:
the training thread's hold, the steps right after and during the write,
and the memory kept (`checkpoint_peers`).

Usage::

    python benchmarks/checkpoint_cost.py               # 1, 50 and 500 MB, both spacings, 11 rounds
    python benchmarks/checkpoint_cost.py --peers       # 50 and 500 MB, each backend beside its peer
    python benchmarks/checkpoint_cost.py --sizes 1,50 --spacing back-to-back
    python benchmarks/checkpoint_cost.py --quick       # 1 MB, written-back, 2 rounds (a smoke run)
"""

from __future__ import annotations

import cProfile
import math
import os
import pstats
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

_common.prepare_environment()

GOAL_RATIO = 0.2  # held by a background save, against a plain model.save
GOAL_RATIO_FOREGROUND = 1.1
VARIANTS = ("model.save", "model.save, new file", "save command")


def model_with_file_size(megabytes: float, seed: int = 0):
    """A one-layer model whose `.keras` file (weights + Adam moments) has about `megabytes` MB."""
    units = max(8, round(math.sqrt(megabytes * 1e6 / (3 * 4))))  # 3 float32 tensors of units^2
    model = _common.dense_model(units, [], outputs=units, bias=False, seed=seed)
    _common.train_one_step(model)
    return model


def measure_hold_times(model, folder: Path, rounds: int, written_back: bool, background: bool = True,
                       keep: int = 3) -> dict[str, list[float]]:
    """Alternates plain saves and save commands inside one real `fit`.

    Args:
        model: The model to train and save.
        folder: Scratch folder for this measurement.
        rounds: Measured rounds (one of each variant per round).
        written_back: Before each measured save, have the kernel write all
            dirty data to disk (`os.sync`, not timed), as it does by itself
            within about 30 s: each save then starts the way it does in a
            real run whose checkpoints are minutes apart. Otherwise the saves
            follow each other a batch apart (the worst case).
        keep: The run's ``keep`` (3; less for files of gigabytes).

    Returns:
        Variant name to the measured seconds, one per round, and
        ``"model.save in command"``: the part of each held time spent in
        the `model.save` call that `CheckpointStore.save` makes (timed by
        wrapping the model's `save`), so that ``held - model.save in
        command`` is the cost of the protocol itself, free of the noise of
        `model.save`.
    """
    import keras
    import numpy as np

    from jupyter_traincontrol import ControlCallback
    from jupyter_traincontrol.transport.channels import deliver

    schedule = _common.rotation(list(VARIANTS), rounds, warmup=1)
    control = ControlCallback(name="bench-checkpoint", checkpoint_dir=folder / "checkpoints", keep=keep, verbose=False,
                              handle_sigint=False, save_in_background=background,
                              save_at_end=False)  # the saves measured are the commands'; no end checkpoint
    checkpoint_events = []
    results: dict[str, list[float]] = {name: [] for name in [*VARIANTS, "model.save in command"]}
    plain_path = folder / "plain" / "model.keras"
    plain_path.parent.mkdir()
    started = {}
    real_save = model.save
    inner_saves = []
    snapshot_bytes = results.setdefault("snapshot bytes", [])

    def timed_save(path):
        begin = time.perf_counter()
        real_save(path)
        inner_saves.append(time.perf_counter() - begin)

    class Probe(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.index = 0

        def on_train_batch_end(self, batch, logs=None):
            if self.index >= len(schedule):
                return
            _round, name, warming = schedule[self.index]
            self.index += 1
            self.model  # on JAX, brings the trainer's state into the variables (model.save reads them), untimed
            control.session.actions.saves._writer.wait()  # the previous background write ends first (untimed)
            if written_back:
                os.sync()
            if name == "model.save":
                begin = time.perf_counter()
                real_save(plain_path)
                if not warming:
                    results[name].append(time.perf_counter() - begin)
            elif name == "model.save, new file":
                path = plain_path.with_name(f"model-{self.index}.keras")
                begin = time.perf_counter()
                real_save(path)
                if not warming:
                    results[name].append(time.perf_counter() - begin)
                for old in plain_path.parent.glob("model-*.keras"):
                    if old != path:
                        old.unlink()
            else:
                inner_saves.clear()
                deliver(control.fifo, "save")
                _common.wait_for(lambda: control.lifecycle.channel.pending, 10, "the save command to be queued")
                started["at"], started["warming"] = time.perf_counter(), warming

    class Stopwatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if "at" in started:
                held = time.perf_counter() - started.pop("at")
                if not started.pop("warming"):
                    results["save command"].append(held)
                    results["model.save in command"].append(sum(inner_saves))

    def on_event(_control, event):
        if event is not None and event["kind"] == "checkpoint":
            checkpoint_events.append(event)

    control.lifecycle.add_listener(on_event)
    units = model.input_shape[-1]
    x = np.zeros((len(schedule) + 1, units), "float32")
    model.save = timed_save  # an instance attribute: shadows the method
    try:
        model.fit(x, x, batch_size=1, epochs=1, shuffle=False, verbose=0, callbacks=[Probe(), control, Stopwatch()])
        snapshot_bytes.append(_snapshot_bytes(model))
    finally:
        del model.save
    expected = sum(1 for _r, name, _w in schedule if name == "save command")
    if len(checkpoint_events) != expected or len(results["save command"]) != rounds:
        raise RuntimeError(f"Expected {expected} checkpoints, the run wrote {len(checkpoint_events)}: {list(control.lifecycle.journal.events)}")
    return results


class ResidentMemory:
    """Samples this process's resident memory (RSS) on a thread, for peaks.

    Example:

    >>> with ResidentMemory() as memory:          # doctest: +SKIP
    ...     base = memory.mark(); work(); peak = memory.peak_since_mark() - base
    """

    PAGE = os.sysconf("SC_PAGE_SIZE")

    def __init__(self, interval: float = 0.002):
        self._interval = interval
        self._peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-rss", daemon=True)

    @classmethod
    def now(cls) -> int:
        """Resident bytes now."""
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * cls.PAGE

    def mark(self) -> int:
        """Starts a new peak; returns the resident bytes now."""
        self._peak = now = self.now()
        return now

    def peak_since_mark(self) -> int:
        """The highest resident bytes seen since `mark` (now included)."""
        self._peak = max(self._peak, self.now())
        return self._peak

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self._peak = max(self._peak, self.now())

    def __enter__(self) -> "ResidentMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def measure_memory(model, folder: Path) -> dict[str, float]:
    """Resident memory around a plain save and two save commands (bytes).

    Returns:
        ``model.save peak``, ``first save peak``, ``later save peak`` (each
        the peak above the level just before it), ``kept after write`` (the
        level once the later save's write is done, above the level before
        the first save command) and ``host copy`` (bytes of the arrays the
        run keeps).
    """
    import keras
    import numpy as np

    from jupyter_traincontrol import ControlCallback
    from jupyter_traincontrol.transport.channels import deliver

    control = ControlCallback(name="bench-memory", checkpoint_dir=folder / "checkpoints", keep=3, verbose=False,
                              handle_sigint=False, save_at_end=False)
    found: dict[str, float] = {}
    if not hasattr(os, "sysconf") or not os.path.exists("/proc/self/statm"):
        return found

    class Probe(keras.callbacks.Callback):
        def __init__(self, memory: ResidentMemory):
            super().__init__()
            self.memory, self.step, self.base, self.before_first = memory, 0, 0, 0

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            writer = control.session.actions.saves._writer
            if self.step in (2, 3):  # the save command of the step before has been taken: wait for its write
                writer.wait()
                name = "first save peak" if self.step == 2 else "later save peak"
                found[name] = self.memory.peak_since_mark() - self.base
            if self.step == 3:
                found["kept after write"] = self.memory.now() - self.before_first
                found["host copy"] = control.session.actions.saves._buffers.nbytes
            if self.step == 1:
                self.base = self.memory.mark()
                self.model.save(folder / "plain.keras")
                found["model.save peak"] = self.memory.peak_since_mark() - self.base
            if self.step in (1, 2):
                if self.step == 1:
                    self.before_first = self.memory.now()
                self.base = self.memory.mark()
                deliver(control.fifo, "save")
                _common.wait_for(lambda: control.lifecycle.channel.pending, 10, "the save command to be queued")

    units = model.input_shape[-1]
    x = np.zeros((4, units), "float32")
    with ResidentMemory() as memory:
        model.fit(x, x, batch_size=1, epochs=1, shuffle=False, verbose=0, callbacks=[Probe(memory), control])
    return found


def _snapshot_bytes(model) -> float:
    """Bytes of the host copy a background save holds while it is written."""
    from jupyter_traincontrol.state import ModelSnapshot

    snapshot = ModelSnapshot.take(model)
    try:
        return float(snapshot.nbytes)
    finally:
        snapshot.release()


def _cumulative(stats, funcname: str, file_end: str, *, caller: str | None = None) -> float:
    """Seconds spent in (and below) the functions called `funcname` defined in
    a file ending in `file_end`; with `caller`, only in calls made directly
    by functions of that name in the store (``store.py``)."""
    total = 0.0
    for key, (_cc, _nc, _tt, cumulative, callers) in stats.items():
        if key[2] != funcname or not key[0].endswith(file_end):
            continue
        if caller is None:
            total += cumulative
        else:
            total += sum(v[3] for k, v in callers.items() if k[2] == caller and k[0].endswith("store.py"))
    return total


def split_parts(stats) -> dict[str, float]:
    """Splits a profiled `CheckpointStore.save` into its parts (seconds).

    The names are those of `CheckpointStore`'s steps: staging (`_write_staged`:
    intent record, staging folder, ``model.save``, sidecar, two renames), and
    around it the folder check, the scan and the next name, flushing the
    previous checkpoint and pruning (`_flush_previous`, `_prune`; their
    fsyncs are in "flush").
    """
    ours = "store.py"

    def staged(funcname, file_end="~"):
        return _cumulative(stats, funcname, file_end, caller="_write_staged")

    flush = _cumulative(stats, "_flush", ours)
    parts = {
        "model.save": _cumulative(stats, "save", os.path.join("keras", "src", "models", "model.py")),
        "sidecar write": staged("_write_new_file", ours),
        "renames": staged("<built-in method posix.rename>"),
        "staging folder": staged("<built-in method posix.mkdir>") + staged("<built-in method posix.rmdir>"),
        "intent record": staged("_record_intent", "folder.py"),
        "flush (fsync)": flush,
        "check, scan, prune": sum(_cumulative(stats, name, ours, caller="_save")
                                  for name in ("_check_folder", "_scan_fd", "_free_name", "_flush_previous", "_prune"))
        - flush,
    }
    total = _cumulative(stats, "save", ours)
    parts["other"] = total - sum(parts.values())
    parts["total"] = total
    return parts


def profile_parts(model, folder: Path, rounds: int, written_back: bool) -> dict[str, list[float]]:
    """Profiles `CheckpointStore.save` and splits its time with `split_parts`.

    Returns:
        Part name to seconds, one per save.
    """
    from jupyter_traincontrol.checkpoint import CheckpointStore, TrainingPosition

    store = CheckpointStore(folder / "profiled", keep=3)
    parts: dict[str, list[float]] = {}
    for step in range(store.keep + rounds):  # the first `keep` saves prune nothing
        if written_back:
            os.sync()
        profiler = cProfile.Profile()
        profiler.enable()
        store.save(model, TrainingPosition(epoch=0, step_in_epoch=step), reason="save")
        profiler.disable()
        if step >= store.keep:
            for name, seconds in split_parts(pstats.Stats(profiler).stats).items():
                parts.setdefault(name, []).append(seconds)
    return parts


SPACINGS = {"written-back": True, "back-to-back": False}
MEMORY_COLUMNS = ("model.save peak", "first save peak", "later save peak", "kept after write", "host copy")


PEER_BACKENDS = ("tensorflow", "jax", "torch")


def run_peers(args, argv) -> int:
    """``--peers``: each backend in its own process (``--backend all``), or this one."""
    if args.backend == "all":
        summaries = _common.run_per_backend(__file__, argv, PEER_BACKENDS)
        if isinstance(summaries, int):
            return summaries
        _common.print_summary("checkpoint_cost: " + " | ".join(summaries) + " (goal: held <= 1.00x the peer, "
                              "during write <= 1.1x)")
        return 0
    os.environ["KERAS_BACKEND"] = args.backend  # before Keras is imported
    import checkpoint_peers

    sizes = [1.0] if args.quick else [float(s) for s in (args.sizes or "50,500").split(",")]
    with _common.scratch_folder(args.dir, "traincontrol-bench-ckpt-") as scratch:
        summary = checkpoint_peers.report(sizes, model_with_file_size, scratch, args.rounds,
                                          args.spacing != "back-to-back", args.seed)
    _common.print_summary(f"checkpoint_cost: {summary}")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _common.make_parser(__doc__, rounds=11, quick_rounds=2)
    parser.add_argument("--sizes", default=None, help="checkpoint sizes in MB, comma-separated (default 1,50,500; "
                                                      "50,500 with --peers)")
    parser.add_argument("--peers", action="store_true",
                        help="our background save beside the backend's async checkpointer (TF async, Orbax, torch DCP)")
    parser.add_argument("--backend", choices=[*PEER_BACKENDS, "all"], default="all",
                        help="with --peers: the backend to measure; all: each in its own process (default all)")
    parser.add_argument("--foreground", action="store_true",
                        help="save on the training thread (save_in_background=False), as before background saves")
    parser.add_argument("--spacing", choices=[*SPACINGS, "both"], default="both",
                        help="start each save with everything written back, or save back to back (default both)")
    args = _common.parse_args(parser, argv)
    if args.peers:
        return run_peers(args, argv)
    sizes = [1.0] if args.quick else [float(s) for s in (args.sizes or "1,50,500").split(",")]
    spacings = ["written-back"] if args.quick else list(SPACINGS) if args.spacing == "both" else [args.spacing]

    summary = []
    with _common.scratch_folder(args.dir, "traincontrol-bench-ckpt-") as scratch:
        print(f"checkpoint_cost: {args.rounds} rounds per size and spacing, variants alternating in one fit; in {scratch}")
        rows, part_rows, memory_rows, summary_memory = [], [], [], []
        for megabytes in sizes:
            model = model_with_file_size(megabytes, seed=args.seed)
            for spacing in spacings:
                folder = scratch / f"{megabytes:g}MB-{spacing}"
                folder.mkdir()
                times = measure_hold_times(model, folder, args.rounds, SPACINGS[spacing], background=not args.foreground)
                file_mb = os.path.getsize(folder / "plain" / "model.keras") / 1e6
                ratios = _common.paired_ratios(times, "model.save")["save command"]
                new_file_ratios = _common.paired_ratios(times, "model.save, new file")["save command"]
                plain, ours = _common.median(times["model.save"]), _common.median(times["save command"])
                new_file = _common.median(times["model.save, new file"])
                protocol = _common.median([h - m for h, m in zip(times["save command"], times["model.save in command"])])
                if not args.foreground:  # no model.save on the training thread: the held time is the snapshot
                    protocol = math.nan
                ratio, new_file_ratio = _common.median(ratios), _common.median(new_file_ratios)
                rows.append([f"{file_mb:.1f} MB", times["snapshot bytes"][0] / 1e6 if not args.foreground else 0.0, spacing, plain * 1e3, new_file * 1e3, ours * 1e3,
                             ratio, new_file_ratio, f"{min(new_file_ratios):.2f}-{max(new_file_ratios):.2f}",
                             protocol * 1e3, 1 + protocol / plain])
                summary.append(f"{file_mb:.0f}MB {spacing} {ratio:.2f}x / {new_file_ratio:.2f}x"
                               + ("" if math.isnan(protocol) else f" (protocol {1 + protocol / plain:.2f}x)"))
            if not args.foreground:
                memory_folder = scratch / f"{megabytes:g}MB-memory"
                memory_folder.mkdir()
                found = measure_memory(model, memory_folder)
                if found:
                    memory_rows.append([f"{file_mb:.1f} MB"] + [found[name] / 1e6 for name in MEMORY_COLUMNS])
                    summary_memory.append(f"{file_mb:.0f}MB copy {found['host copy'] / 1e6:.0f} MB "
                                          f"(peak {found['first save peak'] / 1e6:.0f} MB vs model.save "
                                          f"{found['model.save peak'] / 1e6:.0f} MB)")
            parts = profile_parts(model, scratch / f"{megabytes:g}MB-{spacings[0]}", max(2, args.rounds // 2),
                                  SPACINGS[spacings[0]])
            part_rows.append([f"{file_mb:.1f} MB"] + [_common.median(seconds) * 1e3 for seconds in parts.values()])
            del model
        print("\nTraining thread held (ms, medians). Ratios: medians of the per-round ratios of the save command to "
              "model.save (overwrite) and to model.save (new file), with the range of the latter.\n"
              "protocol (--foreground only): held time minus the model.save inside it (median); protocol ratio: 1 + protocol / "
              "model.save.")
        _common.print_table(
            ["file", "snapshot MB", "spacing", "model.save", "new file", "save command", "ratio", "ratio new", "range new",
             "protocol", "protocol ratio"], rows
        )
        if memory_rows:
            print("\nResident memory (MB): peak above the level just before a plain model.save, the first save command "
                  "(its host copy is mapped) and a later one (reusing it), until its write is done; kept: resident "
                  "once the write is done, above the level before the first save command; host copy: the arrays "
                  "the run keeps for its next save (until fit ends).")
            _common.print_table(["file", *MEMORY_COLUMNS], memory_rows)
        print(f"\nCheckpointStore.save alone, profiled with cProfile ({spacings[0]}; ms, medians; cProfile slows Python code)")
        _common.print_table(["file", *parts], part_rows)
    _common.print_summary(
        "checkpoint_cost: save command / plain model.save (overwrite / new file) = "
        f"{', '.join(summary)} (goal <= {GOAL_RATIO_FOREGROUND if args.foreground else GOAL_RATIO}x)"
        + (f"; memory: {', '.join(summary_memory)}" if summary_memory else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
