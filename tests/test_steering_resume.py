"""What a resume and a rollback do with the learning rate: the checkpoint's
own, unless a value ``set`` gave still holds.

- A resume after ``set lr`` and a later change by a callback
  (`ReduceLROnPlateau`'s way: assigning ``optimizer.learning_rate``) or a
  PyTorch scheduler continues with the later value, not the steered one.
- A rollback with nothing set leaves a Keras schedule a schedule and a
  torch scheduler's base rate as it is, and names what went back.
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest

import driving
from driving import LearningRates, inject
from helpers import read_sidecar
from jupyter_traincontrol import ControlCallback, TrainLoop
from jupyter_traincontrol.registry import find_run

fit = functools.partial(driving.fit, epochs=4)


class CutAt(keras.callbacks.Callback):
    """Sets the learning rate at an epoch's begin, as ReduceLROnPlateau does at an epoch's end."""

    def __init__(self, epoch, rate):
        super().__init__()
        self.epoch, self.rate = epoch, rate

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            self.model.optimizer.learning_rate = self.rate


def test_a_resume_continues_with_the_rate_a_callback_set_after_a_steered_one(make_model, tiny_data, ckpt):
    model = make_model()
    control = ControlCallback(name="cut", checkpoint_dir=ckpt, verbose=False)
    fit(model, tiny_data, control, inject(control, "set lr=0.05", 0, 1), CutAt(2, 1e-5), inject(control, "stop", 3, 1))
    (stopped,) = control.checkpoints
    assert "learning_rate" not in (read_sidecar(stopped).get("tunables") or {})  # the callback's change won
    resumed = ControlCallback(name="cut", checkpoint_dir=ckpt, resume=True, verbose=False)
    rates = LearningRates()
    fit(make_model(seed=1), tiny_data, resumed, rates)
    assert rates.rates == pytest.approx([1e-5] * len(rates.rates))


def test_a_steered_rate_that_still_holds_is_kept_and_set_again_at_resume(make_model, tiny_data, ckpt):
    model = make_model()
    control = ControlCallback(name="held", checkpoint_dir=ckpt, verbose=False)
    fit(model, tiny_data, control, inject(control, "set lr=0.05", 0, 1), inject(control, "stop", 2, 1))
    assert read_sidecar(control.checkpoints[-1])["tunables"] == {"learning_rate": 0.05}
    resumed = ControlCallback(name="held", checkpoint_dir=ckpt, resume=True, verbose=False)
    rates = LearningRates()
    fit(make_model(seed=1), tiny_data, resumed, rates)
    assert rates.rates == pytest.approx([0.05] * len(rates.rates))
    assert not any(event["kind"] == "change" for event in find_run("held")["events"])  # the file held it: no "0.05 -> 0.05"


def test_a_rollback_with_nothing_set_keeps_a_keras_schedule_and_names_what_went_back(make_model, tiny_data, ckpt):
    model = make_model()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=1, decay_rate=0.9)
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss="mse")
    control = ControlCallback(name="decay", checkpoint_dir=ckpt, verbose=False, save_at_end=False)
    rates = LearningRates()
    fit(model, tiny_data, control, rates, inject(control, "save", 0, 2), inject(control, "rollback #rb", 1, 2), epochs=2)
    assert isinstance(model.optimizer._learning_rate, keras.optimizers.schedules.ExponentialDecay)
    after = rates.rates[8 + 3:]  # from batch 3 of epoch 2: the schedule at the checkpoint's step 3, on
    assert after == pytest.approx([0.01 * 0.9 ** step for step in range(3, 3 + len(after))], rel=1e-5)
    message = next(a for a in find_run("decay")["acks"] if "rb" in a["ids"])["message"]
    assert "learning_rate 0.0031381 -> 0.00729 (the checkpoint's)" in message


torch = pytest.importorskip("torch")


def _torch_loop(ckpt, scheduler_kind, commands_at, epochs, resume=False):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if scheduler_kind == "step":
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.5 ** epoch)
    x = torch.from_numpy(np.random.default_rng(0).random((32, 3), dtype="float32"))
    rates = []
    with TrainLoop(name=f"torch-{scheduler_kind}", checkpoint_dir=ckpt, resume=resume, verbose=False,
                   state={"model": model, "optimizer": optimizer, "scheduler": scheduler}) as loop:
        for epoch in loop.epochs(epochs):
            for index, xb in enumerate(loop.batches([x[i:i + 8] for i in range(0, 32, 8)])):
                rates.append(optimizer.param_groups[0]["lr"])
                optimizer.zero_grad()
                loss = (model(xb) ** 2).mean()
                loss.backward()
                optimizer.step()
                loop.log(loss=loss.item())
                for command in commands_at.get((epoch, index), ()):
                    loop.send(command)
            scheduler.step()
    return loop, rates, scheduler


def test_a_torch_loop_resumes_with_its_schedulers_rate_not_one_set_before_it(ckpt):
    loop, _, _ = _torch_loop(ckpt, "step", {(0, 1): ["set lr=0.08"], (3, 1): ["stop"]}, epochs=6)
    assert loop.state == "stopped"
    _, rates, _ = _torch_loop(ckpt, "step", {}, epochs=6, resume=True)
    assert rates[0] == pytest.approx(0.08 * 0.5 ** 3)  # the checkpoint's, not 0.08 (8x)
    assert rates[-1] == pytest.approx(0.08 * 0.5 ** 5)


def test_a_torch_rollback_with_nothing_set_leaves_the_schedulers_base_rate(ckpt):
    loop, rates, scheduler = _torch_loop(ckpt, "lambda", {(0, 1): ["save"], (2, 1): ["rollback"]}, epochs=4)
    assert scheduler.base_lrs == [0.1]  # not the decayed rate of the rollback's moment
    assert rates[2 * 4 + 1] == pytest.approx(0.1 * 0.5 ** 2)  # before the rollback: epoch 3's
    assert rates[2 * 4 + 2] == pytest.approx(0.1)  # after it: the checkpoint's (epoch 1's), its schedule
    assert rates[-1] == pytest.approx(0.1 * 0.5)  # ... stepped once since, at epoch 3's end
