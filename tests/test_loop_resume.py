"""`TrainLoop` resumes as if never stopped: data order, random state, steering of stateless loops.

Each test runs "processes" one after another in this one: a leg builds
everything anew (its data, generator, model) and seeds the global random
state as a script's first lines do, then trains under a `TrainLoop` that
stops itself through the run's channel (``loop.send("stop")`` from its
body) or resumes. What the legs trained, put end to end, must be what an
uninterrupted leg trained: the same items in the same order, and the same
weights bit for bit.

- A seeded `tf.data` shuffle and a `DataLoader(generator=...)` keep their
  own order from one epoch to the next: a resume rebuilds it.
- An order drawn at the top of an epoch (``np.random.permutation``) comes
  from the epoch's start state, restored before the epoch's first line;
  a second stop in a resumed epoch keeps that start state.
- A stateless loop (``sync=``) refuses ``set`` and ``rollback`` unless it
  gives ``reload=``, and then they act on the arrays it trains.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from helpers import read_sidecar
from jupyter_traincontrol import TrainLoop
from jupyter_traincontrol.registry import find_run

EPOCHS = 3


def _seed_process():
    """What a script's first lines do: one seed for every global generator."""
    random.seed(0)
    np.random.seed(0)
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)


def _train_leg(ckpt, source, *, stop_at=None, resume=False, before_batches=None):
    """One "process": builds its data (`source()` returns a function of
    the epoch, giving one object built before the loop or a new one each
    epoch), trains EPOCHS epochs of it, recording each item; after the
    item ``(epoch, index)`` of `stop_at`, or at ``(epoch, "end")``, it sends
    ``stop``. The checkpoint is the items trained so far (a ``save=`` of
    the leg's own)."""
    _seed_process()
    make_items = source()
    trained: list = []

    def save(folder):
        (folder / "trained.json").write_text(json.dumps(trained))

    def load(folder):
        trained[:] = json.loads((folder / "trained.json").read_text())

    with TrainLoop(name="leg", checkpoint_dir=ckpt, resume=resume, save=save, load=load, verbose=False,
                   save_at_end=False) as loop:
        before = len(trained)
        for epoch in loop.epochs(EPOCHS):
            items = make_items(epoch)
            if before_batches is not None:
                items = before_batches(items)
            for index, item in enumerate(loop.batches(items)):
                trained.append([epoch, _plain(item)])
                if stop_at == (epoch, loop.step):
                    loop.send("stop")
            if stop_at == (epoch, "end"):
                loop.send("stop")
    return trained[before:], loop


def _plain(item):
    if hasattr(item, "numpy"):
        item = item.numpy()
    return np.asarray(item).tolist()


def _chain(ckpt, source, stops, **kwargs):
    """Legs stopped at each of `stops` in turn, then one to the end: what they trained, end to end."""
    trained = []
    for index, stop_at in enumerate([*stops, None]):
        leg, loop = _train_leg(ckpt, source, stop_at=stop_at, resume=index > 0, **kwargs)
        assert loop.state == ("stopped" if stop_at is not None else "finished"), (index, loop.state)
        trained += leg
    return trained


def _inexact_warnings():
    return [e["message"] for e in find_run("leg")["events"] if "not exact" in e["message"]]


# Case 5: a seeded tf.data shuffle and a seeded DataLoader ----------------------------------


def _tf_dataset():
    tf = pytest.importorskip("tensorflow")
    dataset = tf.data.Dataset.range(24).shuffle(24, seed=7).batch(4)
    return lambda epoch: dataset  # built once, before the loop: one object for every epoch


def _tf_dataset_wrapped_each_epoch():
    tf = pytest.importorskip("tensorflow")
    shuffled = tf.data.Dataset.range(24).shuffle(24, seed=7)
    return lambda epoch: shuffled.batch(4)  # a new dataset each epoch over the one shuffle


def _loader():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    loader = DataLoader(list(range(24)), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7))
    return lambda epoch: loader


def _loader_made_each_epoch():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    generator = torch.Generator().manual_seed(7)
    return lambda epoch: DataLoader(list(range(24)), batch_size=4, shuffle=True, generator=generator)


SOURCES = {"tf.data": _tf_dataset, "tf.data-wrapped-each-epoch": _tf_dataset_wrapped_each_epoch,
           "DataLoader": _loader, "DataLoader-made-each-epoch": _loader_made_each_epoch}


@pytest.mark.parametrize("stops", [[(1, 2)], [(0, "end")], [(1, 2), (1, 4)], [(0, 5), (1, "end")]],
                         ids=["mid-epoch", "epoch-end", "twice-in-one-epoch", "last-item-then-epoch-end"])
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_seeded_shuffle_resumes_in_the_order_of_an_uninterrupted_run(source, stops, tmp_path):
    make = SOURCES[source]
    uninterrupted, _ = _train_leg(tmp_path / "ref", make)
    assert [item for epoch, item in uninterrupted if epoch == 0] != [item for epoch, item in uninterrupted if epoch == 1]
    resumed = _chain(tmp_path / "ck", make, stops)
    assert resumed == uninterrupted  # every item once, in the uninterrupted order
    assert _inexact_warnings() == []


