"""A fit under `tf.distribute.MirroredStrategy` over two logical CPU devices.

Usage: python mirrored_fit.py --name NAME --checkpoint-dir DIR [--resume]
[--epochs N]. Prints ``READY NAME FIFO`` after the first batch and
``RESULT {json}`` at the end, as examples/train_with_control.py does.
"""

import argparse
import json
import time

import tensorflow as tf

# Two logical devices from the one CPU; this must happen before TensorFlow starts.
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from jupyter_traincontrol import ControlCallback  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--name", required=True)
parser.add_argument("--checkpoint-dir", required=True)
parser.add_argument("--epochs", type=int, default=200)
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")


class Announce(keras.callbacks.Callback):
    def __init__(self, control):
        super().__init__()
        self.control, self.done = control, False

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.01)
        if not self.done:
            self.done = True
            print(f"READY {self.control.name} {self.control.fifo}", flush=True)


x = np.random.default_rng(0).random((256, 3), dtype="float32")
control = ControlCallback(name=args.name, checkpoint_dir=args.checkpoint_dir, resume=args.resume)
history = model.fit(x, x.sum(1, keepdims=True), batch_size=32, epochs=args.epochs, verbose=0,
                    callbacks=[control, Announce(control)])
print("RESULT " + json.dumps({
    "state": str(control.state), "epochs": history.epoch, "replicas": strategy.num_replicas_in_sync,
    "optimizer_step": int(model.optimizer.iterations.numpy()), "checkpoints": [str(p) for p in control.checkpoints],
}), flush=True)
