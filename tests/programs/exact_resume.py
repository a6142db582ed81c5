"""One leg of an exact-resume comparison, in a fresh process (tests/test_exact_resume.py).

    python exact_resume.py DATA MODE STOP OUT CKPT

DATA: ``numpy-shuffle``, ``numpy-ordered``. MODE: ``full`` (train all
epochs), ``stop`` (send ``stop`` after global batch STOP: mid-epoch, or at an
epoch's end when STOP is a multiple of the batches per epoch), ``resume``
(``resume=True`` from CKPT, train to the end). Writes to OUT (.npz): the
final weights and optimizer variables, and the History of this process.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402

from jupyter_traincontrol import ControlCallback  # noqa: E402

EPOCHS, SAMPLES, BATCH = 3, 40, 8  # 5 batches an epoch
SEED = 7


def main(data: str, mode: str, stop: int, out: str, checkpoints: str) -> None:
    keras.utils.set_random_seed(SEED)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = rng.random((SAMPLES, 4), dtype="float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dropout(0.3),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    control = ControlCallback(name="exact", checkpoint_dir=checkpoints, resume=mode == "resume", verbose=False,
                              handle_sigint=False)

    class StopAt(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch, logs=None):
            StopAt.seen += 1
            if mode == "stop" and StopAt.seen == stop:
                control.lifecycle.channel.inject("stop")

    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=data == "numpy-shuffle", verbose=0,
                        callbacks=[StopAt(), control])
    values = [np.array(v) for v in model.weights] + [np.array(v) for v in model.optimizer.variables]
    np.savez(out, *values, history=json.dumps({"epoch": history.epoch, **history.history}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
