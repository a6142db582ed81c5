"""Saves that do not hold training: a snapshot at the boundary, the file on a writer thread.

Real fits of a tiny model; a slow write is made with the store's
``on_phase`` hook (it runs on the thread that writes).
"""

from __future__ import annotations

import json
import random
import threading
import time
import zipfile

import keras
import numpy as np
import pytest

from jupyter_traincontrol import ControlCallback
from jupyter_traincontrol.state import KerasState, ModelSnapshot, SnapshotBuffers, frozen, random_state

BACKEND = keras.backend.backend()


def _state(model) -> list[np.ndarray]:
    return [np.array(v) for v in model.weights] + [np.array(v) for v in model.optimizer.variables]


def _loaded_state(path) -> list[np.ndarray]:
    model = keras.models.load_model(path)
    return _state(model)


class Scripted(keras.callbacks.Callback):
    """Sends commands at chosen batches (global count) and records the state
    right after `ControlCallback` acted (it comes after it in the list)."""

    def __init__(self, control, plan: dict[int, list[str]], on_phase=None):
        super().__init__()
        self.control, self.plan, self.on_phase = control, plan, on_phase
        self.count = 0
        self.states: dict[int, list[np.ndarray]] = {}
        self.writer_threads: dict[int, list[str]] = {}

    def on_train_begin(self, logs=None):
        if self.on_phase is not None:  # the store exists once the run is open
            self.control.lifecycle.store.on_phase = self.on_phase

    def on_train_batch_end(self, batch, logs=None):
        self.count += 1
        self.states[self.count] = _state(self.model)
        self.writer_threads[self.count] = [t.name for t in threading.enumerate() if t.name.startswith("traincontrol-writer")]
        for line in self.plan.get(self.count, []):
            self.control.lifecycle.channel.inject(line)  # read at the next boundary, like a FIFO line


def _slow(seconds: float, phase: str = "staged-model"):
    def on_phase(name):
        if name == phase:
            time.sleep(seconds)

    return on_phase


def _acks(control) -> dict[str, tuple[str, str]]:
    return {i: (ack["outcome"], ack["message"]) for ack in control.lifecycle.journal.acks for i in ack["ids"]}


def _fit(model, data, *callbacks, epochs=1):
    x, y = data
    return model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, verbose=0, callbacks=list(callbacks))


def test_snapshot_file_is_the_state_of_its_boundary_and_loads(make_model, tiny_data, tmp_path):
    model = make_model()
    _fit(model, tiny_data)
    snapshot = ModelSnapshot.take(model)
    model.save(tmp_path / "then.keras")
    _fit(model, tiny_data)  # training goes on; the snapshot must not change
    snapshot.save(tmp_path / "snap.keras")
    for a, b in zip(_loaded_state(tmp_path / "snap.keras"), _loaded_state(tmp_path / "then.keras")):
        assert np.array_equal(a, b)
    assert snapshot.nbytes > 0
    snapshot.release()


def test_snapshots_reuse_their_host_arrays_and_each_file_is_its_own_boundary(make_model, tiny_data, tmp_path):
    model = make_model()
    _fit(model, tiny_data)
    buffers = SnapshotBuffers()
    first = ModelSnapshot.take(model, buffers)
    assert "save_own_variables" not in vars(model.optimizer)  # the walk's hand-over is undone
    model.save(tmp_path / "first-plain.keras")
    arrays = [id(a) for a in first._arrays]
    assert len(arrays) == len(model.weights) + len(model.optimizer.variables)  # every variable copied once, into them
    first.save(tmp_path / "first.keras")
    first.release()
    assert buffers.nbytes == first.nbytes > 0  # kept for the next snapshot
    _fit(model, tiny_data)
    second = ModelSnapshot.take(model, buffers)
    assert [id(a) for a in second._arrays] == arrays and buffers.nbytes == 0  # the same arrays, now held
    model.save(tmp_path / "second-plain.keras")
    second.save(tmp_path / "second.keras")
    second.release()
    for snap, plain in (("first", "first-plain"), ("second", "second-plain")):
        for a, b in zip(_loaded_state(tmp_path / f"{snap}.keras"), _loaded_state(tmp_path / f"{plain}.keras"), strict=True):
            assert np.array_equal(a, b), snap
    assert not np.array_equal(_loaded_state(tmp_path / "first.keras")[0], _loaded_state(tmp_path / "second.keras")[0])
    buffers.clear()
    assert buffers.nbytes == 0


