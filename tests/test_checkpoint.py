"""Atomic checkpoints: naming, pruning, loading elsewhere, and kills mid-save."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import PROGRAMS, child_env, run_python
from jupyter_traincontrol.checkpoint import LOCK_FILE, CheckpointError, CheckpointStore, TrainingPosition
from jupyter_traincontrol.state import restore_weights


@pytest.fixture
def ckdir(tmp_path):
    return tmp_path / "ck"


@pytest.fixture
def trained(make_model, tiny_data):
    model = make_model()
    model.fit(*tiny_data, batch_size=8, epochs=1, verbose=0)
    return model


def test_save_writes_a_model_and_a_sidecar(tmp_path, trained):
    store = CheckpointStore(tmp_path / "ck", run="r")
    position = TrainingPosition(epoch=2, step_in_epoch=5, steps_per_epoch=8, global_step=21)
    checkpoint = store.save(trained, position, reason="save", metrics={"loss": np.float32(0.5)}, run="r")
    assert checkpoint.path.name == "ckpt-000001-epoch0003-step000005.keras"  # epochs counted from 1, as the UI does
    info = json.loads(checkpoint.sidecar.read_text())
    assert info["tool"] == "jupyter-traincontrol" and info["format"] == 2 and info["run_id"] == store.run_id
    assert info["file"] == checkpoint.path.name and info["size"] == checkpoint.path.stat().st_size
    assert info["epoch"] == 2 and info["step_in_epoch"] == 5 and info["global_step"] == 21
    assert info["resume_epoch"] == 2 and info["resume_step"] == 5
    assert info["metrics"] == {"loss": 0.5}
    assert info["reason"] == "save" and info["run"] == "r" and info["time"].endswith("+00:00")
    assert store.latest() == checkpoint
    assert sorted(os.listdir(store.directory)) == sorted([checkpoint.path.name, checkpoint.sidecar.name, LOCK_FILE])


def test_completed_epoch_resumes_at_the_next(tmp_path, trained):
    position = TrainingPosition(epoch=2, step_in_epoch=8, steps_per_epoch=8, epoch_complete=True)
    assert (position.resume_epoch, position.resume_step) == (3, 0)


def test_keeps_the_newest_n(ckdir, trained):
    store = CheckpointStore(ckdir, keep=2)
    for step in range(5):
        store.save(trained, TrainingPosition(epoch=0, step_in_epoch=step), reason="save")
    names = [c.path.name for c in store.list()]
    assert names == ["ckpt-000004-epoch0001-step000003.keras", "ckpt-000005-epoch0001-step000004.keras"]
    assert len(os.listdir(ckdir)) == 5  # and the lock file


@pytest.mark.parametrize("keep", [0, -1, 1.5, True])
def test_keep_must_be_a_positive_whole_number(tmp_path, keep):
    with pytest.raises(ValueError, match="keep must be"):
        CheckpointStore(tmp_path, keep=keep)


def test_a_model_file_without_sidecar_is_not_a_checkpoint_and_not_ours_to_clean(ckdir, trained):
    """Files that only look like a killed save's remains (no record of ours
    says so) are not listed and stay; their number is not reused."""
    store = CheckpointStore(ckdir)
    first = store.save(trained, TrainingPosition(epoch=0, step_in_epoch=1), reason="save")
    (ckdir / "ckpt-000002-epoch0000-step000002.keras").write_bytes(b"half a zip")
    partial = ckdir / ".partial-999999999-x"
    partial.mkdir()
    (partial / "model.keras").write_bytes(b"half")
    assert store.latest() == first
    second = store.save(trained, TrainingPosition(epoch=0, step_in_epoch=3), reason="save")
    assert second.sequence == 3
    assert store.list() == [first, second]
    assert sorted(os.listdir(ckdir)) == sorted(
        [first.path.name, first.sidecar.name, second.path.name, second.sidecar.name, LOCK_FILE,
         "ckpt-000002-epoch0000-step000002.keras", ".partial-999999999-x"]
    )
    assert (partial / "model.keras").read_bytes() == b"half"


def test_loads_in_a_fresh_process_with_optimizer_state(tmp_path, trained):
    checkpoint = CheckpointStore(tmp_path).save(trained, TrainingPosition(epoch=1, step_in_epoch=0), reason="save")
    np.save(tmp_path / "w.npy", trained.get_weights()[0])
    code = f"""
import numpy as np, keras
model = keras.models.load_model({str(checkpoint.path)!r})
print(int(model.optimizer.iterations.numpy()))
assert np.allclose(model.get_weights()[0], np.load({str(tmp_path / 'w.npy')!r}))
assert any(float(np.abs(v.numpy()).sum()) > 0 for v in model.optimizer.variables[2:])
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) == int(trained.optimizer.iterations.numpy()) == 8


