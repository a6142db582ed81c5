"""Our background save beside the best async checkpointer of the backend, in one `fit`.

Run through ``checkpoint_cost.py --peers`` (each backend in a process of
its own: the backend is fixed when Keras is imported). For each
size, one real `fit` of the one-layer Adam model of ``checkpoint_cost.py``
(callbacks ``[probe, ControlCallback, stopwatch]``) alternates, round after
round in a rotating order:

- ``save command``: ``save`` written to the run's FIFO before a step (as
  a command sent while training runs arrives), queued by the run's thread
  while the step runs; held is the time from the step's end to the end of
  `ControlCallback`'s batch hook after it (the snapshot,
  `ModelSnapshot.take`), with no idle wait before it, as the peer's save
  follows its step; the writer thread writes the ``.keras`` file (staging,
  sidecar, renames, pruning to keep=3);
- ``peer``: on TensorFlow ``tf.train.Checkpoint.write`` with
  ``CheckpointOptions(experimental_enable_async_checkpoint=True)`` (of the
  model's and optimizer's ``tf.Variable``s: a Keras 3 model itself is not
  a checkpointable of that API), on JAX Orbax's ``CheckpointManager``
  (``enable_async_checkpointing=True``, ``max_to_keep=3``) saving the
  arrays the trainer holds (``StandardSave``), on torch PyTorch's
  Distributed Checkpoint ``async_save`` of the variables' tensors (no
  process group: one process; it stages a CPU copy, then writes on a
  thread; the folders beyond the newest 3 are removed as each write
  ends); held is the call.

Around each save the probe times the training steps themselves (from the
first callback's batch begin to its batch end, so no hook is counted):
three steps before it (the baseline), the step right after it (where
copy-on-write copies and fresh buffers land), and every step while the
write is in flight (ours: the writer thread busy; the peer's: its queue or
manager busy). *next step* and *during write* are ratios to the baseline
(medians per round, then the median over rounds); *kept* is the resident
memory once the write is done, above the level just before the save.

Orbax is not a dependency of the package (it is in the ``bench`` extra);
where it is not installed, install it beside the test environment, for
example in a venv of its own that sees the test environment's packages::

    python -m venv /work/venv-bench
    echo "$PWD/.venv/lib/python3.11/site-packages" > /work/venv-bench/lib/python3.11/site-packages/shared.pth
    /work/venv-bench/bin/pip install orbax-checkpoint    # adds packages only: jax stays 0.10.2
    /work/venv-bench/bin/python benchmarks/checkpoint_cost.py --peers
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path

import _common

VARIANTS = ("save command", "peer")
BASELINE_STEPS = 3
MOST_STEPS_DURING = 400


def _resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class TensorFlowPeer:
    """``tf.train.Checkpoint.write`` with async checkpointing on."""

    name = "tf.train.Checkpoint async"

    def __init__(self, model, folder: Path, keep: int = 3):
        import tensorflow as tf

        self.folder = folder
        self.keep = keep
        self.checkpoint = tf.train.Checkpoint(weights=[v.value for v in model.weights],
                                              optimizer=[v.value for v in model.optimizer.variables])
        self.options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
        self.count = 0

    def save(self, model) -> None:
        self.count += 1
        self.checkpoint.write(str(self.folder / f"ckpt-{self.count}"), options=self.options)

    @property
    def busy(self) -> bool:
        helper = getattr(self.checkpoint, "_async_checkpointer_impl", None)
        return bool(helper is not None and helper._queue.unfinished_tasks)

    def wait(self) -> None:
        self.checkpoint.sync()
        for old in self.folder.glob(f"ckpt-{self.count - self.keep}.*"):  # keep as many as the run and Orbax
            old.unlink()

    def close(self) -> None:
        self.wait()


class TorchPeer:
    """PyTorch Distributed Checkpoint's ``async_save`` of the model's and optimizer's tensors."""

    name = "torch.distributed.checkpoint.async_save"

    def __init__(self, model, folder: Path, keep: int = 3):
        import torch.distributed.checkpoint as dcp

        # Said at each save, on the writer's thread too: one process is what is measured.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        self.dcp, self.folder, self.keep = dcp, folder, keep
        self.future, self.count = None, 0

    def save(self, model) -> None:
        self.wait()  # one write at a time, as ours
        state = {f"v{index}": variable.value
                 for index, variable in enumerate([*model.variables, *model.optimizer.variables])}
        self.count += 1
        self.future = self.dcp.async_save(state, checkpoint_id=str(self.folder / f"step-{self.count}"))

    @property
    def busy(self) -> bool:
        return self.future is not None and not self.future.done()

    def wait(self) -> None:
        if self.future is not None:
            self.future.result()
            self.future = None
            for old in range(1, self.count - self.keep + 1):
                shutil.rmtree(self.folder / f"step-{old}", ignore_errors=True)

    def close(self) -> None:
        self.wait()


