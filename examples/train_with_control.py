"""Train a tiny Keras model that can be stopped from another terminal.

    python examples/train_with_control.py --name demo --epochs 20

then, from another terminal:

    jupyter-traincontrol list
    jupyter-traincontrol send demo save     # checkpoint now, keep training
    jupyter-traincontrol send demo stop     # checkpoint, then end fit gracefully
    echo pause > "$(jupyter --runtime-dir)/traincontrol/demo/control"

Ctrl+C stops gracefully too (a second Ctrl+C interrupts at once). Run it
again with --resume to continue from the latest checkpoint. The data is
generated: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import time

import keras
import numpy as np

from jupyter_traincontrol import ControlCallback


class SlowDown(keras.callbacks.Callback):
    """Sleeps after each batch, so a tiny model trains at a watchable pace."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


class Announce(keras.callbacks.Callback):
    """Prints one READY line once the first batch has trained."""

    def __init__(self, control: ControlCallback):
        super().__init__()
        self.control = control
        self.done = False

    def on_train_batch_end(self, batch, logs=None):
        if not self.done:
            self.done = True
            print(f"READY {self.control.name} {self.control.fifo}", flush=True)


def build_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default=None, help="run name (default: run-N)")
    parser.add_argument("--checkpoint-dir", default=None, help="default: checkpoints/NAME")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-sleep", type=float, default=0.02, help="seconds to sleep per batch")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(512, 1))).astype("float32")

    model = build_model()
    control = ControlCallback(name=args.name, checkpoint_dir=args.checkpoint_dir, resume=args.resume)
    history = model.fit(
        x, y, batch_size=32, epochs=args.epochs, validation_split=0.125, shuffle=False, verbose=0,
        callbacks=[control, SlowDown(args.batch_sleep), Announce(control)],
    )
    result = {
        "name": control.name,
        "state": control.state,
        "epochs": history.epoch,
        "optimizer_step": int(model.optimizer.iterations.numpy()),
        "checkpoints": [str(path) for path in control.checkpoints],
    }
    print("RESULT " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