def test_a_snapshot_of_views_writes_the_same_file_as_model_save(make_model, tiny_data, tmp_path):
    model = make_model()
    _fit(model, tiny_data)
    views = ModelSnapshot.take(model, SnapshotBuffers(), copy=False)  # a stop's: the model waits for the write
    assert views._arrays == [] and views._buffers is None  # nothing copied, nothing kept
    views.save(tmp_path / "views.keras")
    views.release()
    model.save(tmp_path / "plain.keras")
    for a, b in zip(_loaded_state(tmp_path / "views.keras"), _loaded_state(tmp_path / "plain.keras"), strict=True):
        assert np.array_equal(a, b)


def _compile_config(path) -> dict:
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("config.json"))["compile_config"]


def test_snapshots_of_one_layout_keep_the_compile_config_of_their_moment(make_model, tiny_data, tmp_path):
    """The compile config a reused layout keeps is serialized anew when the
    optimizer's config changes (a learning rate, a Python hyperparameter)
    or the model is compiled again, and is what ``model.save`` writes."""
    model = make_model()
    _fit(model, tiny_data)
    layout = ModelSnapshot.take(model).layout

    def same_as_model_save(name):
        snapshot = ModelSnapshot.take(model, layout=layout)
        assert snapshot.layout is layout
        snapshot.save(tmp_path / f"{name}.keras")
        snapshot.release()
        model.save(tmp_path / f"{name}-plain.keras")
        config = _compile_config(tmp_path / f"{name}.keras")
        assert config == _compile_config(tmp_path / f"{name}-plain.keras"), name
        return config

    first = same_as_model_save("first")
    assert same_as_model_save("unchanged") == first
    model.optimizer.learning_rate.assign(0.25)
    assert same_as_model_save("lr")["optimizer"]["config"]["learning_rate"] == 0.25
    model.optimizer.beta_1 = 0.5
    assert same_as_model_save("beta_1")["optimizer"]["config"]["beta_1"] == 0.5
    model.compile(model.optimizer, "mae")  # compiled again, with the same optimizer: the same variables
    assert same_as_model_save("recompiled")["loss"] == "mae"


def test_a_snapshot_keeps_the_learning_rate_of_its_moment_and_a_custom_optimizer_config_is_read_whole(
        make_model, tiny_data, tmp_path):
    """A reused layout reads a Keras optimizer's learning rate when the
    file is written (`frozen.Late`): still the value when taken. An
    optimizer with a ``get_config`` of its own is keyed by all of it, so a
    change of what it writes is seen whatever its type."""
    model = make_model()
    _fit(model, tiny_data)
    layout = ModelSnapshot.take(model).layout
    ModelSnapshot.take(model, layout=layout).release()  # the layout's compile config is kept from here on
    model.optimizer.learning_rate.assign(0.125)
    snapshot = ModelSnapshot.take(model, layout=layout)
    model.optimizer.learning_rate.assign(0.5)  # after the snapshot, before its file
    snapshot.save(tmp_path / "taken.keras")
    snapshot.release()
    assert _compile_config(tmp_path / "taken.keras")["optimizer"]["config"]["learning_rate"] == 0.125

    class Annealed(keras.optimizers.SGD):
        def __init__(self, *args, phases=None, **kwargs):
            super().__init__(*args, **kwargs)
            self.phases = dict(phases or {"warm": 1})

        def get_config(self):
            return {**super().get_config(), "phases": dict(self.phases)}

    model = make_model()
    model.compile(Annealed(0.01), "mse")
    _fit(model, tiny_data)
    layout = ModelSnapshot.take(model).layout
    ModelSnapshot.take(model, layout=layout).release()
    model.optimizer.phases["cool"] = 2  # in place: no plain attribute changed
    snapshot = ModelSnapshot.take(model, layout=layout)
    snapshot.save(tmp_path / "custom.keras")
    snapshot.release()
    assert _compile_config(tmp_path / "custom.keras")["optimizer"]["config"]["phases"] == {"warm": 1, "cool": 2}