def test_a_dataset_built_anew_each_epoch_is_not_replayed(tmp_path):
    """One dataset per epoch, seeded by the epoch: its first iterator is the epoch's order."""
    tf = pytest.importorskip("tensorflow")

    def make(epoch):
        return tf.data.Dataset.range(24).shuffle(24, seed=epoch).batch(4)

    uninterrupted, _ = _train_leg(tmp_path / "ref", lambda: make)
    resumed = _chain(tmp_path / "ck", lambda: make, [(1, 3), (1, "end")])
    assert resumed == uninterrupted


def test_a_tf_data_shuffle_without_a_seed_resumes_saying_once_that_it_is_not_exact(tmp_path):
    tf = pytest.importorskip("tensorflow")
    tf.random.set_seed(None)  # no global seed either (an earlier test may have set one)

    def source():
        dataset = tf.data.Dataset.range(24).shuffle(24).batch(4)
        return lambda epoch: dataset

    _chain(tmp_path / "ck", source, [(1, 2)])
    (warning,) = _inexact_warnings()
    assert "shuffles without a seed" in warning


# Case 6: the random state of the epoch's start ----------------------------------------------


def _permuted(epoch):
    return list(range(12))


def _permute(items):
    """An order drawn at the top of the epoch, before `batches`."""
    return [items[i] for i in np.random.permutation(len(items))]


@pytest.mark.parametrize("stops", [[(1, 3)], [(1, 3), (1, 7)], [(1, 3), (1, 5), (1, "end")]],
                         ids=["once", "twice-in-one-epoch", "three-times"])
def test_an_order_drawn_at_the_top_of_an_epoch_resumes_from_the_epochs_start_state(stops, tmp_path):
    uninterrupted, _ = _train_leg(tmp_path / "ref", lambda: _permuted, before_batches=_permute)
    resumed = _chain(tmp_path / "ck", lambda: _permuted, stops, before_batches=_permute)
    assert resumed == uninterrupted
    assert _inexact_warnings() == []


def test_a_second_stop_in_a_resumed_epoch_records_the_epochs_original_start_state(tmp_path):
    _chain(tmp_path / "ck", lambda: _permuted, [(1, 3), (1, 7)], before_batches=_permute)
    sidecars = sorted((read_sidecar(path) for path in (tmp_path / "ck").glob("*.ckpt")), key=lambda info: info["sequence"])
    first, second = (info["resume_state"] for info in sidecars[-2:])
    assert first["epoch"] == second["epoch"] == 1
    assert second["epoch_start"] == first["epoch_start"]  # not the state the second leg's process began with


def test_a_torch_loop_resumes_bit_for_bit_with_a_seeded_data_loader(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    def leg(folder, stop_at=None, resume=False):
        _seed_process()
        x = torch.from_numpy(np.random.default_rng(0).random((32, 3), dtype="float32"))
        loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4, shuffle=True,
                            generator=torch.Generator().manual_seed(3))
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.25), torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        with TrainLoop(name="torch-leg", checkpoint_dir=folder, resume=resume, verbose=False, save_at_end=False,
                       state={"model": model, "optimizer": optimizer}) as loop:
            for epoch in loop.epochs(EPOCHS):
                for xb, yb in loop.batches(loader):
                    optimizer.zero_grad()
                    ((model(xb) - yb) ** 2).mean().backward()
                    optimizer.step()
                    if (epoch, loop.step) == stop_at:
                        loop.send("stop")
        return [p.detach().numpy().copy() for p in model.parameters()]

    uninterrupted = leg(tmp_path / "ref")
    leg(tmp_path / "ck", stop_at=(1, 3))
    resumed = leg(tmp_path / "ck", resume=True)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(uninterrupted, resumed))


# Case 7: set and rollback in a stateless loop ----------------------------------------------------


