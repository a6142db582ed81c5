"""A Keras 2 (tf_keras) training under ControlCallback, as a user's script.

The example script's protocol (``READY NAME FIFO`` once the first batch has
trained, ``RESULT {json}`` at the end), with ``tf.keras`` under
``TF_USE_LEGACY_KERAS=1`` (Keras 2 as TensorFlow routes it), or ``import
tf_keras`` with ``--import-tf-keras``.

Usage: python keras2_train.py --name N --checkpoint-dir D [--epochs E]
       [--batch-sleep S] [--resume] [--import-tf-keras]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--name", required=True)
parser.add_argument("--checkpoint-dir", required=True)
parser.add_argument("--epochs", type=int, default=200)
parser.add_argument("--batch-sleep", type=float, default=0.02)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--import-tf-keras", action="store_true")
args = parser.parse_args()

if args.import_tf_keras:
    import tf_keras as k2
else:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    k2 = tf.keras
    assert k2.Model.__module__.startswith("tf_keras."), f"tf.keras is {k2.Model.__module__}, expected tf_keras"

from jupyter_traincontrol import ControlCallback  # noqa: E402


class Paced(k2.callbacks.Callback):
    """Sleeps after each batch; prints READY once the first batch has trained."""

    def __init__(self, control):
        super().__init__()
        self.control = control
        self.ready = False

    def on_train_batch_end(self, batch, logs=None):
        if not self.ready:
            self.ready = True
            print(f"READY {self.control.name} {self.control.fifo}", flush=True)
        time.sleep(args.batch_sleep)


k2.utils.set_random_seed(0)
x = np.random.default_rng(0).random((64, 3), dtype="float32")
y = x.sum(axis=1, keepdims=True)
model = k2.Sequential([k2.layers.Dense(4, activation="relu", input_shape=(3,)), k2.layers.Dense(1)])
model.compile(optimizer=k2.optimizers.Adam(0.01), loss="mse")
control = ControlCallback(name=args.name, checkpoint_dir=args.checkpoint_dir, resume=args.resume)
history = model.fit(x, y, batch_size=8, epochs=args.epochs, shuffle=False, verbose=0, callbacks=[control, Paced(control)])
print("RESULT " + json.dumps({
    "name": control.name,
    "state": control.state,
    "history": type(history).__module__ + "." + type(history).__name__,
    "epochs": history.epoch,
    "optimizer_step": int(model.optimizer.iterations.numpy()),
    "checkpoints": [str(path) for path in control.checkpoints],
}), flush=True)