def test_a_snapshot_gives_the_step_and_learning_rate_it_took_without_reading_them_again(
        make_model, tiny_data, tmp_path, monkeypatch):
    """The optimizer's step and learning rate are variables a snapshot
    takes: the step a background save records and the learning rate of
    its compile config are those values (`ModelSnapshot.late`), not a
    second read of the variables (each a cold eager op on TensorFlow),
    and later training does not change them (torch's host copies too)."""
    model = make_model()
    _fit(model, tiny_data)
    state = KerasState(model)
    state.snapshot(None).release()  # the layout's compile config is kept from here on
    model.optimizer.learning_rate.assign(0.125)
    taken_step = int(model.optimizer.iterations)
    read = []
    freeze = frozen.freeze
    monkeypatch.setattr(frozen, "freeze", lambda variable: read.append(variable.path) or freeze(variable))
    snapshot = state.snapshot(SnapshotBuffers())
    step = state.step_later(snapshot)
    read_again = sorted({path for path in read if read.count(path) > 1})  # the snapshot's own take is the first
    assert read_again == [] and read
    model.optimizer.learning_rate.assign(0.5)
    _fit(model, tiny_data)  # after the snapshot, before its file
    assert int(model.optimizer.iterations) > taken_step
    assert step() == taken_step
    snapshot.save(tmp_path / "taken.keras")
    snapshot.release()
    assert _compile_config(tmp_path / "taken.keras")["optimizer"]["config"]["learning_rate"] == 0.125
    assert ModelSnapshot.take(model).late(model.optimizer.iterations, int).value() == int(model.optimizer.iterations)


@pytest.mark.skipif(BACKEND != "torch", reason="torch updates its variables in place: the backend that copies them")
def test_on_torch_a_tensor_on_an_accelerator_is_copied_there_and_only_the_writer_brings_it_to_the_host(
        make_model, tiny_data, tmp_path, monkeypatch):
    """A snapshot on torch keeps a tensor on a CUDA device as a copy queued
    there (`frozen.freeze`), not a host copy made on the training thread
    (on an H200 that held training 0.7-0.8 s for 1 GB); the writer brings
    it to the host. No CUDA device here: `freeze` gives the copy it gives
    for one, and the host transfer is watched for the thread it runs on."""
    model = make_model()
    _fit(model, tiny_data)
    copied_on_device = []

    def device_copy(variable):  # frozen.freeze of a CUDA tensor: value.detach().clone(), queued on the device
        copied_on_device.append(variable.path)
        return variable.value.detach().clone()

    to_host = frozen.torch_on_host
    brought_by = []
    monkeypatch.setattr(frozen, "freeze", device_copy)
    monkeypatch.setattr(frozen, "torch_on_host", lambda t: brought_by.append(threading.current_thread().name) or to_host(t))
    state, buffers = KerasState(model), SnapshotBuffers()
    boundary, boundary_step = _state(model), int(model.optimizer.iterations)
    snapshot = state.snapshot(buffers)
    step = state.step_later(snapshot)
    assert len(copied_on_device) == len(model.weights) + len(model.optimizer.variables)
    assert snapshot._arrays == [] and brought_by == []  # nothing copied to the host on the training thread
    _fit(model, tiny_data)  # training goes on before the file is written
    writer = threading.Thread(target=lambda: (snapshot.save(tmp_path / "device.keras"), step()), name="writer")
    writer.start()
    writer.join()
    snapshot.release()
    assert set(brought_by) == {"writer"}
    # Each tensor comes over once (the finiteness check and the file read that copy), and the step and
    # the learning rate the checkpoint records come from the copies the snapshot took.
    assert len(brought_by) == len(copied_on_device) + 2
    assert step() == boundary_step < int(model.optimizer.iterations)
    for saved, taken in zip(_loaded_state(tmp_path / "device.keras"), boundary, strict=True):
        assert np.array_equal(saved, taken)
    assert buffers.nbytes == 0  # no host copy kept between saves


def test_a_background_save_records_the_step_learning_rate_and_seeds_of_its_boundary(make_model, tiny_data, tmp_path):
    """What a checkpoint records of the optimizer and the random state is
    brought to the host by its writer (`frozen.Late`), but is that of its
    boundary: the writer here starts only after later batches changed all
    three."""
    model = make_model()
    keras.random.uniform((1,))  # makes Keras's global seed generator
    control = ControlCallback(name="late", checkpoint_dir=tmp_path / "ck", verbose=False, handle_sigint=False,
                              save_at_end=False)
    probe = Scripted(control, {2: ["save #late"]}, on_phase=_slow(0.5, "writer-started"))
    seen = {}

    class ChangeAll(keras.callbacks.Callback):  # after the probe: the save of this boundary is taken
        def on_train_batch_end(self, batch, logs=None):
            generator = keras.src.backend.common.global_state.get_global_attribute("global_seed_generator")
            seen[probe.count] = (float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)),
                                 [int(v) for v in keras.ops.convert_to_numpy(generator.state).reshape(-1)])
            self.model.optimizer.learning_rate.assign(0.001 * (probe.count + 1))
            keras.random.uniform((1,))  # draws: the global seed generator's state moves on

    _fit(model, tiny_data, control, probe, ChangeAll())
    (checkpoint,) = control.lifecycle.checkpoints()
    assert checkpoint.info["global_step"] == 3
    learning_rate, seeds = seen[3]
    assert _compile_config(checkpoint.path)["optimizer"]["config"]["learning_rate"] == pytest.approx(learning_rate)
    assert checkpoint.info["resume_state"]["seed_generators"]["global"] == seeds
    assert seen[4][1] != seeds and seen[4][0] != learning_rate  # they did change before the writer read them