class OrbaxPeer:
    """Orbax's ``CheckpointManager`` with async checkpointing, saving the trainer's arrays."""

    name = "Orbax CheckpointManager async"

    def __init__(self, model, folder: Path, keep: int = 3):
        import orbax.checkpoint as ocp

        self.ocp = ocp
        self.manager = ocp.CheckpointManager(
            folder, options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True, max_to_keep=keep))
        self.count = 0

    def save(self, model) -> None:
        # `Callback.model` synced the trainer's state into the variables (as our save does).
        state = {"trainable": [v.value for v in model.trainable_variables],
                 "non_trainable": [v.value for v in model.non_trainable_variables],
                 "optimizer": [v.value for v in model.optimizer.variables]}
        self.count += 1
        self.manager.save(self.count, args=self.ocp.args.StandardSave(state))

    @property
    def busy(self) -> bool:
        return self.manager.is_saving_in_progress()

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def make_peer(model, folder: Path, keep: int = 3):
    """The async checkpointer of the backend in use (None for another backend than these three)."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        return TensorFlowPeer(model, folder, keep)
    if backend == "jax":
        try:
            return OrbaxPeer(model, folder, keep)
        except ImportError:
            raise SystemExit("checkpoint_cost.py --peers on JAX needs orbax-checkpoint: see the docstring of "
                             "benchmarks/checkpoint_peers.py for how to install it beside the test environment.")
    if backend == "torch":
        return TorchPeer(model, folder, keep)
    return None


def measure(model, folder: Path, rounds: int, written_back: bool, keep: int = 3):
    """Alternates our save command and the peer's save inside one real `fit`.

    Args:
        keep: Checkpoints kept by the run and the peer (3; less for files of gigabytes).

    Returns:
        The peer's name, and variant to measure to one value per round: ``held`` (s), ``next
        step`` and ``during write`` (ratios to the baseline step),
        ``write`` (s, save to write done), ``steps during`` and ``kept``
        (bytes resident after the write, above the level before the save).
    """
    import keras
    import numpy as np

    from jupyter_traincontrol import ControlCallback
    from jupyter_traincontrol.transport.channels import deliver

    peer = make_peer(model, folder / "peer", keep)
    if peer is None:
        raise SystemExit(f"checkpoint_cost.py --peers: no async peer is named for {keras.backend.backend()}.")
    control = ControlCallback(save_at_end=False, name="bench-peers", checkpoint_dir=folder / "ours", keep=keep, verbose=False,
                              handle_sigint=False)
    schedule = _common.rotation(list(VARIANTS), rounds, warmup=1)
    results = {name: {key: [] for key in ("held", "next step", "during write", "write", "steps during", "kept")}
               for name in VARIANTS}
    clock = {}

    def writer_busy() -> bool:
        return control.session.actions.saves._writer.busy

    class Probe(keras.callbacks.Callback):
        """First in the list: times each step, and runs the schedule."""

        def __init__(self):
            super().__init__()
            self.index, self.phase, self.steps = 0, "baseline", []
            self.current = None

        def on_train_batch_begin(self, batch, logs=None):
            if self.current is not None and self.current.pop("deliver", False):
                # Before the step, as a command sent while training runs is: the hook after
                # the step takes it with no idle wait in between (as the peer's save is made).
                deliver(control.fifo, "save")
                _common.wait_for(lambda: control.lifecycle.channel.pending, 10, "the save to be queued")
                self.current["armed"] = True
            clock["begin"] = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            step = time.perf_counter() - clock["begin"]
            if self.current is None:
                if self.index >= len(schedule):
                    self.model.stop_training = True
                    return
                writer_busy() and control.session.actions.saves._writer.wait()
                peer.wait()
                if written_back:
                    os.sync()
                self.current = {"schedule": schedule[self.index], "baseline": [], "during": []}
                self.index += 1
                return
            current = self.current
            _round, name, warming = current["schedule"]
            if current.pop("armed", False):  # the step the command waited through: taken at this hook
                clock["held from"] = current["at"] = time.perf_counter()
                return
            if len(current["baseline"]) < BASELINE_STEPS:
                current["baseline"].append(step)
                if len(current["baseline"]) == BASELINE_STEPS:
                    current["rss"] = _resident()
                    current["at"] = time.perf_counter()
                    if name == "peer":
                        begin = time.perf_counter()
                        peer.save(self.model)
                        current["held"] = time.perf_counter() - begin
                    else:
                        current["deliver"] = True
                return
            busy = peer.busy if name == "peer" else writer_busy()
            if busy and len(current["during"]) < MOST_STEPS_DURING:
                current["during"].append(step)
                return
            if not current["during"]:  # written within the step after it: that step is the one during it
                current["during"].append(step)
            current["write"] = time.perf_counter() - current["at"]
            if not warming:
                base = float(np.median(current["baseline"]))
                into = results[name]
                into["held"].append(current["held"])
                into["next step"].append(current["during"][0] / base)
                into["during write"].append(float(np.mean(current["during"])) / base)
                into["write"].append(current["write"])
                into["steps during"].append(len(current["during"]))
                into["kept"].append(_resident() - current["rss"])
            self.current = None

    class Stopwatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if "held from" in clock:
                probe.current["held"] = time.perf_counter() - clock.pop("held from")

    probe = Probe()
    units = model.input_shape[-1]
    x = np.zeros((64, units), "float32")
    try:
        model.fit(x, x, batch_size=1, epochs=10_000, shuffle=False, verbose=0, callbacks=[probe, control, Stopwatch()])
    finally:
        peer.close()
    if len(results["peer"]["held"]) != rounds or len(results["save command"]["held"]) != rounds:
        raise RuntimeError(f"the run did not measure every round: {list(control.lifecycle.journal.events)[-5:]}")
    return results, peer.name


def report(sizes, model_with_file_size, folder: Path, rounds: int, written_back: bool, seed: int,
           keep: int = 3) -> str:
    """Measures each size, prints the table, returns the summary's text."""
    import keras

    rows, summary = [], []
    peer_name = None
    for megabytes in sizes:
        model = model_with_file_size(megabytes, seed=seed)
        scratch = folder / f"peers-{megabytes:g}MB"
        scratch.mkdir()
        results, peer_name = measure(model, scratch, rounds, written_back, keep)
        ours, theirs = results["save command"], results["peer"]
        held_ratio = _common.median([a / b for a, b in zip(ours["held"], theirs["held"])])
        for name, found in (("save command", ours), (peer_name, theirs)):
            rows.append([f"{megabytes:g} MB", name, _common.median(found["held"]) * 1e3,
                         _common.median(found["next step"]), _common.median(found["during write"]),
                         _common.median(found["steps during"]), _common.median(found["write"]),
                         _common.median(found["kept"]) / 1e6])
        during = _common.median(ours["during write"])
        summary.append(f"{megabytes:g}MB held {held_ratio:.2f}x the peer's (median of the rounds' ratios; medians "
                       f"{_common.median(ours['held']) * 1e3:.2f} vs {_common.median(theirs['held']) * 1e3:.2f} ms), "
                       f"steps during our write {during:.2f}x")
        del model
    print(f"\n{keras.backend.backend()}: our save command beside {peer_name}, alternating in one fit ({rounds} rounds; "
          f"{'written back before each save' if written_back else 'saves back to back'}). held: ms on the training "
          "thread; next step, during write: step time over the baseline steps before the save; write: s until "
          "the file is done; kept: MB resident after the write (medians)")
    _common.print_table(["file", "saver", "held ms", "next step", "during write", "steps during", "write s",
                         "kept MB"], rows)
    return f"{keras.backend.backend()} vs {peer_name}: " + "; ".join(summary)
