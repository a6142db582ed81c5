"""Exact resume: a seeded run stopped and resumed in new processes ends
bit-identical to an uninterrupted one (weights, optimizer state, and the
History of every epoch each process trained whole).

Each data source has a chain of legs, each leg a fresh process
(tests/programs/exact_resume.py) on the backend this suite runs with
(``KERAS_BACKEND``): a tiny Dense model with Dropout, 5 epochs of 5
batches, numpy validation data. One chain covers every kind of stop for a
data source: stopped mid-epoch, resumed and stopped while the resume skips
the batches already trained, resumed and stopped at an epoch's end,
resumed and stopped during validation, resumed and stopped while paused,
resumed to the end. To keep the suite short, one process runs the same leg
of every chain, one fit after another, and the first also runs the
uninterrupted fits: starting a backend costs far more than these fits.
Each leg's History is compared with the uninterrupted run's, so a failure
names the data source and the leg that diverged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import child_env

PROGRAM = Path(__file__).parent / "programs" / "exact_resume.py"
BATCHES = 5  # per epoch, as in the program

# batch:7: mid-epoch 1; skip:6: while the resume from batch 7 still skips
# the batches already trained (the checkpoint it writes is of batch 7's
# weights, and says so); pause:10: paused at the end of epoch 1, then
# stopped; val:2: in epoch 2's validation.
EVERY_STOP = ("batch:7", "skip:6", "pause:10", "val:2")
EXACT_CHAINS = {
    "numpy-shuffle": EVERY_STOP,
    "tfdata": EVERY_STOP,
    "pydataset": EVERY_STOP,
    "numpy-ordered": ("batch:7",),
}
# A plain generator cannot be resumed exactly (its data order differs): its
# chain checks that the resume says so, once.
CHAINS = {**EXACT_CHAINS, "generator": ("batch:7",)}


@pytest.fixture(scope="module")
def legs(tmp_path_factory):
    """Every chain run, leg by leg: the folder holding ``leg{i}/{data}.npz``
    and ``leg0/{data}-uninterrupted.npz``, and each leg's output."""
    root = tmp_path_factory.mktemp("exact")
    runtime = root / "runtime"  # a registry of its own: a module's fixture runs before a test's is set
    runtime.mkdir(mode=0o700)
    chains = {data: [*stops, "none"] for data, stops in CHAINS.items()}
    outputs = []
    for index in range(max(len(chain) for chain in chains.values())):
        items = [f"{data}={chain[index]}" for data, chain in chains.items() if index < len(chain)]
        if index == 0:
            items += list(EXACT_CHAINS)  # the uninterrupted fits
        folder = root / f"leg{index}"
        folder.mkdir()
        command = [sys.executable, str(PROGRAM), str(folder), str(root / "ck"), *(["resume"] if index else []), *items]
        done = subprocess.run(command, env=child_env(runtime), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"leg {index} ({' '.join(items)}) failed:\n{done.stderr[-3000:]}"
        outputs.append(done.stdout + done.stderr)
    return root, outputs


def _load(path: Path):
    arrays = np.load(path)
    return arrays, json.loads(str(arrays["history"]))


def _mid_epoch(stop: str) -> bool:
    kind, _, at = stop.partition(":")
    return kind in ("batch", "pause", "skip") and int(at) % BATCHES != 0


@pytest.mark.parametrize("data", list(EXACT_CHAINS))
def test_stopped_and_resumed_runs_equal_an_uninterrupted_one(data, legs):
    root, _ = legs
    full, full_history = _load(root / "leg0" / f"{data}-uninterrupted.npz")
    chain = [*EXACT_CHAINS[data], "none"]
    for index, stop in enumerate(chain):
        leg, history = _load(root / f"leg{index}" / f"{data}.npz")
        whole = list(zip(history["epoch"], range(len(history["epoch"]))))
        if index > 0 and _mid_epoch(chain[index - 1]):
            whole = whole[1:]  # the resumed part of an epoch averages fewer batches
        if _mid_epoch(stop):
            whole = whole[:-1]  # so does the part before a stop
        for epoch, row in whole:
            for metric in ("loss", "val_loss"):
                assert history[metric][row] == full_history[metric][epoch], (
                    f"leg {index} (stop {stop}, after {chain[index - 1] if index else 'a fresh start'}): "
                    f"{metric} of epoch {epoch} is {history[metric][row]!r}; uninterrupted: "
                    f"{full_history[metric][epoch]!r}")
    assert history["epoch"][-1] == full_history["epoch"][-1]
    for name in (name for name in full.files if name != "history"):
        assert np.array_equal(full[name], leg[name]), f"{name} differs from the uninterrupted run's"


def test_a_generator_resumes_and_says_once_what_differs(legs):
    root, outputs = legs
    _, history = _load(root / "leg1" / "generator.npz")
    assert history["epoch"] == [1, 2, 3, 4]  # resumed in epoch 2, to the end
    said = [line for line in outputs[1].splitlines() if "Python generator" in line]
    assert len(said) == 1, said
    assert "not exact" in said[0] and "data order differs" in said[0]


def test_an_unseeded_tf_data_shuffle_is_named_as_what_differs():
    tf = pytest.importorskip("tensorflow")
    from keras.src.trainers.epoch_iterator import EpochIterator

    from jupyter_traincontrol.fit.resume.data_order import DataOrder

    def limits(dataset):
        return DataOrder(EpochIterator(x=dataset.batch(2))).limitations()

    from tensorflow.python.eager import context

    numbers = tf.data.Dataset.range(8)
    assert limits(numbers.shuffle(8, seed=1)) == []
    global_seed = context.global_seed()  # a global seed makes an unseeded shuffle repeatable
    tf.random.set_seed(None)
    try:
        (unseeded,) = limits(numbers.shuffle(8))
    finally:
        tf.random.set_seed(global_seed)
    assert "without a seed" in unseeded


def test_counting_the_data_order_leaves_no_hook_behind(tmp_path, monkeypatch):
    """A fit counts iterators of its tf.data input (by patching the dataset's
    class) and calls of a PyDataset's hooks (by wrapping them); both are
    undone when fit ends, and a checkpoint keeps the counts."""
    tf = pytest.importorskip("tensorflow")
    import keras

    from jupyter_traincontrol import ControlCallback

    monkeypatch.syspath_prepend(str(PROGRAM.parent))
    from exact_resume import ShuffledBatches

    x = np.random.default_rng(0).random((16, 4), dtype="float32")
    y = x.sum(axis=1, keepdims=True)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(16, seed=1).batch(8)
    batches = ShuffledBatches(x, y)
    class_iter = vars(type(dataset)).get("__iter__")
    for data in (dataset, batches):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        control = ControlCallback(name="count", checkpoint_dir=tmp_path / type(data).__name__, verbose=False,
                                  handle_sigint=False)

        class SaveAtEnd(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                if epoch == 2:
                    control.lifecycle.channel.inject("save")  # taken at epoch 2's start: the counts of two epochs

        model.fit(data, epochs=3, verbose=0, callbacks=[SaveAtEnd(), control])
        counts = json.loads(control.checkpoints[-1].with_suffix(".json").read_text())["resume_state"]["data"]
        if data is dataset:
            assert counts["iterators"] >= 2  # one an epoch at least, whatever the backend
        else:
            assert counts["hooks"].count("e") >= 2
    assert vars(type(dataset)).get("__iter__") is class_iter
    assert "on_epoch_end" not in vars(batches) and "on_epoch_begin" not in vars(batches)