def test_a_captured_resume_state_is_the_state_when_taken_whenever_it_is_packed():
    """`random_state.capture` packs its states when first read (on the
    writer's thread): what it holds is still the moment it was taken."""
    random.seed(7)
    np.random.seed(7)
    captured = random_state.capture(None, 3, None)
    expected = random_state.EpochStart().packed()  # nothing drawn since
    random.random(), np.random.rand(5)
    assert dict(captured)["now"] == expected and captured["epoch_start"] == expected and captured["epoch"] == 3
    assert random_state.restore(None, dict(captured), 3) is None
    assert random_state.EpochStart().packed() == expected  # restored: the numbers drawn since are drawn again


def test_back_to_back_background_saves_each_hold_their_boundary_and_the_copy_is_dropped_at_the_end(
        make_model, tiny_data, tmp_path):
    model = make_model()
    control = ControlCallback(name="reuse", checkpoint_dir=tmp_path / "ck", keep=5, verbose=False, handle_sigint=False,
                              save_at_end=False)
    probe = Scripted(control, {2: ["save #a"], 3: ["save #b"], 12: ["save #c"]}, on_phase=_slow(0.3))

    class WaitForWriter(keras.callbacks.Callback):  # b reuses a's arrays, c reuses b's: never two copies at once
        def on_train_batch_end(self, batch, logs=None):
            if probe.count in (5, 10):
                control.session.actions.saves._writer.wait()

    _fit(model, tiny_data, control, probe, WaitForWriter())
    checkpoints = control.lifecycle.checkpoints()
    assert len(checkpoints) == 3, [c.path.name for c in checkpoints]
    for checkpoint in checkpoints:
        for a, b in zip(_loaded_state(checkpoint.path), probe.states[checkpoint.info["global_step"]], strict=True):
            assert np.array_equal(a, b), checkpoint.info["global_step"]
    assert control.session.actions.saves._buffers.nbytes == 0  # the host copy does not outlive the fit


def test_a_save_is_written_in_the_background_with_the_weights_of_its_boundary(make_model, tiny_data, tmp_path):
    model = make_model()
    control = ControlCallback(name="bg", checkpoint_dir=tmp_path / "ck", verbose=False, handle_sigint=False,
                              save_at_end=False)
    probe = Scripted(control, {2: ["save #one"]}, on_phase=_slow(0.5))
    _fit(model, tiny_data, control, probe)
    (checkpoint,) = control.lifecycle.checkpoints()
    assert checkpoint.info["global_step"] == 3  # taken at the boundary after batch 3
    for a, b in zip(_loaded_state(checkpoint.path), probe.states[3]):
        assert np.array_equal(a, b)
    assert any(probe.writer_threads[n] for n in (3, 4, 5)), "the write did not run on a writer thread while training went on"
    assert _acks(control)["one"] == ("applied", f"checkpoint written: {checkpoint.path}")


def test_saves_during_a_write_merge_into_the_next_and_all_are_answered(make_model, tiny_data, tmp_path):
    model = make_model()
    control = ControlCallback(name="merge", checkpoint_dir=tmp_path / "ck", keep=5, verbose=False, handle_sigint=False,
                              save_at_end=False)
    probe = Scripted(control, {1: ["save #a"], 2: ["save #b"], 3: ["save #c", "save #d"]}, on_phase=_slow(0.6))
    _fit(model, tiny_data, control, probe, epochs=2)
    checkpoints = control.lifecycle.checkpoints()
    assert len(checkpoints) == 2, [c.path.name for c in checkpoints]
    first, second = checkpoints
    assert first.info["global_step"] == 2
    assert second.info["global_step"] > 4  # the first boundary after the first write was done
    acks = _acks(control)
    assert acks["a"] == ("applied", f"checkpoint written: {first.path}")
    assert acks["b"] == acks["c"] == acks["d"] == ("applied", f"checkpoint written: {second.path}")


