"""The path of a command through the package, traced: modules, hops and re-entries.

Four paths, each into a real run (a tiny model, TensorFlow by default;
``--backend`` picks another) that trains on a thread of its own; at its
third batch (or item) the command is sent, in this process so it can be
traced:

- CLI ``stop`` and CLI ``abort``: the real CLI (``jupyter-traincontrol
  send NAME stop``) to a `fit` under `ControlCallback`;
- panel Stop click: a notebook run (`TrainingRun`, the run of an
  ``%%interruptible_fit`` cell: its code's `fit` on the cell's thread) and
  its `ControlPanel`, whose Stop button is clicked (``click()``: the
  handler a kernel calls for the browser's comm message, without a kernel);
- `TrainLoop` ``stop``: the CLI's ``stop`` to a custom loop (``model=``, a
  ``train_on_batch`` per item).

A profile hook (``sys.setprofile`` and ``threading.setprofile``) records
every call into a function of the package, per thread. The calls are then
cut into segments:

- sender: the CLI's own calls, from ``main`` to its return (the panel's:
  the click handler to its return);
- the run's thread (``run.run_thread``), from the read of the channel
  that brings the line to its return: decoding, queueing, telling the
  training (what the thread does between reads, the run's ticker and the
  channel's check, goes by the clock and is left out);
- run side: the training thread from the boundary that takes the command
  (the ``CommandActions.apply_pending`` that applies it) to its return,
  with the write on the writer thread it waits for (the whole write): the
  command taken, the checkpoint on disk, the acknowledgement in the record
  (written by the run's thread once woken: not counted);
- the driver's end: ``on_train_end`` to its return (a loop:
  ``LoopAdapter.close``, which ``TrainLoop.__exit__`` calls).

Dunder methods, properties, comprehensions and module bodies are left out
(every module of the package is imported before tracing). Consecutive
calls of one thread in one module are one hop (each thread's calls merged
on their own: how two threads interleaved does not count); a re-entry is a
hop into a module already visited in the segment. The whole command is
the sender, the run's thread's read and the run side together. The
figures are deterministic (the paths are traced with a long interpreter
switch interval, see `trace`):
each path is traced ``--rounds`` times (3; 1 with ``--quick``) and the
rounds must agree.

``docs/architecture.md`` shows the figures between the markers
``<!-- command-path:begin -->`` and ``<!-- command-path:end -->``;
``--write-docs`` rewrites that block, and the test suite (which runs
``--quick``) fails when it differs from what this prints.

Usage:
    python benchmarks/command_path.py               # the tables, 3 rounds
    python benchmarks/command_path.py --calls       # and every hop, in order
    python benchmarks/command_path.py --write-docs  # and the block in docs/architecture.md
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import os
import re
import sys
import threading
import time
from pathlib import Path

from _common import REPO, make_parser, parse_args, prepare_environment, print_summary, scratch_folder

prepare_environment()

import jupyter_traincontrol  # noqa: E402

ROOT = str(Path(jupyter_traincontrol.__file__).parent) + os.sep
_LEFT_OUT = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>", "<lambda>", "<module>")
DOCS = REPO / "docs" / "architecture.md"
BEGIN, END = "<!-- command-path:begin -->", "<!-- command-path:end -->"


@functools.cache
def _property_codes() -> frozenset:
    """The code objects of every property of the package's classes (left
    out). Imports every module of the package (Keras too): none is imported
    while a path is traced."""
    import importlib
    import pkgutil

    codes = set()
    for info in pkgutil.walk_packages(jupyter_traincontrol.__path__, "jupyter_traincontrol."):
        if info.name.endswith(("control.server", "control.server.handlers")):
            continue  # the REST server's modules (Tornado): on no traced path
        module = importlib.import_module(info.name)
        for _name, cls in inspect.getmembers(module, inspect.isclass):
            for attribute in vars(cls).values():
                if isinstance(attribute, property):
                    codes.update(f.__code__ for f in (attribute.fget, attribute.fset) if f is not None)
    return frozenset(codes)


class Tracer:
    """Records (order, thread, module, function) for every call into the
    package, and (order, thread, function) for every return."""

    def __init__(self):
        self.events: list[tuple[int, str, str, str]] = []
        self.returns: list[tuple[int, str, str]] = []
        self.recording = False
        self._skip = _property_codes()
        self._counter = iter(range(10**9))

    def __call__(self, frame, event, arg):
        if not self.recording or event not in ("call", "return"):
            return
        code = frame.f_code
        if not code.co_filename.startswith(ROOT) or code in self._skip:
            return
        name = code.co_qualname
        leaf = name.rsplit(".", 1)[-1]
        if leaf.startswith("__") and leaf.endswith("__") or leaf in _LEFT_OUT:
            return
        seq = next(self._counter)
        thread = threading.current_thread().name
        if event == "return":
            self.returns.append((seq, thread, name))
            return
        module = code.co_filename[len(ROOT):-3].replace(os.sep, ".").removesuffix(".__init__")
        self.events.append((seq, thread, module, name))

    def start(self) -> None:
        self.recording = True  # from the run's start: the read that brings the line may begin long before
        threading.setprofile(self)
        sys.setprofile(self)

    def stop(self) -> None:
        self.recording = False
        sys.setprofile(None)
        threading.setprofile(None)

    def mark(self) -> int:
        """A place in the order of the calls (before what comes next)."""
        return next(self._counter)

    def first_call(self, thread: str, name: str, after: int = -1) -> int:
        return next(seq for seq, t, _m, n in self.events if t == thread and n == name and seq > after)

    def first_return(self, thread: str, name: str, after: int = -1) -> int:
        return next(seq for seq, t, n in self.returns if t == thread and n == name and seq > after)


def hops(events) -> list[tuple[str, str, list[str]]]:
    """Consecutive calls of one thread in one module, merged: (thread, module, functions),
    in the order they began. Each thread's calls are merged on their own, so how
    the scheduler interleaved two threads (the training thread and the writer it
    waits for) changes nothing."""
    merged: list[tuple[str, str, list[str]]] = []
    current: dict[str, tuple[str, str, list[str]]] = {}  # each thread's hop so far
    for _seq, thread, module, name in events:
        hop = current.get(thread)
        if hop is not None and hop[1] == module:
            hop[2].append(name)
        else:
            current[thread] = hop = (thread, module, [name])
            merged.append(hop)
    return merged


def counts(events) -> tuple[int, int, int]:
    """Modules, hops and re-entries of a segment."""
    seen, reentries = set(), 0
    path = hops(events)
    for _thread, module, _names in path:
        if module in seen:
            reentries += 1
        seen.add(module)
    return len(seen), len(path), reentries


# The paths --------------------------------------------------------------------------------------------------

#: Name, what is traced (for the tables).
PATHS = {
    "cli-stop": "CLI `stop`, `fit`",
    "cli-abort": "CLI `abort`, `fit`",
    "panel-stop": "panel Stop click, a notebook run's `fit`",
    "loop-stop": "CLI `stop`, `TrainLoop`",
}
SEGMENTS = ("sender", "run's thread: the read", "run side", "whole command", "driver's end")
_TRAINER = "trainer"
_BATCHES, _SEND_AT = 16, 2  # items of an epoch; the command goes during this one


def _data(seed: int):
    import numpy as np

    x = np.random.default_rng(seed).random((_BATCHES * 4, 3), dtype="float32")
    return x, x.sum(1)


def _model(seed: int):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def _slow_batches(began: threading.Event):
    """A callback that says when batch `_SEND_AT` begins, and slows every
    batch (the command arrives before that batch's end)."""
    import keras

    class SlowBatches(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == _SEND_AT:
                began.set()
            time.sleep(0.05)

    return SlowBatches()


def _send_from_cli(tracer: Tracer, name: str, command: str) -> tuple[str, str, int]:
    from jupyter_traincontrol.control.cli import main as cli

    sent = tracer.mark()
    with contextlib.redirect_stdout(io.StringIO()):  # "Sent stop to NAME."
        cli(["send", name, command])
    return threading.current_thread().name, "main", sent


def _first_save(folder: Path, seed: int) -> None:
    """A process's first checkpoint, untraced: it builds, once per process,
    the classes the save walk and the weights' writer use (Keras's
    ``H5IOStore`` subclassed), so every round traces a save that runs
    through, round 1 as the others."""
    from jupyter_traincontrol import ControlCallback

    model, (x, y) = _model(seed), _data(seed)
    control = ControlCallback(name="first-save", checkpoint_dir=str(folder / "first-save"), verbose=False,
                              handle_sigint=False)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[control])


def _fit_path(folder: Path, seed: int, command: str) -> dict[str, list]:
    """The CLI's `command` to a `fit` under `ControlCallback`."""
    from jupyter_traincontrol import ControlCallback

    name = f"traced-{command}"
    model, (x, y) = _model(seed), _data(seed)
    control = ControlCallback(name=name, checkpoint_dir=str(folder / name), verbose=False, handle_sigint=False)
    began = threading.Event()
    fit = lambda: model.fit(x, y, batch_size=4, epochs=3, verbose=0,  # noqa: E731
                            callbacks=[control, _slow_batches(began)])
    return _traced_from_cli(name, command, fit, began, "the fit's batch", "ControlCallback.on_train_end")


def _panel_path(folder: Path, seed: int) -> dict[str, list]:
    """A click on the Stop button of a notebook run's panel. In a notebook,
    the kernel calls the button's click handlers for the browser's comm
    message; here `Button.click()` calls them, on this thread."""
    from jupyter_traincontrol.notebook.panel import ControlPanel
    from jupyter_traincontrol.notebook.run import TrainingRun

    name = "traced-panel"
    began = threading.Event()
    x, y = _data(seed)
    namespace = {"model": _model(seed), "x": x, "y": y, "callbacks": [_slow_batches(began)]}
    run = TrainingRun("model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=callbacks)", namespace,
                      name=name, checkpoint_dir=str(folder / name))
    tracer = Tracer()
    tracer.start()
    run.start()
    try:
        panel = ControlPanel(run)  # its monitor thread is not started: it redraws, it sends nothing
        _wait(began, "the cell's batch")
        sent = tracer.mark()
        panel.buttons["stop"].click()
        if not run.wait(120):
            raise TimeoutError("The panel's run did not end after its Stop click.")
    finally:
        run.join(120)
        tracer.stop()
    click = "ControlPanel._click_handler.<locals>.on_click"
    return _segments(tracer, name, (threading.current_thread().name, click, sent), f"traincontrol-train-{name}",
                     "ControlCallback.on_train_end")


def _loop_path(folder: Path, seed: int) -> dict[str, list]:
    """The CLI's ``stop`` to a `TrainLoop` (``model=``; ``train_on_batch`` per item)."""
    from jupyter_traincontrol import TrainLoop

    name = "traced-loop"
    model, (x, y) = _model(seed), _data(seed)
    items = [(x[i:i + 4], y[i:i + 4]) for i in range(0, len(x), 4)]
    began = threading.Event()

    def train():
        with TrainLoop(name=name, checkpoint_dir=str(folder / name), model=model, handle_sigint=False,
                       handle_sigterm=False, verbose=False) as loop:
            for _epoch in loop.epochs(3):
                for index, (xb, yb) in enumerate(loop.batches(items)):
                    if index == _SEND_AT:
                        began.set()
                    time.sleep(0.05)
                    loop.log(loss=float(model.train_on_batch(xb, yb)))

    return _traced_from_cli(name, "stop", train, began, "the loop's item", "LoopAdapter.close")  # what __exit__ calls


def _traced_from_cli(name: str, command: str, train, began: threading.Event, what: str, end: str) -> dict[str, list]:
    """Traces `train` on a thread of its own and the CLI's `command` sent
    once `began` is set (`what` says what it waits for), to the training's
    `end` (the function whose call ends it)."""
    tracer = Tracer()
    tracer.start()
    trainer = threading.Thread(target=train, name=_TRAINER)
    trainer.start()
    try:
        _wait(began, what)
        sender = _send_from_cli(tracer, name, command)
    finally:
        trainer.join(120)
        tracer.stop()
    return _segments(tracer, name, sender, _TRAINER, end)


def _wait(event: threading.Event, what: str) -> None:
    if not event.wait(120):
        raise TimeoutError(f"Timed out waiting for {what}.")


def _segments(tracer: Tracer, name: str, sender: tuple[str, str, int], trainer: str, end_call: str
              ) -> dict[str, list]:
    """Cuts a path's calls into its segments (`SEGMENTS`)."""
    events = tracer.events
    sender_thread, sender_call, sent = sender
    sent_end = tracer.first_return(sender_thread, sender_call, after=sent)
    applied = tracer.first_call(trainer, "CommandActions._apply", after=sent)  # the command, applied
    taken = max(seq for seq, thread, _m, call in events  # the boundary that applies it
                if thread == trainer and call == "CommandActions.apply_pending" and seq < applied)
    taken_end = tracer.first_return(trainer, "CommandActions.apply_pending", after=applied)
    end = tracer.first_call(trainer, end_call, after=taken_end)
    end_done = tracer.first_return(trainer, end_call, after=end)
    # The run's thread: the read that brings the line (its call began before the send), to its return. What
    # the thread does between reads (the run's ticker, the channel's check) goes by the clock: left out.
    reader = f"traincontrol-reader-{name}"
    decoded = tracer.first_call(reader, "LineDecoder.feed", after=sent)
    read = max(seq for seq, thread, _m, call in events
               if thread == reader and call.endswith("._read_some") and seq < decoded)
    read_end = next(seq for seq, thread, call in tracer.returns
                    if thread == reader and call.endswith("._read_some") and seq > decoded)
    # The writer: the whole write the boundary waits for (its last callback may run after the boundary's end).
    writer = f"traincontrol-writer-{name}"
    write_end = next((seq for seq, thread, call in tracer.returns
                      if thread == writer and call == "CheckpointWriter._write" and seq > taken), taken_end)
    sending = [e for e in events if e[1] == sender_thread and sent < e[0] < sent_end]
    reading = [e for e in events if e[1] == reader and read <= e[0] <= read_end]
    taking = [e for e in events if (e[1] == trainer and taken <= e[0] <= taken_end)
              or (e[1] == writer and taken <= e[0] <= write_end)]
    ending = [e for e in events if e[1] == trainer and end <= e[0] <= end_done]
    return dict(zip(SEGMENTS, (sending, reading, taking, sending + reading + taking, ending)))


def trace(folder: Path, seed: int) -> dict[str, dict[str, list]]:
    """Each path of `PATHS`, traced once: path to segment to its calls.

    A thread that runs Python keeps the interpreter lock until it waits
    (not 5 ms at most, Python's default), so the run's thread does
    not cut into a boundary on a busy machine; and a publish the boundary
    asks for waits half a second, not 2 ms (`SOON_DELAY_SECONDS`):
    `Publisher.publish_soon` wakes the run's thread unless a publish is due
    already, and whether the first one of a boundary was done before its
    second went by the clock (a machine that held the training thread
    back for 2 ms made a round differ). The figures are then those of a
    boundary that runs through.
    """
    from jupyter_traincontrol.run import publisher

    _first_save(folder, seed)
    switch, soon = sys.getswitchinterval(), publisher.SOON_DELAY_SECONDS
    sys.setswitchinterval(1.0)
    publisher.SOON_DELAY_SECONDS = 0.5
    try:
        return {
            "cli-stop": _fit_path(folder, seed, "stop"),
            "cli-abort": _fit_path(folder, seed, "abort"),
            "panel-stop": _panel_path(folder, seed),
            "loop-stop": _loop_path(folder, seed),
        }
    finally:
        sys.setswitchinterval(switch)
        publisher.SOON_DELAY_SECONDS = soon


# The figures, the targets and the docs ----------------------------------------------------------------------

Figures = dict[str, dict[str, tuple[int, int, int]]]  # path to segment to (modules, hops, re-entries)


def targets(figures: Figures) -> list[tuple[str, str, tuple[int, int, int], str, bool]]:
    """The issue's targets: (target, path, its figures, against what, met)."""
    whole = {path: segments["whole command"] for path, segments in figures.items()}
    rows = []
    for target, path, modules, reentries in (("`abort`: at most 14 modules, 20 re-entries", "cli-abort", 14, 20),
                                             ("`stop` with its checkpoint: at most 30 modules, 55 re-entries",
                                              "cli-stop", 30, 55)):
        rows.append((target, path, whole[path], f"{modules} / - / {reentries}",
                     whole[path][0] <= modules and whole[path][2] <= reentries))
    for target, path, peer in (("a `TrainLoop` `stop` no more than a `fit` `stop`", "loop-stop", "cli-stop"),
                               ("a panel click no more than the CLI", "panel-stop", "cli-stop")):
        rows.append((target, path, whole[path], _slashed(whole[peer]),
                     all(mine <= theirs for mine, theirs in zip(whole[path], whole[peer]))))
    return rows


def _slashed(values) -> str:
    return " / ".join(str(value) for value in values)


def docs_block(figures: Figures) -> str:
    """The block of docs/architecture.md between `BEGIN` and `END` (TensorFlow's figures)."""
    lines = [
        BEGIN,
        "Written by `python benchmarks/command_path.py --write-docs` (TensorFlow);",
        "the test suite fails when these figures differ from what it traces now.",
        "Each cell: modules / hops / re-entries.",
        "",
        ("| path | sender | the run's thread: the read | run side: command taken to acknowledged record | whole command "
         "| the `fit`'s (loop's) end |"),
        "|---|---|---|---|---|---|",
    ]
    for path, segments in figures.items():
        cells = [_slashed(segments[segment]) for segment in SEGMENTS]
        cells[3] = f"**{cells[3]}**"
        lines.append(f"| {PATHS[path]} | " + " | ".join(cells) + " |")
    lines += ["", "| target | path | whole command | target (modules / hops / re-entries) | met |",
              "|---|---|---|---|---|"]
    for target, path, mine, against, met in targets(figures):
        lines.append(f"| {target} | {PATHS[path]} | {_slashed(mine)} | {against} | {'yes' if met else '**no**'} |")
    lines.append(END)
    return "\n".join(lines)


def _print_difference(what: str, first, first_round: int, other, other_round: int) -> None:
    """Says where two rounds' calls of a segment part (on stderr)."""
    import difflib

    lines = lambda events: [f"[{thread}] {module}: {', '.join(dict.fromkeys(names))}"  # noqa: E731
                            for thread, module, names in hops(events)]
    print(f"{what}: round {other_round} differs from round {first_round}:", file=sys.stderr)
    for line in difflib.unified_diff(lines(first), lines(other), f"round {first_round}", f"round {other_round}",
                                     lineterm=""):
        print("  " + line, file=sys.stderr)


def docs_now() -> str | None:
    """The block docs/architecture.md holds now, or None."""
    found = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), DOCS.read_text(), re.S)
    return found.group(0) if found else None


