"""One leg of a run whose own callbacks keep state: EarlyStopping,
ModelCheckpoint(save_best_only=True) and ReduceLROnPlateau, each fresh.

    python callback_states.py OUT CHECKPOINTS whole
    python callback_states.py OUT CHECKPOINTS stop:EPOCH:BATCH [resume]
    python callback_states.py OUT CHECKPOINTS resume

Keras 3 on the backend ``KERAS_BACKEND`` names, or Keras 2 (tf_keras) with
``TF_USE_LEGACY_KERAS=1``. ``whole`` trains without a stop; ``stop:E:B`` sends ``stop`` after batch B
of epoch E (zero-based; it acts after the next batch); ``resume`` continues the run from its newest
checkpoint. Each leg writes ``OUT/result.npz``: the final weights, the
weights of the best-model file ModelCheckpoint kept, the epochs trained,
the learning rate and the callbacks' state at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

if os.environ.get("TF_USE_LEGACY_KERAS") == "1":  # Keras 2, as its users run it
    import tf_keras as keras
else:
    import keras
from jupyter_traincontrol import ControlCallback  # noqa: E402

EPOCHS = 30


class StopAt(keras.callbacks.Callback):
    """Sends ``stop`` to the run after batch `batch` of epoch `epoch`, and
    waits until the run has it: it acts at the next batch's end."""

    def __init__(self, control, epoch, batch):
        super().__init__()
        self.control, self.at, self.epoch = control, (epoch, batch), -1

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            self.control.send("stop", sender="test")
            channel = self.control.lifecycle.channel
            deadline = time.monotonic() + 30
            while not channel.pending and time.monotonic() < deadline:
                time.sleep(0.005)


def main(out: Path, checkpoints: Path, legs: list[str]) -> None:
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + rng.normal(scale=0.5, size=(64, 1))).astype("float32")
    x_val = rng.normal(size=(32, 3)).astype("float32")
    y_val = (x_val @ np.array([[1.0], [-2.0], [0.5]]) + rng.normal(scale=1.0, size=(32, 1))).astype("float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")
    early = keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=0.01, patience=3, restore_best_weights=True)
    best = keras.callbacks.ModelCheckpoint(str(out / "best.keras"), monitor="val_loss", save_best_only=True)
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", patience=1, factor=0.5, min_lr=1e-5)
    control = ControlCallback("stateful", checkpoint_dir=checkpoints, resume="resume" in legs, verbose=True)
    callbacks = [early, best, plateau, control]
    for leg in legs:
        if leg.startswith("stop:"):
            _, epoch, batch = leg.split(":")
            callbacks.append(StopAt(control, int(epoch), int(batch)))
    # Keras 2 resumes at the epoch and batch, without the data order: its batches come in order.
    history = model.fit(x, y, validation_data=(x_val, y_val), epochs=EPOCHS, batch_size=16, callbacks=callbacks,
                        verbose=0, shuffle=os.environ.get("TF_USE_LEGACY_KERAS") != "1")
    best_model = keras.models.load_model(out / "best.keras")
    np.savez(
        out / "result.npz",
        *model.get_weights(),
        best_weights=np.concatenate([w.ravel() for w in best_model.get_weights()]),
        summary=json.dumps({
            "epochs": history.epoch, "state": str(control.state), "end_reason": control.end_reason(control.state),
            "learning_rate": float(np.asarray(model.optimizer.learning_rate)),
            "stopped_epoch": early.stopped_epoch, "best": float(early.best), "best_epoch": early.best_epoch,
            "plateau": [plateau.wait, float(plateau.best), plateau.cooldown_counter],
            "val_loss": history.history["val_loss"],
        }),
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