def test_a_stop_waits_for_the_write_in_flight_and_saves_its_own_boundary(make_model, tiny_data, tmp_path):
    model = make_model()
    control = ControlCallback(name="stopper", checkpoint_dir=tmp_path / "ck", keep=5, verbose=False, handle_sigint=False)
    probe = Scripted(control, {1: ["save #s"], 2: ["save #t", "stop #x"]}, on_phase=_slow(0.5))
    _fit(model, tiny_data, control, probe, epochs=3)
    checkpoints = control.lifecycle.checkpoints()
    assert [c.info["reason"] for c in checkpoints] == ["save", "stop"]
    stop = checkpoints[-1]
    assert stop.info["global_step"] == 3
    for a, b in zip(_loaded_state(stop.path), probe.states[3]):
        assert np.array_equal(a, b)
    acks = _acks(control)
    assert acks["x"][0] == acks["t"][0] == acks["s"][0] == "applied"
    assert acks["t"] == acks["x"]  # the save waiting is answered with the stop's checkpoint


def test_a_failing_background_write_is_reported_failed_and_training_goes_on(make_model, tiny_data, tmp_path, monkeypatch):
    def broken(self, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ModelSnapshot, "save", broken)
    model = make_model()
    control = ControlCallback(name="full", checkpoint_dir=tmp_path / "ck", verbose=False, handle_sigint=False)
    probe = Scripted(control, {2: ["save #f"]})
    _fit(model, tiny_data, control, probe)
    assert probe.count == 16 and control.lifecycle.checkpoints() == []
    outcome, message = _acks(control)["f"]
    assert outcome == "failed" and "No space left on device" in message
    assert not (tmp_path / "ck").exists()  # nothing half-written: the folder the run made held nothing, and went


def test_saving_in_the_foreground_writes_on_the_training_thread(make_model, tiny_data, tmp_path):
    model = make_model()
    control = ControlCallback(name="fg", checkpoint_dir=tmp_path / "ck", verbose=False, handle_sigint=False,
                              save_in_background=False, save_at_end=False)
    threads = []
    probe = Scripted(control, {2: ["save #g"]}, on_phase=lambda name: threads.append(threading.current_thread().name))
    _fit(model, tiny_data, control, probe)
    assert set(threads) == {threading.current_thread().name}
    (checkpoint,) = control.lifecycle.checkpoints()
    assert _acks(control)["g"][0] == "applied" and checkpoint.info["global_step"] == 3


@pytest.mark.parametrize("background", [True, False])
def test_a_save_waiting_when_fit_ends_is_written_then(make_model, tiny_data, tmp_path, background):
    model = make_model()
    control = ControlCallback(name="late", checkpoint_dir=tmp_path / "ck", keep=5, verbose=False, handle_sigint=False,
                              save_in_background=background)
    probe = Scripted(control, {14: ["save #p"], 15: ["save #q"]}, on_phase=_slow(0.8))
    _fit(model, tiny_data, control, probe)
    acks = _acks(control)
    assert acks["p"][0] == acks["q"][0] == "applied"
    assert control.lifecycle.checkpoints()[-1].info["global_step"] == 16  # q, written as fit ended


def test_a_snapshot_places_large_arrays_and_writes_the_datasets_of_model_save(tmp_path):
    """Arrays of 64 KiB and more are placed in the HDF5 image (not copied by
    h5py); a boolean one cannot be and is written by h5py: every dataset of
    the file equals model.save's, dtype and bytes, and the file loads."""
    import io
    import zipfile

    import h5py

    class Flags(keras.layers.Layer):  # a large boolean weight: not placeable
        def build(self, input_shape):
            self.flags = self.add_weight(shape=(70_000,), dtype="bool", initializer="ones", trainable=False)

        def call(self, inputs):
            return inputs

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512), Flags(), keras.layers.Dense(3)])
    model.compile("adam", "mse")
    model.fit(np.random.rand(16, 64), np.random.rand(16, 3), batch_size=8, verbose=0)
    snapshot = ModelSnapshot.take(model)
    snapshot.save(tmp_path / "snap.keras")
    snapshot.release()
    model.save(tmp_path / "plain.keras")

    def datasets(path):
        with zipfile.ZipFile(path) as archive, h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r") as h5:
            found = {}
            h5.visititems(lambda name, item: found.setdefault(name, item[()]) if isinstance(item, h5py.Dataset) else None)
            return found

    ours, plain = datasets(tmp_path / "snap.keras"), datasets(tmp_path / "plain.keras")
    assert sorted(ours) == sorted(plain)
    assert any(value.nbytes >= 64 << 10 for value in ours.values())  # the placed path was taken
    for name, value in plain.items():
        assert ours[name].dtype == value.dtype and ours[name].tobytes() == value.tobytes(), name
    loaded = keras.models.load_model(tmp_path / "snap.keras", custom_objects={"Flags": Flags})
    for a, b in zip(_state(loaded), _state(model), strict=True):
        assert np.array_equal(a, b)