def write_docs(block: str) -> None:
    text = DOCS.read_text()
    if docs_now() is None:
        raise SystemExit(f"{DOCS} has no {BEGIN} ... {END} block to write.")
    DOCS.write_text(re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _match: block, text, count=1, flags=re.S))


# The run ------------------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = make_parser(__doc__.split("\n\n")[0], rounds=3, quick_rounds=1)
    parser.add_argument("--backend", default="tensorflow", choices=("tensorflow", "jax", "torch"),
                        help="Keras's backend (default tensorflow: the docs' figures)")
    parser.add_argument("--calls", action="store_true", help="print every hop of each segment")
    parser.add_argument("--write-docs", action="store_true",
                        help="rewrite the figures' block of docs/architecture.md (TensorFlow only)")
    args = parse_args(parser, argv)
    if args.write_docs and args.backend != "tensorflow":
        parser.error("--write-docs writes the TensorFlow figures: leave --backend out.")
    os.environ["KERAS_BACKEND"] = args.backend  # before Keras is imported
    rounds: list[dict[str, dict[str, list]]] = []
    with scratch_folder(args.dir, "traincontrol-bench-command-path-") as folder:
        for index in range(args.rounds):
            rounds.append(trace(folder / f"round-{index}", args.seed))
    figures: Figures = {path: {segment: counts(events) for segment, events in segments.items()}
                        for path, segments in rounds[0].items()}
    differing = []
    for index, other in enumerate(rounds[1:], 2):
        for path, segments in other.items():
            for segment, events in segments.items():
                if counts(events) != figures[path][segment] and segment != "whole command":
                    differing.append(index)
                    _print_difference(f"{PATHS[path]}, {segment}", rounds[0][path][segment], 1, events, index)
    print(f"command path on {args.backend}: {args.rounds} round(s) per path; each: modules / hops / re-entries\n")
    for path, segments in figures.items():
        print(f"{PATHS[path]}:")
        for segment, (modules, hop_count, reentries) in segments.items():
            print(f"  {segment:<22} {modules:>4} modules {hop_count:>4} hops {reentries:>4} re-entries")
    print()
    for target, path, mine, against, met in targets(figures):
        print(f"{'met    ' if met else 'NOT MET'}  {target}: {PATHS[path]} {_slashed(mine)} (target {against})")
    if args.calls:
        for path, segments in rounds[0].items():
            for segment, events in segments.items():
                print(f"\n{PATHS[path]}, {segment}:")
                for thread, module, names in hops(events):
                    print(f"  [{thread}] {module}: {', '.join(dict.fromkeys(names))}")
    if args.backend == "tensorflow":  # the figures the docs show
        block = docs_block(figures)
        print(f"\nThe block of {DOCS.relative_to(REPO)}:\n{block}")
        if args.write_docs and not differing:
            write_docs(block)
            print(f"(written to {DOCS.relative_to(REPO)})")
        else:
            print(f"{DOCS.relative_to(REPO)}: " + ("current" if docs_now() == block else
                  "stale: run `python benchmarks/command_path.py --write-docs`"))
    if differing:
        print(f"The rounds disagree (rounds {sorted(set(differing))} differ from round 1, see stderr): the trace "
              "is not deterministic.")
    whole = "; ".join(f"{path} {_slashed(segments['whole command'])}" for path, segments in figures.items())
    met = sum(row[-1] for row in targets(figures))
    print_summary(f"command_path: {args.backend}: whole command (modules / hops / re-entries) {whole}; "
                  f"targets met {met} of {len(targets(figures))}; rounds "
                  + ("agree" if not differing else "DISAGREE"))
    return 1 if differing else 0

if __name__ == "__main__":
    sys.exit(main())
