"""Legs of exact-resume comparisons, in a fresh process (tests/test_exact_resume.py).

    python exact_resume.py OUTDIR CKPTDIR [resume] ITEM [ITEM ...]

Each ITEM is one fit, run one after another in this process (each seeded
afresh), so that one process serves the same leg of every chain:
``DATA=STOP`` is a leg of DATA's chain, which writes OUTDIR/DATA.npz and
keeps its checkpoints in CKPTDIR/DATA (with ``resume``, it continues from
the newest one there); ``DATA`` alone is the uninterrupted fit, which
writes OUTDIR/DATA-uninterrupted.npz (checkpoints in
CKPTDIR/DATA-uninterrupted, never resumed).

DATA, the training input: ``numpy-shuffle``, ``numpy-ordered``, ``tfdata``
(a seeded ``shuffle`` reshuffled each iteration, a ``map`` with a seeded
random op), ``pydataset`` (a `keras.utils.PyDataset` that reshuffles in its
``on_epoch_end`` with its own seeded generator), ``generator`` (a plain
Python generator). Validation data (numpy) is always given.

STOP, where this leg sends ``stop`` (``none``: never):
``batch:N`` after global training batch N (mid-epoch, or at an epoch's end
when N is a multiple of the batches per epoch); ``val:E`` during the
validation of epoch E (zero-based), after its first batch; ``pause:N``
after global batch N, ``pause`` then ``stop`` while paused; ``skip:N``
after global batch N while a resume still skips the batches its checkpoint
already trained (N before the checkpoint's batch).

Each .npz holds the final weights and optimizer variables, and the History
of this fit.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402

from jupyter_traincontrol import ControlCallback  # noqa: E402

EPOCHS, SAMPLES, BATCH = 5, 40, 8
BATCHES = SAMPLES // BATCH
SEED = 7


class ShuffledBatches(keras.utils.PyDataset):
    """Batches of (x, y) in an order its own seeded generator redraws each epoch."""

    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y
        self.rng = np.random.default_rng(11)
        self.order = np.arange(len(x))

    def __len__(self):
        return len(self.x) // BATCH

    def __getitem__(self, index):
        rows = self.order[index * BATCH:(index + 1) * BATCH]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self):
        self.order = self.rng.permutation(len(self.x))


def training_data(kind: str, x, y):
    """The `fit` arguments for the training input `kind`."""
    if kind in ("numpy-shuffle", "numpy-ordered"):
        return {"x": x, "y": y, "batch_size": BATCH, "shuffle": kind == "numpy-shuffle"}
    if kind == "pydataset":
        return {"x": ShuffledBatches(x, y)}
    if kind == "generator":
        def batches():
            while True:
                for start in range(0, SAMPLES, BATCH):
                    yield x[start:start + BATCH], y[start:start + BATCH]

        return {"x": batches(), "steps_per_epoch": BATCHES}
    if kind == "tfdata":
        import tensorflow as tf

        def jitter(features, target):
            return features + tf.random.uniform(tf.shape(features), maxval=0.01, seed=3), target

        data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(SAMPLES, seed=5).map(jitter).batch(BATCH)
        return {"x": data}
    raise SystemExit(f"unknown data {kind!r}")


def main(data: str, stop: str, out: str, checkpoints: str, resume: bool) -> None:
    keras.backend.clear_session()  # the same layer names in every fit, whatever ran before it in this process
    keras.utils.set_random_seed(SEED)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = rng.random((SAMPLES, 4), dtype="float32")
    y = x.sum(axis=1, keepdims=True)
    val_x = rng.random((16, 4), dtype="float32")
    val_y = val_x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dropout(0.3),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    control = ControlCallback(name="exact", checkpoint_dir=checkpoints, resume=resume, verbose=True,
                              handle_sigint=False)
    kind, _, at = stop.partition(":")

    class StopAt(keras.callbacks.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            StopAt.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if kind in ("batch", "pause", "skip") and StopAt.epoch * BATCHES + batch + 1 == int(at):
                if kind == "pause":
                    control.lifecycle.channel.inject("pause")  # the stop then arrives while paused
                control.lifecycle.channel.inject("stop")

        def on_test_batch_end(self, batch, logs=None):
            if kind == "val" and StopAt.epoch == int(at) and batch == 0:
                control.lifecycle.channel.inject("stop")

    history = model.fit(**training_data(data, x, y), epochs=EPOCHS, validation_data=(val_x, val_y),
                        validation_batch_size=BATCH, verbose=0, callbacks=[StopAt(), control])
    values = [np.array(v) for v in model.weights] + [np.array(v) for v in model.optimizer.variables]
    np.savez(out, *values, history=json.dumps({"epoch": history.epoch, **history.history}))


if __name__ == "__main__":
    folder, checkpoint_root, *items = sys.argv[1:]
    resumed = items[:1] == ["resume"]
    for item in items[resumed:]:
        kind, is_leg, stop = item.partition("=")
        name = kind if is_leg else f"{kind}-uninterrupted"
        main(kind, stop if is_leg else "none", os.path.join(folder, f"{name}.npz"),
             os.path.join(checkpoint_root, name), resumed and bool(is_leg))