def test_restore_builds_the_optimizer_first(tmp_path, trained, make_model):
    checkpoint = CheckpointStore(tmp_path).save(trained, TrainingPosition(epoch=1, step_in_epoch=0), reason="save")
    fresh = make_model(seed=1)
    assert not fresh.optimizer.built
    restore_weights(fresh, checkpoint)
    assert int(fresh.optimizer.iterations.numpy()) == 8
    for a, b in zip(fresh.optimizer.variables, trained.optimizer.variables):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b))


def test_restore_into_the_wrong_model_is_a_clear_error(tmp_path, trained):
    import keras

    checkpoint = CheckpointStore(tmp_path).save(trained, TrainingPosition(epoch=0, step_in_epoch=1), reason="save")
    other = keras.Sequential([keras.Input((7,)), keras.layers.Dense(2)])
    other.compile("sgd", "mse")
    with pytest.raises(CheckpointError, match="Could not load"):
        restore_weights(other, checkpoint)


def test_a_failing_save_keeps_the_previous_checkpoint_and_leaves_nothing(ckdir, trained):
    store = CheckpointStore(ckdir)
    first = store.save(trained, TrainingPosition(epoch=0, step_in_epoch=1), reason="save")

    class Unsavable:
        def save(self, path):
            raise OSError(28, "No space left on device")

    with pytest.raises(CheckpointError, match="No space left on device; the previous checkpoint ckpt-000001"):
        store.save(Unsavable(), TrainingPosition(epoch=0, step_in_epoch=2), reason="save")
    assert store.list() == [first]
    assert sorted(os.listdir(ckdir)) == sorted([first.path.name, first.sidecar.name, LOCK_FILE])


def test_a_full_disk_fails_the_save_with_a_clear_message(ckdir):
    """A real file-size limit (RLIMIT_FSIZE) in a child process."""
    code = f"""
import resource, signal, sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from helpers import build_model
from jupyter_traincontrol.checkpoint import CheckpointStore, CheckpointError, TrainingPosition
import keras
model = build_model()
store = CheckpointStore({str(ckdir)!r})
store.save(model, TrainingPosition(epoch=0, step_in_epoch=1), reason="save")
big = keras.Sequential([keras.Input((3,)), keras.layers.Dense(200000)])
big.compile("adam", "mse")
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
try:
    store.save(big, TrainingPosition(epoch=0, step_in_epoch=2), reason="save")
except CheckpointError as error:
    print("ERROR:", error)
print("LATEST:", store.latest().path.name)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "ERROR: Could not write a checkpoint" in result.stdout
    assert "LATEST: ckpt-000001" in result.stdout
    assert [n for n in os.listdir(ckdir) if not n.startswith("ckpt-000001")] == [LOCK_FILE]




@pytest.mark.parametrize("size", [600])
@pytest.mark.backends("tensorflow", reason="the kill window (0.05-0.8 s) is tuned to TensorFlow's save time; "
                     "the checkpoint format under test is the same on every backend")
def test_sigkill_at_random_points_never_leaves_a_broken_latest(tmp_path, size):
    """Kills a process saving real Keras models at random moments; the latest
    checkpoint always loads. (tests/test_faults.py aims 100 kills at every
    phase of a save, in three sizes, without TensorFlow.)"""
    rng = random.Random(size)
    kills = 6
    for attempt in range(kills):
        child = subprocess.Popen(
            [sys.executable, str(PROGRAMS / "save_forever.py"), str(tmp_path), str(size)],
            stdout=subprocess.PIPE, env=child_env(), text=True,
        )
        assert child.stdout.readline().strip() == "READY"
        time.sleep(rng.uniform(0.05, 0.8))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    # One process checks all that was left: the newest complete one loads.
    code = f"""
import keras
from jupyter_traincontrol.checkpoint import CheckpointStore
store = CheckpointStore({str(tmp_path)!r})
latest = store.latest()
keras.models.load_model(latest.path)
print(latest.sequence, len(store.list()))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[0]) >= 1


def test_a_resume_says_how_many_items_it_skips_in_words():
    from jupyter_traincontrol.checkpoint import skipping_words

    assert skipping_words(0, "batch") == ""
    assert skipping_words(1, "batch") == ", skipping its first batch (already trained)"  # was "first 1 batches"
    assert skipping_words(4, "batch") == ", skipping its first 4 batches (already trained)"
    assert skipping_words(2, "item") == ", skipping its first 2 items (already trained)"