def _stateless_loop(ckpt, *, reload: bool, commands_at: dict):
    """A Keras model trained through ``stateless_call``/``stateless_apply``
    (jitted on JAX) on arrays of its own, written back with ``sync=``.
    Returns the loop, the arrays it trained with and the requests sent."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)
    state = {}

    def read_back():
        state.update(trainable=[v.value for v in model.trainable_variables],
                     non_trainable=[v.value for v in model.non_trainable_variables],
                     optimizer=[v.value for v in optimizer.variables])

    def sync():
        for variables, key in ((model.trainable_variables, "trainable"), (model.non_trainable_variables,
                                                                           "non_trainable"),
                               (optimizer.variables, "optimizer")):
            for variable, value in zip(variables, state[key]):
                variable.assign(value)

    read_back()
    step = _stateless_step(model, optimizer)
    x = np.random.default_rng(0).random((64, 3), dtype="float32")
    batches = [(x[i:i + 8], x[i:i + 8].sum(axis=1, keepdims=True)) for i in range(0, 64, 8)]
    requests = {}
    extra = {"reload": read_back} if reload else {}
    with TrainLoop(name="stateless", checkpoint_dir=ckpt, model=model, optimizer=optimizer, sync=sync,
                   verbose=False, **extra) as loop:
        for epoch in loop.epochs(2):
            for xb, yb in loop.batches(batches):
                loss, *values = step(state["trainable"], state["non_trainable"], state["optimizer"], xb, yb)
                state.update(zip(("trainable", "non_trainable", "optimizer"), values))
                loop.log(loss=float(loss))
                for command in commands_at.get((epoch, loop.step), ()):
                    requests[command] = loop.send(command)
    return loop, state, requests, optimizer


def _stateless_step(model, optimizer):
    import keras

    def loss_of(trainable, non_trainable, xb, yb):
        predicted, non_trainable = model.stateless_call(trainable, non_trainable, xb, training=True)
        return keras.ops.mean((predicted - yb) ** 2), non_trainable

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        @jax.jit
        def step(trainable, non_trainable, optimizer_values, xb, yb):
            (loss, non_trainable), grads = jax.value_and_grad(loss_of, has_aux=True)(trainable, non_trainable, xb, yb)
            trainable, optimizer_values = optimizer.stateless_apply(optimizer_values, grads, trainable)
            return loss, trainable, non_trainable, optimizer_values

        return step
    if backend == "torch":
        import torch

        def step(trainable, non_trainable, optimizer_values, xb, yb):
            watched = [value.detach().requires_grad_(True) for value in trainable]
            loss, non_trainable = loss_of(watched, non_trainable, torch.from_numpy(xb), torch.from_numpy(yb))
            grads = torch.autograd.grad(loss, watched)
            with torch.no_grad():
                trainable, optimizer_values = optimizer.stateless_apply(optimizer_values, list(grads),
                                                                        [value.detach() for value in watched])
            return loss.detach(), trainable, non_trainable, optimizer_values

        return step
    pytest.skip("Keras's stateless_apply does not run on TensorFlow (run this with KERAS_BACKEND=jax or torch)")


def _answer(request):
    return next(a for a in find_run("stateless")["acks"] if request.request_id in a["ids"])


def _learning_rate(values) -> float:
    return float(np.asarray(values[1]))  # optimizer.variables: iteration, learning_rate, momentums


def test_a_stateless_loop_without_reload_refuses_set_and_rollback_saying_why(ckpt):
    import keras

    loop, state, requests, _ = _stateless_loop(ckpt, reload=False,
                                               commands_at={(0, 2): ["save"], (0, 4): ["set lr=0.2", "rollback"]})
    assert loop.state == "finished"
    for command in ("set lr=0.2", "rollback"):
        answer = _answer(requests[command])
        assert answer["outcome"] == "failed", answer
        assert "sync=" in answer["message"] and "reload=" in answer["message"], answer
    assert _learning_rate(state["optimizer"]) == pytest.approx(0.01)
    end = loop.checkpoints[-1]
    assert read_sidecar(end)["reason"] == "end"
    assert "learning_rate" not in (read_sidecar(end).get("tunables") or {})
    assert float(keras.models.load_model(end).optimizer.learning_rate) == pytest.approx(0.01)


def test_a_stateless_loop_with_reload_steers_the_arrays_it_trains(ckpt):
    import keras

    loop, state, requests, optimizer = _stateless_loop(
        ckpt, reload=True, commands_at={(0, 2): ["save"], (0, 4): ["set lr=0.2"], (0, 5): ["rollback"]})
    assert loop.state == "finished"
    assert _answer(requests["set lr=0.2"])["outcome"] == "applied"
    rolled = _answer(requests["rollback"])
    assert rolled["outcome"] == "applied" and "rolled back to" in rolled["message"], rolled
    assert _learning_rate(state["optimizer"]) == pytest.approx(0.2)  # kept through the rollback
    assert int(np.asarray(state["optimizer"][0])) == 2 * 8 - 3  # the rollback took three updates back
    end = loop.checkpoints[-1]
    assert read_sidecar(end)["tunables"]["learning_rate"] == pytest.approx(0.2)
    assert float(keras.models.load_model(end).optimizer.learning_rate) == pytest.approx(0.2)


def test_reload_without_sync_is_refused_at_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default checkpoint folder is made under the current one
    with pytest.raises(ValueError, match=r"^reload= goes with sync=: .*got reload=function and sync=NoneType"):
        TrainLoop(save=print, load=print, reload=lambda: None)
    with pytest.raises(ValueError, match=r"got reload=int and sync=function"):
        TrainLoop(save=print, load=print, sync=lambda: None, reload=3)
