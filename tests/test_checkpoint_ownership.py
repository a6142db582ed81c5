"""The store touches only what it wrote: user files, other runs, older formats."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from helpers import TESTS_DIR, child_env
from jupyter_traincontrol.state import KerasState
from jupyter_traincontrol.checkpoint import LOCK_FILE, CheckpointStore, TrainingPosition
from programs.foreign_files import OTHER_RUN, fingerprint, plant

PROGRAMS = TESTS_DIR / "programs"


@pytest.fixture
def model(make_model, tiny_data):
    model = make_model()
    model.fit(*tiny_data, batch_size=8, epochs=1, verbose=0)
    return model


@pytest.fixture
def folder_with_user_files(tmp_path, model):
    """A checkpoint folder already holding one file of every foreign kind."""
    ckdir = tmp_path / "ck"
    model.save(tmp_path / "source.keras")
    names = plant(ckdir, (tmp_path / "source.keras").read_bytes())
    return ckdir, names, fingerprint(ckdir, names)


def _step(n: int) -> TrainingPosition:
    return TrainingPosition(epoch=n // 8, step_in_epoch=n % 8, steps_per_epoch=8, global_step=n)


def test_user_files_survive_saves_prunes_cleanup_and_resume(folder_with_user_files, model, make_model):
    ckdir, names, before = folder_with_user_files
    store = CheckpointStore(ckdir, keep=1, run="mine")
    saved = [store.save(model, _step(n), reason="stop" if n == 4 else "save") for n in range(1, 6)]
    assert store.list() == [saved[-1]]  # pruned: four of ours went
    # A crash leaves this run's newest model file short: the next save removes its remains.
    os.truncate(saved[-1].path, 10)
    newer = store.save(model, _step(6), reason="save")
    assert not saved[-1].sidecar.exists() and not saved[-1].path.exists()
    restored = CheckpointStore(ckdir, run="mine").restore_latest(KerasState(make_model(seed=3)).restore)
    assert restored.checkpoint == newer and restored.skipped == []
    assert fingerprint(ckdir, names) == before
    assert sorted(os.listdir(ckdir)) == sorted([*names, newer.path.name, newer.sidecar.name, LOCK_FILE])


def test_files_named_like_ours_are_not_listed(folder_with_user_files):
    ckdir, _names, _before = folder_with_user_files
    assert CheckpointStore(ckdir).list() == []
    assert CheckpointStore(ckdir, run="mine").list() == []
    (other,) = CheckpointStore(ckdir, run=OTHER_RUN).list()  # the other run's checkpoint is its own
    assert other.sequence == 900


def test_keep_counts_per_run_name_and_sequences_keep_increasing(tmp_path, model):
    ckdir = tmp_path / "ck"
    a = CheckpointStore(ckdir, keep=2, run="a")
    first_a = [a.save(model, _step(n), reason="save") for n in range(3)]
    b = CheckpointStore(ckdir, keep=2, run="b")
    first_b = [b.save(model, _step(n), reason="save") for n in range(3)]
    assert [c.sequence for c in CheckpointStore(ckdir, run="a").list()] == [2, 3]  # a's store pruned a's older
    assert [c.sequence for c in b.list()] == [5, 6]
    fresh_a = CheckpointStore(ckdir, keep=2, run="a")  # a new instance of run "a": continues its sequence
    third = fresh_a.save(model, _step(9), reason="save")
    assert third.sequence == 7 and third.info["run_id"] == fresh_a.run_id != first_a[-1].info["run_id"]
    assert [c.sequence for c in fresh_a.list()] == [2, 3, 7]  # a fresh run leaves the earlier instance's
    resumed_a = CheckpointStore(ckdir, keep=2, run="a")
    assert resumed_a.restore_latest(lambda checkpoint: None).checkpoint == third  # continues fresh_a's line
    resumed_a.save(model, _step(10), reason="save")
    resumed_a.save(model, _step(11), reason="save")
    assert [c.sequence for c in resumed_a.list()] == [2, 3, 8, 9]  # keep=2 of its line: fresh_a's went
    assert b.list() == first_b[1:]  # b's stay, though "a" saved and pruned after it
    assert sorted({c.run for c in [*resumed_a.list(), *b.list()]}) == ["a", "b"]


def test_a_sidecar_of_format_1_is_listed_resumed_and_pruned(tmp_path, model, make_model):
    """Written by the previous release: no tool marker nor run_id, epochs from 0 in the name."""
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    stem = "ckpt-000004-epoch0002-step000003"
    model.save(ckdir / f"{stem}.keras")
    old = {"format": 1, "sequence": 4, "file": f"{stem}.keras", "size": (ckdir / f"{stem}.keras").stat().st_size,
           "epoch": 2, "step_in_epoch": 3, "steps_per_epoch": 8, "epoch_complete": False, "global_step": 19,
           "resume_epoch": 2, "resume_step": 3, "metrics": {"loss": 0.5}, "reason": "stop", "run": "legacy",
           "time": "2025-01-01T00:00:00+00:00"}
    (ckdir / f"{stem}.json").write_text(json.dumps(old))
    (ckdir / "ckpt-000005-epoch0002-step000004.json").write_text(json.dumps({**old, "run": "another"}))
    store = CheckpointStore(ckdir, keep=1, run="legacy")
    (listed,) = store.list()
    assert listed.position == TrainingPosition(2, 3, 8, 19, False)
    fresh = make_model(seed=4)
    assert store.restore_latest(KerasState(fresh).restore).checkpoint == listed
    assert int(fresh.optimizer.iterations.numpy()) == 8
    new = store.save(model, _step(20), reason="save")
    assert new.sequence == 6  # after every number in the folder
    assert store.list() == [new] and not (ckdir / f"{stem}.keras").exists()
    assert (ckdir / "ckpt-000005-epoch0002-step000004.json").exists()  # another run's (broken) sidecar stays


def test_a_sidecar_with_run_null_of_format_1_belongs_to_the_unnamed_run(tmp_path, model):
    ckdir = tmp_path / "ck"
    first = CheckpointStore(ckdir).save(model, _step(1), reason="save")
    info = json.loads(first.sidecar.read_text())
    for key in ("tool", "run_id"):
        del info[key]
    first.sidecar.write_text(json.dumps({**info, "format": 1, "run": None}))
    assert [c.sequence for c in CheckpointStore(ckdir).list()] == [1]
    assert CheckpointStore(ckdir, run="named").list() == []


@pytest.mark.parametrize("phase", ["staged-model", "model-renamed", "uncommitted"])
def test_a_killed_save_is_cleaned_up_by_its_intent_record_only(tmp_path, model, phase):
    """A save SIGKILLed after `phase` leaves remains that only its intent record
    (in the lock file) identifies; the next store removes exactly those, and
    user files named like them stay."""
    ckdir = tmp_path / "ck"
    model.save(tmp_path / "source.keras")
    earlier = CheckpointStore(ckdir, keep=1).save(model, _step(1), reason="save")
    names = plant(ckdir, (tmp_path / "source.keras").read_bytes())
    before = fingerprint(ckdir, names)
    result = subprocess.run([sys.executable, str(PROGRAMS / "die_mid_save.py"), str(ckdir), str(tmp_path / "source.keras"), phase],
                            env=child_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == -signal.SIGKILL, result.stderr
    left = set(os.listdir(ckdir)) - {*names, LOCK_FILE, earlier.path.name, earlier.sidecar.name}
    assert left, f"a kill after {phase} left nothing to clean up"
    with CheckpointStore(ckdir, keep=1):  # taking the folder recovers
        pass
    listed = CheckpointStore(ckdir).list()
    assert (earlier in listed) == (phase != "uncommitted")  # a kill before the commit keeps the earlier one
    complete = {name for c in listed for name in (c.path.name, c.sidecar.name)}
    assert set(os.listdir(ckdir)) == {*names, LOCK_FILE, *complete}  # every remain of the killed save is gone
    assert fingerprint(ckdir, names) == before
    assert all(c.path.exists() for c in CheckpointStore(ckdir).list())
