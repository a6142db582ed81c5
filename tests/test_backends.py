"""What differs between Keras backends, on the backend of ``KERAS_BACKEND``.

On JAX and torch (backends Keras marks thread-safe), `fit` calls the
batch-end hooks on a thread pool while the next step trains, unless a
callback in the list overrides them without ``async_safe = True``.
`ControlCallback` is async-safe (see its ``async_safe``): with it and an
async-safe callback, the batch-end hooks run on the pool (no host sync per
step) except where a command waits, whose step's hooks run on the training
thread, and commands act at the step they were taken.
On JAX the trainer keeps the variables outside the model during `fit`: the
callback syncs them back for a command only, never per batch.
"""

from __future__ import annotations

import threading

import keras
import numpy as np
import pytest

from driving import BATCH, fit
from helpers import At, read_sidecar, wait_until
from jupyter_traincontrol import ControlCallback
from jupyter_traincontrol.transport.channels import deliver



class AsyncSafeProbe(keras.callbacks.Callback):
    """An async-safe callback that notes the threads its batch hook runs on."""

    async_safe = True

    def __init__(self):
        super().__init__()
        self.threads: set[int] = set()

    def on_train_batch_end(self, batch, logs=None):
        self.threads.add(threading.get_ident())


def queue_command(control, command):
    """Writes `command` to the run's FIFO and waits until the reader queued it."""
    deliver(control.fifo, command)
    wait_until(lambda: control.lifecycle.channel.pending, message=f"{command} queued")


def test_without_control_an_async_safe_callback_runs_where_keras_puts_it(make_model, tiny_data):
    """The scenario below is real: on JAX and torch this probe alone runs on
    Keras's thread pool (on TensorFlow Keras never uses one)."""
    probe = AsyncSafeProbe()
    fit(make_model(), tiny_data, probe, epochs=1)
    on_training_thread = probe.threads == {threading.get_ident()}
    assert on_training_thread == (keras.backend.backend() not in ("jax", "torch")), probe.threads


def test_with_an_async_safe_callback_commands_act_at_the_step_they_were_taken(make_model, tiny_data, tmp_path):
    model = make_model()
    probe = AsyncSafeProbe()
    control = ControlCallback(name="async", checkpoint_dir=tmp_path / "ck", verbose=False)
    weights_after_3_steps = []
    # Hooks before a batch are never dispatched to the pool: the commands are
    # queued before batch 2 of epoch 0 and batch 3 of epoch 1, so they act
    # right after those batches (3 and 8 + 4 optimizer steps).
    callbacks = [
        probe,
        control,
        At(0, 2, lambda _: queue_command(control, "save"), hook="on_train_batch_begin"),
        At(0, 3, lambda cb: weights_after_3_steps.append(cb.model.get_weights()), hook="on_train_batch_begin"),
        At(1, 3, lambda _: queue_command(control, "stop"), hook="on_train_batch_begin"),
    ]
    history = fit(model, tiny_data, *callbacks)
    assert threading.get_ident() in probe.threads  # the commands' steps: their hooks on the training thread
    pooled = keras.backend.backend() in ("jax", "torch")
    assert (len(probe.threads) > 1) == pooled, probe.threads  # the others on Keras's pool (JAX, torch)
    assert history.epoch == [0, 1] and control.state == "stopped"

    saved, stopped = control.checkpoints
    assert read_sidecar(saved)["global_step"] == 3
    assert read_sidecar(stopped)["global_step"] == 8 + 4 == int(model.optimizer.iterations.numpy())
    for checkpoint, expected in ((saved, weights_after_3_steps[0]), (stopped, model.get_weights())):
        loaded = keras.models.load_model(checkpoint)
        assert int(loaded.optimizer.iterations.numpy()) == read_sidecar(checkpoint)["global_step"]
        for got, want in zip(loaded.get_weights(), expected):
            np.testing.assert_array_equal(got, want)


@pytest.mark.backends("jax", reason="only JAX keeps the variables outside the model during fit")
def test_on_jax_the_state_is_synced_per_command_not_per_batch(make_model, tmp_path):
    """Reading ``Callback.model`` on JAX copies the trainer's state into the
    model; the batch hook must not do it. A fit 4 times longer makes no more
    syncs, and a ``save`` makes them only around itself."""

    def syncs(batches: int, *commands_at: int) -> int:
        model = make_model()
        calls = []
        original = model.jax_state_sync
        model.jax_state_sync = lambda: (calls.append(1), original())[1]  # counts, then syncs
        control = ControlCallback(name=f"sync-{batches}-{len(commands_at)}", checkpoint_dir=tmp_path / "ck",
                                  verbose=False, save_at_end=False)  # only the commands' checkpoints (and syncs)
        senders = [At(0, at, lambda _: queue_command(control, "save"), hook="on_train_batch_begin")
                   for at in commands_at]
        x = np.random.default_rng(0).random((batches * BATCH, 3), dtype="float32")
        model.fit(x, x.sum(1, keepdims=True), batch_size=BATCH, epochs=1, verbose=0, callbacks=[control, *senders])
        assert len(control.checkpoints) == len(commands_at)
        return len(calls)

    baseline = syncs(8)
    assert syncs(32) == baseline  # none per batch
    assert syncs(32, 5, 20) > baseline  # the probe does see the syncs a command makes


@pytest.mark.backends("tensorflow", "torch", reason="the NaN is injected through a variable, which JAX's jitted step does not see")
def test_with_every_hook_on_the_pool_a_nan_is_acted_on_and_no_checkpoint_follows_it(make_model, tiny_data, tmp_path):
    """A NaN loss seen on Keras's pool (torch) ends the fit within a few steps;
    a save asked for right after the NaN step is refused (its boundary first
    waits for every earlier step's check), and the only checkpoint is finite."""
    model = make_model()
    flag = keras.Variable(0.0, trainable=False, name="nan_flag")

    def loss(y_true, y_pred):
        return keras.ops.mean(keras.ops.square(y_true - y_pred)) * keras.ops.where(flag > 0, float("nan"), 1.0)

    model.compile(optimizer="adam", loss=loss)
    probe = AsyncSafeProbe()
    control = ControlCallback(name="nan-pool", checkpoint_dir=tmp_path / "ck", verbose=False)
    callbacks = [
        probe,
        control,
        At(0, 2, lambda _: queue_command(control, "save"), hook="on_train_batch_begin"),
        At(1, 2, lambda _: flag.assign(1.0), hook="on_train_batch_begin"),  # the NaN step
        At(1, 3, lambda _: queue_command(control, "save #late"), hook="on_train_batch_begin"),
    ]
    history = fit(model, tiny_data, *callbacks, epochs=3)
    assert control.state == "stopped" and history.epoch == [0, 1]
    (checkpoint,) = control.checkpoints
    assert read_sidecar(checkpoint)["global_step"] == 3
    stopped_at = int(model.optimizer.iterations.numpy())
    late = next((a for a in control.lifecycle.journal.acks if "late" in a["ids"]), None)
    if keras.backend.backend() == "torch":  # on the pool: acted on within a few steps of the NaN (batch 3 of epoch 2)
        assert 8 + 3 <= stopped_at <= 8 + 6, stopped_at
        assert late["outcome"] == "failed" and "not all finite" in late["message"]
    else:  # TensorFlow calls every hook on the training thread: at the NaN step itself
        assert stopped_at == 8 + 3 and late is None
