"""A custom training loop under `TrainLoop`, of one of four kinds, for the tests.

Kinds: ``tape`` (a Keras model trained with `tf.GradientTape`, ``model=``),
``keras-jax`` (a Keras model's stateless API in a jitted JAX step, written
back with ``sync=`` and read again with ``reload=``), ``jax`` (a plain pytree, ``save=``/``load=``), and
``torch`` (a PyTorch module, optimizer and scheduler, ``state=``). Every
kind trains 8 items an epoch on the same deterministic data, so two runs
of a kind compare bit for bit.

Prints ``READY NAME FIFO`` once the loop listens and ``RESULT {json}`` at
the end (as ``examples/train_with_control.py``). ``--dump-start`` and
``--dump-end`` write the trained state (an ``.npz`` of its arrays, in a
fixed order) after the resume and after the loop; ``--pause-at`` pauses
the loop after one item, so a test commands it at a known place.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

ITEMS = 8


def _data():
    x = np.random.default_rng(0).random((ITEMS * 8, 3), dtype="float32")
    return x, x.sum(axis=1, keepdims=True)


def _batches(x, y):
    return [(index, x[index * 8:(index + 1) * 8], y[index * 8:(index + 1) * 8]) for index in range(ITEMS)]


def tape_kind():
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(0.01)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    def arrays():
        return [np.asarray(v) for v in model.weights] + [np.asarray(v) for v in optimizer.variables]

    return dict(model=model, optimizer=optimizer), lambda xb, yb: float(step(xb, yb)), arrays


def keras_jax_kind():
    import jax
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)
    state = {"trainable": [v.value for v in model.trainable_variables],
             "non_trainable": [v.value for v in model.non_trainable_variables],
             "optimizer": [v.value for v in optimizer.variables]}

    def loss_of(trainable, non_trainable, xb, yb):
        predicted, non_trainable = model.stateless_call(trainable, non_trainable, xb, training=True)
        return ((predicted - yb) ** 2).mean(), non_trainable

    @jax.jit
    def step(trainable, non_trainable, optimizer_values, xb, yb):
        (loss, non_trainable), grads = jax.value_and_grad(loss_of, has_aux=True)(trainable, non_trainable, xb, yb)
        trainable, optimizer_values = optimizer.stateless_apply(optimizer_values, grads, trainable)
        return loss, trainable, non_trainable, optimizer_values

    def train(xb, yb):
        loss, state["trainable"], state["non_trainable"], state["optimizer"] = step(
            state["trainable"], state["non_trainable"], state["optimizer"], xb, yb)
        return float(loss)

    def sync():  # the pytrees back into the model's variables, before a checkpoint
        for variable, value in zip(model.trainable_variables, state["trainable"]):
            variable.assign(value)
        for variable, value in zip(model.non_trainable_variables, state["non_trainable"]):
            variable.assign(value)
        for variable, value in zip(optimizer.variables, state["optimizer"]):
            variable.assign(value)

    def reload():  # after the tool changed the variables (a resume, a rollback, a set): the pytrees from them
        state.update(trainable=[v.value for v in model.trainable_variables],
                     non_trainable=[v.value for v in model.non_trainable_variables],
                     optimizer=[v.value for v in optimizer.variables])

    def arrays():
        return [np.asarray(v) for key in ("trainable", "non_trainable", "optimizer") for v in state[key]]

    return dict(model=model, optimizer=optimizer, sync=sync, reload=reload), train, arrays


def jax_kind():
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(1)
    state = {"w": jnp.asarray(rng.normal(size=(3, 1)).astype("float32")), "b": jnp.zeros((1,), "float32"),
             "mw": jnp.zeros((3, 1), "float32"), "mb": jnp.zeros((1,), "float32")}

    @jax.jit
    def step(values, xb, yb):
        def loss_of(w, b):
            return ((xb @ w + b - yb) ** 2).mean()

        loss, (gw, gb) = jax.value_and_grad(loss_of, argnums=(0, 1))(values["w"], values["b"])
        mw, mb = 0.9 * values["mw"] + gw, 0.9 * values["mb"] + gb
        return loss, {"w": values["w"] - 0.05 * mw, "b": values["b"] - 0.05 * mb, "mw": mw, "mb": mb}

    def train(xb, yb):
        loss, new = step(state, xb, yb)
        state.update(new)
        return float(loss)

    def save(folder):
        np.savez(folder / "state.npz", **{key: np.asarray(value) for key, value in state.items()})

    def load(folder):
        with np.load(folder / "state.npz") as saved:
            state.update({key: jnp.asarray(saved[key]) for key in state})

    def arrays():
        return [np.asarray(state[key]) for key in sorted(state)]

    return dict(save=save, load=load), train, arrays


def torch_kind():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)

    def train(xb, yb):
        optimizer.zero_grad()
        loss = ((model(torch.from_numpy(xb)) - torch.from_numpy(yb)) ** 2).mean()
        loss.backward()
        optimizer.step()
        return loss.item()

    def arrays():
        momentum = [optimizer.state[p]["momentum_buffer"].numpy() for p in model.parameters() if p in optimizer.state]
        return [p.detach().numpy().copy() for p in model.parameters()] + momentum

    parts = dict(state={"model": model, "optimizer": optimizer, "scheduler": scheduler}, _epoch_end=scheduler.step)
    return parts, train, arrays


KINDS = {"tape": tape_kind, "keras-jax": keras_jax_kind, "jax": jax_kind, "torch": torch_kind}


def _dump(path, arrays):
    if path:
        np.savez(path, *arrays())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=sorted(KINDS), required=True)
    parser.add_argument("--name", default="loop")
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--item-sleep", type=float, default=0.0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--pause-at", metavar="EPOCH:ITEM", help="pause after that item (a test then commands it)")
    parser.add_argument("--dump-start")
    parser.add_argument("--dump-end")
    args = parser.parse_args(argv)
    if args.kind == "keras-jax":
        os.environ["KERAS_BACKEND"] = "jax"
    from jupyter_traincontrol import TrainLoop

    parts, train, arrays = KINDS[args.kind]()
    epoch_end = parts.pop("_epoch_end", None)
    x, y = _data()
    trained = []
    pause_at = [int(part) for part in args.pause_at.split(":")] if args.pause_at else None
    with TrainLoop(name=args.name, checkpoint_dir=args.checkpoint_dir, resume=args.resume, **parts) as loop:
        _dump(args.dump_start, arrays)
        print("READY", loop.name, loop.fifo, flush=True)
        for epoch in loop.epochs(args.epochs):
            for index, xb, yb in loop.batches(_batches(x, y)):
                loop.log(loss=train(xb, yb))
                trained.append([epoch, index])
                if [epoch, index] == pause_at:
                    loop.send("pause", sender="program")
                time.sleep(args.item_sleep)
            if epoch_end is not None:
                epoch_end()
    _dump(args.dump_end, arrays)
    result = {"state": loop.state, "epoch": loop.epoch, "step": loop.step, "trained": trained,
              "checkpoints": [str(path) for path in loop.checkpoints]}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()  # no sys.exit: the tests' linger mode runs this module and then waits
