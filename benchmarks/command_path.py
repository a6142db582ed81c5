"""The path of one command through the package, traced: modules, hops and re-entries.

A real `fit` (a tiny model, TensorFlow unless ``KERAS_BACKEND`` says
otherwise) runs on a thread of its own under `ControlCallback`; at its
third batch the real CLI (``jupyter-traincontrol send NAME stop``, called
in this process so it can be traced) sends ``stop``. A profile hook
(``sys.setprofile`` and ``threading.setprofile``) records every call into a
function of the package, per thread. The calls are then cut into segments:

- sender: the CLI's own calls, from ``main`` to its return;
- reader: the run's FIFO reader thread, decoding the line;
- run side: the training thread from the boundary that takes the command
  (``CommandActions.apply_pending``) to its return, with the writer thread
  it waits for: the command taken, the checkpoint on disk, the
  acknowledgement in the record;
- fit's end: ``on_train_end`` to its return.

Dunder methods, properties and comprehensions are left out. Consecutive
calls of one thread in one module are one hop; a re-entry is a hop into a
module already visited in the segment. The whole command is sender, reader
and run side together.

Usage:
    python benchmarks/command_path.py            # the table
    python benchmarks/command_path.py --calls    # and every hop, in order
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jupyter_traincontrol  # noqa: E402

ROOT = str(Path(jupyter_traincontrol.__file__).parent) + os.sep
_COMPREHENSIONS = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>", "<lambda>")


def _property_codes() -> set:
    """The code objects of every property of the package's classes (left out)."""
    import importlib
    import pkgutil

    codes = set()
    for info in pkgutil.walk_packages(jupyter_traincontrol.__path__, "jupyter_traincontrol."):
        if ".notebook" in info.name or info.name.endswith(("control.server", "control.server.handlers")):
            continue
        module = importlib.import_module(info.name)
        for _name, cls in inspect.getmembers(module, inspect.isclass):
            for attribute in vars(cls).values():
                if isinstance(attribute, property):
                    codes.update(f.__code__ for f in (attribute.fget, attribute.fset) if f is not None)
    return codes


class Tracer:
    """Records (time, thread, module, function) for every call into the package."""

    def __init__(self):
        self.events: list[tuple[int, str, str, str]] = []
        self.marks: dict[str, int] = {}
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
        if leaf.startswith("__") and leaf.endswith("__") or leaf in _COMPREHENSIONS:
            return
        seq = next(self._counter)
        thread = threading.current_thread().name
        if event == "return":
            self.marks.setdefault(f"return {thread} {name}", seq)
            return
        module = code.co_filename[len(ROOT):-3].replace(os.sep, ".").removesuffix(".__init__")
        self.events.append((seq, thread, module, name))

    def start(self) -> None:
        threading.setprofile(self)
        sys.setprofile(self)

    def stop(self) -> None:
        self.recording = False
        sys.setprofile(None)
        threading.setprofile(None)


def hops(events) -> list[tuple[str, str, list[str]]]:
    """Consecutive calls of one thread in one module, merged: (thread, module, functions)."""
    merged: list[tuple[str, str, list[str]]] = []
    for _seq, thread, module, name in events:
        if merged and merged[-1][0] == thread and merged[-1][1] == module:
            merged[-1][2].append(name)
        else:
            merged.append((thread, module, [name]))
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


def trace() -> dict[str, list]:
    import numpy as np

    import keras
    from jupyter_traincontrol import ControlCallback
    from jupyter_traincontrol.control.cli import main as cli

    runtime = tempfile.mkdtemp(prefix="command-path-")
    os.environ["JUPYTER_RUNTIME_DIR"] = runtime
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).random((64, 3), dtype="float32")
    control = ControlCallback(name="traced", checkpoint_dir=os.path.join(runtime, "ckpt"), verbose=False,
                              handle_sigint=False)
    batch_began = threading.Event()

    class SlowBatches(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 2:
                batch_began.set()
            time.sleep(0.05)

    tracer = Tracer()
    tracer.start()
    trainer = threading.Thread(target=lambda: model.fit(x, x.sum(1), batch_size=4, epochs=3, verbose=0,
                                                        callbacks=[control, SlowBatches()]), name="trainer")
    trainer.start()
    batch_began.wait(60)
    tracer.recording = True
    tracer.marks["send"] = next(tracer._counter)
    cli(["send", "traced", "stop"])
    trainer.join(120)
    tracer.stop()
    events = tracer.events
    send_end = tracer.marks["return MainThread main"]
    taken = next(seq for seq, thread, _m, name in events if thread == "trainer" and name == "CommandActions.apply_pending")
    taken_end = tracer.marks["return trainer CommandActions.apply_pending"]
    end = next(seq for seq, thread, _m, name in events if thread == "trainer" and name == "ControlCallback.on_train_end")
    end_done = tracer.marks["return trainer ControlCallback.on_train_end"]
    on = lambda prefix: lambda thread: thread.startswith(prefix)  # noqa: E731
    run_side = lambda thread: thread == "trainer" or thread.startswith("traincontrol-writer")  # noqa: E731
    sender = [e for e in events if e[1] == "MainThread" and e[0] < send_end]
    reader = [e for e in events if on("traincontrol-reader")(e[1]) and e[0] < taken]
    taking = [e for e in events if run_side(e[1]) and taken <= e[0] <= taken_end]
    ending = [e for e in events if e[1] == "trainer" and end <= e[0] <= end_done]
    return {"sender (CLI)": sender, "reader thread": reader, "run side: command taken to acknowledged record": taking,
            "whole command, CLI to acknowledged record": sender + reader + taking, "fit's end": ending}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", action="store_true", help="print every hop of each segment")
    args = parser.parse_args(argv)
    segments = trace()
    print(f"{'segment':<50} {'modules':>7} {'hops':>5} {'re-entries':>10}")
    for name, events in segments.items():
        modules, hop_count, reentries = counts(events)
        print(f"{name:<50} {modules:>7} {hop_count:>5} {reentries:>10}")
    if args.calls:
        for name, events in segments.items():
            print(f"\n{name}:")
            for thread, module, names in hops(events):
                print(f"  [{thread}] {module}: {', '.join(dict.fromkeys(names))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
