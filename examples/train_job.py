"""A two-process JAX job that can be stopped, saved, paused as one run.

    python examples/train_job.py 0 & python examples/train_job.py 1

then `jupyter-traincontrol list` shows the job once; `jupyter-traincontrol
send job stop` (or Ctrl+C, or SIGTERM, on either process) stops both at the
same step, with one checkpoint. Run both again to resume from it. If one
process dies or hangs, the other ends ``failed`` within seconds, its record
naming the lost process.
"""

import sys
from pathlib import Path

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address="127.0.0.1:12355", num_processes=2, process_id=int(sys.argv[1]))

import keras  # noqa: E402  (after the distributed runtime, so Keras sees every device)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from jupyter_traincontrol import ControlCallback  # noqa: E402

keras.utils.set_random_seed(0)  # the same initial weights in every process
keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
x = np.random.default_rng(0).random((1024, 3), dtype="float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(64), epochs=2000, verbose=0,
          callbacks=[ControlCallback(name="job", resume=True,
                                     # one folder for every process, wherever each was started from
                                     checkpoint_dir=Path(__file__).resolve().parent / "checkpoints" / "job")])
