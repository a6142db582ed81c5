"""A training script for the never-lose tests: a Keras `fit`, fits in a with block, or a PyTorch `TrainLoop`.

Prints ``READY NAME FIFO`` once the first batch (item) has trained (before
its ``--batch-sleep``),
``TRAIN_END`` from a callback of the user's ``on_train_end`` (a `fit`'s,
after the run's), ``CHECKPOINTS [...]`` as the training ends (there, or
at the end of the loop's with block), and
``RESULT {json}`` if the script goes on after it. ``--own-handler``
installs a SIGTERM handler of the user's before training: it prints
``USER HANDLER`` and exits with status 7. The data and the models are
deterministic: a run stopped and resumed trains the items the
uninterrupted run would.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time


def _own_handler(signum, frame):
    print("USER HANDLER", flush=True)
    sys.exit(7)


def train_fit(args, control_options) -> dict:
    import keras
    import numpy as np

    from jupyter_traincontrol import ControlCallback

    class Script(keras.callbacks.Callback):
        """Paces the batches, says READY once, and TRAIN_END at the end."""

        def __init__(self, control):
            super().__init__()
            self.control, self.ready = control, False

        def on_train_batch_end(self, batch, logs=None):
            if not self.ready and self.control.fifo:
                self.ready = True
                print(f"READY {self.control.name} {self.control.fifo}", flush=True)
            pause(args.batch_sleep)  # after READY: a signal sent on READY arrives before the next boundary

        def on_train_end(self, logs=None):  # after the run's: its last checkpoint is written
            print("TRAIN_END", flush=True)
            if self.control.state in ("stopped", "stopping", "finished", "aborted"):
                print("CHECKPOINTS " + json.dumps([str(path) for path in self.control.checkpoints]), flush=True)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1))).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    control = ControlCallback(**control_options)
    callbacks = [control, Script(control)]
    if args.driver == "span":  # code that calls fit in a loop: one run for the block
        with control:
            for epoch in range(args.epochs):
                model.fit(x, y, batch_size=32, initial_epoch=epoch, epochs=epoch + 1, shuffle=False, verbose=0,
                          callbacks=callbacks)
    else:
        model.fit(x, y, batch_size=32, epochs=args.epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return {"state": control.state, "optimizer_step": int(model.optimizer.iterations.numpy())}


def train_loop(args, control_options) -> dict:
    import torch

    from jupyter_traincontrol import TrainLoop

    torch.manual_seed(0)
    net = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
    y = x.sum(dim=1, keepdim=True)
    trained = 0
    with TrainLoop(state={"net": net, "optimizer": optimizer}, **control_options) as loop:
        for _epoch in loop.epochs(args.epochs):
            for index in loop.batches(range(8)):
                xb, yb = x[index * 32:(index + 1) * 32], y[index * 32:(index + 1) * 32]
                loss = torch.nn.functional.mse_loss(net(xb), yb)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                loop.log(loss=loss.item())
                trained += 1
                if trained == 1:
                    print(f"READY {loop.name} {loop.fifo}", flush=True)
                pause(args.batch_sleep)  # after READY: a signal sent on READY arrives before the next boundary
        print("CHECKPOINTS " + json.dumps([str(path) for path in loop.checkpoints]), flush=True)
    return {"state": loop.state, "trained": trained}


def pause(seconds: float) -> None:
    """Sleeps `seconds` in slices of 50 ms, as a training step gives the
    interpreter back between its operations. One long sleep is woken by a
    signal only if the kernel hands it to the main thread; handed to one of
    the many threads of TensorFlow or JAX, its Python handler waits for the
    sleep's end (a second SIGTERM took the whole 5 s pause once, on JAX)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--driver", choices=["fit", "span", "loop"], required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--batch-sleep", type=float, default=0.01)
    parser.add_argument("--autosave", type=float, default=None, help="default: the package's")
    parser.add_argument("--sigterm-grace", type=float, default=None, help="default: the package's")
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--own-handler", action="store_true")
    args = parser.parse_args()
    if args.own_handler:
        signal.signal(signal.SIGTERM, _own_handler)
    options = dict(name=args.name, checkpoint_dir=args.checkpoint_dir, keep=args.keep, resume=args.resume)
    if args.autosave is not None:
        options["autosave"] = args.autosave
    if args.sigterm_grace is not None:
        options["sigterm_grace"] = args.sigterm_grace
    result = (train_loop if args.driver == "loop" else train_fit)(args, options)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
