"""The checkpoint folder: one live run at a time, checked before the first step,
private where the tool chooses it, and watched while the run holds it."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import driving
from helpers import At, EventLog, TESTS_DIR, child_env, wait_until
from jupyter_traincontrol import ControlCallback
from jupyter_traincontrol.system.private_fs import make_private_dirs
from jupyter_traincontrol.transport.channels import deliver
from jupyter_traincontrol.checkpoint import (
    LOCK_FILE,
    CheckpointDirBusyError,
    CheckpointDirChangedError,
    CheckpointDirError,
    CheckpointStore,
    TrainingPosition,
)



class StepCounter:
    """A Keras callback that counts trained batches."""

    def __new__(cls):
        import keras

        class _Counter(keras.callbacks.Callback):
            batches = 0

            def on_train_batch_end(self, batch, logs=None):
                self.batches += 1

        return _Counter()


fit = functools.partial(driving.fit, epochs=2)

@pytest.fixture
def holder(tmp_path):
    """Starts `hold_folder.py FOLDER NAME` in a process; kills it at teardown."""
    started = []

    def start(folder, name):
        process = subprocess.Popen([sys.executable, str(TESTS_DIR / "programs" / "hold_folder.py"), str(folder), name],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env(), text=True)
        started.append(process)
        assert process.stdout.readline().split()[0] == "READY"
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate()


# One live run per folder --------------------------------------------------------


def test_a_second_store_in_this_process_is_refused_until_the_first_lets_go(tmp_path):
    first = CheckpointStore(tmp_path / "ck", run="first").acquire()
    second = CheckpointStore(tmp_path / "ck", run="second")
    with pytest.raises(CheckpointDirBusyError, match=rf"is in use by run 'first' \(pid {os.getpid()}\)"):
        second.acquire()
    assert not second.held
    first.release()
    first.release()  # idempotent
    with second:
        assert second.held
    assert not second.held


def test_a_save_of_a_second_store_fails_while_the_first_holds(tmp_path, make_model):
    with CheckpointStore(tmp_path / "ck", run="first"):
        with pytest.raises(CheckpointDirBusyError, match="in use by run 'first'"):
            CheckpointStore(tmp_path / "ck", run="second").save(make_model(), TrainingPosition(0, 1), reason="save")
        assert os.listdir(tmp_path / "ck") == [LOCK_FILE]  # the refused save left nothing
    assert not (tmp_path / "ck").exists()  # the first made it and left it empty: gone with its hold


def test_a_folder_held_by_another_process_is_free_once_it_is_killed(tmp_path, holder):
    process = holder(tmp_path / "ck", "elsewhere")
    with pytest.raises(CheckpointDirBusyError, match=rf"in use by run 'elsewhere' \(pid {process.pid}\)"):
        CheckpointStore(tmp_path / "ck", run="mine").acquire()
    process.send_signal(signal.SIGKILL)
    process.wait()
    with CheckpointStore(tmp_path / "ck", run="mine") as store:
        assert store.held


def test_a_second_fit_on_a_held_folder_fails_before_its_first_step(make_model, tiny_data, tmp_path, holder):
    holder(tmp_path / "ck", "elsewhere")
    counter = StepCounter()
    callback = ControlCallback(name="second", checkpoint_dir=tmp_path / "ck", verbose=False)
    with pytest.raises(CheckpointDirBusyError, match=f"{tmp_path / 'ck'} is in use by run 'elsewhere'"):
        fit(make_model(), tiny_data, callback, counter)
    assert counter.batches == 0
    assert callback.state == "failed"


def test_a_run_holds_its_folder_during_fit_and_lets_go_at_the_end(make_model, tiny_data, tmp_path):
    callback = ControlCallback(name="first", checkpoint_dir=tmp_path / "ck", verbose=False)
    errors = []

    def second_fit(_):
        try:
            fit(make_model(seed=2), tiny_data, ControlCallback(name="second", checkpoint_dir=tmp_path / "ck", verbose=False))
        except CheckpointDirBusyError as error:
            errors.append(str(error))

    fit(make_model(), tiny_data, callback, At(0, 2, second_fit), epochs=1)
    assert len(errors) == 1 and "in use by run 'first'" in errors[0]
    assert callback.state == "finished"
    with CheckpointStore(tmp_path / "ck", run="third"):  # free again
        pass


# Ended runs leave no empty folders -----------------------------------------------


def test_a_run_that_ends_without_a_checkpoint_removes_the_folder_it_made(make_model, tiny_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    aborted = ControlCallback(name="aborted", verbose=False)
    fit(make_model(), tiny_data, aborted, At(0, 1, lambda cb: aborted.send("abort")))
    failing = ControlCallback(name="failing", verbose=False)

    def fail(_):
        raise RuntimeError("a callback failed")

    with pytest.raises(RuntimeError, match="a callback failed"):
        fit(make_model(), tiny_data, failing, At(0, 1, fail))  # Keras then skips on_train_end: the watchdog ends it
    stopped = ControlCallback(name="stopped", verbose=False)
    fit(make_model(), tiny_data, stopped, At(0, 1, lambda cb: stopped.send("stop")))
    assert (aborted.state, failing.state, stopped.state) == ("aborted", "failed", "stopped")
    assert os.listdir(tmp_path / "checkpoints") == ["stopped"]  # the one with a checkpoint stays
    given = tmp_path / "given"
    given.mkdir()
    fit(make_model(), tiny_data, ControlCallback(name="given", checkpoint_dir=given, save_at_end=False, verbose=False))
    assert os.listdir(given) == [LOCK_FILE]  # a folder the user made stays, empty or not


def test_the_parents_a_run_made_for_its_folder_go_with_it_while_empty(make_model, tiny_data, tmp_path, monkeypatch):
    """A first `fit` that leaves no checkpoint leaves no `checkpoints/`
    either; a parent another run's folder is in, or one the run did not
    make, stays."""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    fit(make_model(), tiny_data, ControlCallback(name="first", save_at_end=False, verbose=False))
    fit(make_model(), tiny_data, ControlCallback(name="deep", checkpoint_dir="a/b/c", save_at_end=False, verbose=False))
    assert os.listdir(tmp_path / "work") == []
    one = CheckpointStore(tmp_path / "p" / "one", run="one").acquire()  # makes p
    two = CheckpointStore(tmp_path / "p" / "two", run="two").acquire()
    one.release()
    assert os.listdir(tmp_path / "p") == ["two"]  # p is not empty: it stays
    two.release()
    assert os.listdir(tmp_path / "p") == []  # the second did not make p


def test_folders_are_made_even_as_another_run_removes_the_empty_parent(tmp_path, monkeypatch):
    """Between making ``x`` and ``x/y``, another run lets its empty ``x`` go:
    `make_private_dirs` makes both again instead of failing."""
    real_mkdir, removed = os.mkdir, []

    def mkdir_as_x_is_removed(path, mode=0o777):
        real_mkdir(path, mode)
        if Path(path).name == "x" and not removed:
            removed.append(path)
            os.rmdir(path)

    monkeypatch.setattr(os, "mkdir", mkdir_as_x_is_removed)
    assert make_private_dirs(tmp_path / "x" / "y") == [tmp_path / "x", tmp_path / "x" / "y"]
    assert removed and (tmp_path / "x" / "y").is_dir()


def test_a_folder_given_something_else_while_held_stays(tmp_path):
    with CheckpointStore(tmp_path / "ck", run="mine"):
        (tmp_path / "ck" / "notes.txt").write_text("mine")
    assert sorted(os.listdir(tmp_path / "ck")) == [LOCK_FILE, "notes.txt"]


@pytest.mark.parametrize("new_lock_first", [False, True])
def test_a_taker_that_opened_the_lock_file_as_it_was_removed_takes_the_folder_anew(tmp_path, make_model, monkeypatch,
                                                                                   new_lock_first):
    """The second store opened the first's lock file; the first then lets go
    of its empty folder (removing it) before the second locks: the second
    must not hold a lock file that is no longer the folder's."""
    first = CheckpointStore(tmp_path / "ck", run="first").acquire()
    real_flock, calls = fcntl.flock, []

    def flock_after_the_first_lets_go(fd, operation):
        calls.append(operation)
        if len(calls) == 1:
            first.release()
            if new_lock_first:  # a third taker made the folder and its lock file again meanwhile
                (tmp_path / "ck").mkdir(mode=0o700)
                (tmp_path / "ck" / LOCK_FILE).touch(mode=0o600)
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_the_first_lets_go)
    second = CheckpointStore(tmp_path / "ck", run="second").acquire()
    monkeypatch.setattr(fcntl, "flock", real_flock)
    assert len(calls) == 2  # locked once in vain, then anew
    lock = os.stat(tmp_path / "ck" / LOCK_FILE)
    assert (lock.st_dev, lock.st_ino) == (os.fstat(second.folder._lock_fd).st_dev, os.fstat(second.folder._lock_fd).st_ino)
    with pytest.raises(CheckpointDirBusyError, match="in use by run 'second'"):
        CheckpointStore(tmp_path / "ck", run="third").acquire()
    checkpoint = second.save(make_model(), TrainingPosition(0, 1), reason="save")
    assert checkpoint.path.parent == tmp_path / "ck" and checkpoint.path.exists()
    second.release()
    assert sorted(os.listdir(tmp_path / "ck")) == sorted([LOCK_FILE, checkpoint.path.name, checkpoint.sidecar.name])


# Checked when fit starts -----------------------------------------------------------


def _fails_before_the_first_step(make_model, tiny_data, checkpoint_dir, match):
    counter = StepCounter()
    callback = ControlCallback(name="bad", checkpoint_dir=checkpoint_dir, verbose=False)
    with pytest.raises(CheckpointDirError, match=match) as raised:
        fit(make_model(), tiny_data, callback, counter)
    assert str(checkpoint_dir) in str(raised.value)
    assert counter.batches == 0 and callback.state == "failed"


def test_a_checkpoint_dir_that_is_a_file_fails_at_fit_start(make_model, tiny_data, tmp_path):
    (tmp_path / "ck").write_text("not a folder")
    _fails_before_the_first_step(make_model, tiny_data, tmp_path / "ck", "is a regular file; expected a folder")
    assert (tmp_path / "ck").read_text() == "not a folder"


def test_a_checkpoint_dir_that_is_a_dangling_symlink_fails_at_fit_start(make_model, tiny_data, tmp_path):
    (tmp_path / "ck").symlink_to(tmp_path / "gone")
    _fails_before_the_first_step(make_model, tiny_data, tmp_path / "ck", "is a symlink to .*gone.*, which does not exist")
    assert not (tmp_path / "gone").exists()


def test_a_checkpoint_dir_below_a_file_fails_at_fit_start(make_model, tiny_data, tmp_path):
    (tmp_path / "file").write_text("")
    _fails_before_the_first_step(make_model, tiny_data, tmp_path / "file" / "ck", "Could not use checkpoint folder")


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder this user cannot write: by its mode, or (as root, whom modes do
    not stop) by a read-only bind mount; skipped where neither works."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o500)
        yield folder
        folder.chmod(0o700)
        return
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"running as root, and cannot bind-mount a read-only folder here: {mounted.stderr.strip()}")
    try:
        remount = subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True, text=True)
        if remount.returncode != 0:
            pytest.skip(f"running as root, and cannot remount read-only here: {remount.stderr.strip()}")
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def test_an_unwritable_checkpoint_dir_fails_at_fit_start(make_model, tiny_data, read_only_folder):
    _fails_before_the_first_step(make_model, tiny_data, read_only_folder, "not writable")


# The folder the tool chooses is private ---------------------------------------------


def test_the_default_folder_is_created_private(make_model, tiny_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    old_umask = os.umask(0)
    try:
        callback = ControlCallback(name="defaulted", verbose=False)
        fit(make_model(), tiny_data, callback, At(0, 1, lambda cb: callback.send("stop")))
    finally:
        os.umask(old_umask)
    assert callback.state == "stopped" and len(callback.checkpoints) == 1
    for folder in (tmp_path / "checkpoints", tmp_path / "checkpoints" / "defaulted"):
        assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700


def test_a_user_given_folder_keeps_its_mode_and_missing_parents_are_private(tmp_path):
    given = tmp_path / "shared"
    given.mkdir(mode=0o755)
    given.chmod(0o755)
    with CheckpointStore(given):
        pass
    assert stat.S_IMODE(given.stat().st_mode) == 0o755
    assert os.listdir(given) == [LOCK_FILE]  # a folder it did not make stays, empty or not
    old_umask = os.umask(0)
    try:
        with CheckpointStore(tmp_path / "new" / "deeper" / "ck"):
            for folder in (tmp_path / "new", tmp_path / "new" / "deeper", tmp_path / "new" / "deeper" / "ck"):
                assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    finally:
        os.umask(old_umask)
    assert not (tmp_path / "new").exists()  # the folders it made, left empty, went: its own and its parents


@pytest.mark.parametrize("where", ["checkpoints", "checkpoints/planted"])
def test_a_symlink_planted_at_the_default_location_is_refused(make_model, tiny_data, tmp_path, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "attacker"
    target.mkdir()
    (tmp_path / where).parent.mkdir(mode=0o700, exist_ok=True)
    (tmp_path / where).symlink_to(target)
    counter = StepCounter()
    with pytest.raises(CheckpointDirError, match=r"is unsafe: Refusing .*: it is a symlink"):
        fit(make_model(), tiny_data, ControlCallback(name="planted", verbose=False), counter)
    assert counter.batches == 0 and os.listdir(target) == []


@pytest.mark.parametrize("where", ["checkpoints", "checkpoints/foreign"])
def test_a_folder_of_another_user_at_the_default_location_is_refused(make_model, tiny_data, tmp_path, monkeypatch, where):
    if os.geteuid() != 0:
        pytest.skip("needs root to plant a folder owned by another user (uid 65534)")
    monkeypatch.chdir(tmp_path)
    (tmp_path / where).mkdir(mode=0o777, parents=True)
    os.chown(tmp_path / where, 65534, 65534)
    counter = StepCounter()
    with pytest.raises(CheckpointDirError, match=r"owned by uid 65534"):
        fit(make_model(), tiny_data, ControlCallback(name="foreign", verbose=False), counter)
    assert counter.batches == 0 and os.listdir(tmp_path / where) == []


# The folder replaced under a live run --------------------------------------------------


def test_a_folder_swapped_under_a_live_run_fails_the_next_save_and_training_goes_on(make_model, tiny_data, tmp_path):
    ckdir = tmp_path / "ck"
    log = EventLog()
    callback = ControlCallback(name="swapped", checkpoint_dir=ckdir, verbose=False)
    callback.lifecycle.add_listener(log)
    trained_after = []

    def script():
        deliver(callback.fifo, "save")
        log.wait_count("checkpoint", None, 1)
        os.rename(ckdir, tmp_path / "moved")
        ckdir.mkdir()
        deliver(callback.fifo, "save")
        log.wait_count("error", None, 1)
        started = callback.lifecycle.progress.step + 8 * callback.lifecycle.progress.epoch
        wait_until(lambda: callback.lifecycle.progress.step + 8 * callback.lifecycle.progress.epoch > started + 5, message="training to go on")
        trained_after.append(callback.state)
        deliver(callback.fifo, "stop")

    driving.drive_fit(make_model(), tiny_data, callback, lambda _callback: script())
    assert trained_after == ["running"] and callback.state == "stopped"
    errors = log.messages("error")
    assert len(errors) == 2  # the save and the stop's checkpoint
    assert all(f"Checkpoint folder {ckdir} was replaced while run 'swapped' held it" in e for e in errors)
    assert os.listdir(ckdir) == []  # nothing written into the impostor
    assert len([n for n in os.listdir(tmp_path / "moved") if n.endswith(".keras")]) == 1


def test_a_folder_removed_under_a_held_store_fails_the_save_clearly(tmp_path, make_model):
    import shutil

    store = CheckpointStore(tmp_path / "ck").acquire()
    try:
        shutil.rmtree(tmp_path / "ck")
        with pytest.raises(CheckpointDirChangedError, match="it now leads to nothing"):
            store.save(make_model(), TrainingPosition(0, 1), reason="save")
    finally:
        store.release()


# A lock file nobody else may plant --------------------------------------------------------


def _plant_lock(folder, pending, mode=0o666, uid=None):
    """A lock record as the tool writes it, naming `pending` as a killed save's intent."""
    folder.mkdir(exist_ok=True)
    lock = folder / LOCK_FILE
    record = json.dumps({"tool": "jupyter-traincontrol", "holder": None, "pending": pending}).encode()
    lock.write_bytes(record.ljust(4095) + b"\n")
    os.chmod(lock, mode)
    if uid is not None:
        os.chown(lock, uid, -1)
    return lock


def _precious(folder):
    best = folder / "best.keras"
    best.write_bytes(b"the user's own model")
    st = best.stat()
    return best, {"file": best.name, "inode": st.st_ino, "size": st.st_size}


@pytest.mark.skipif(os.getuid() != 0, reason="planting a file of another user needs root")
def test_a_lock_file_of_another_user_is_refused_and_nothing_is_removed(tmp_path):
    """In a shared sticky folder another user plants a lock file whose intent
    names the victim's best.keras by inode and size: the victim's run refuses
    the folder, naming the file's owner, and best.keras stays."""
    folder = tmp_path / "shared"
    folder.mkdir()
    best, intent = _precious(folder)
    _plant_lock(folder, intent, uid=12345)
    with pytest.raises(CheckpointDirError, match=r"belongs to uid 12345, not to this user"):
        CheckpointStore(folder).acquire()
    assert best.read_bytes() == b"the user's own model"


def test_a_lock_file_others_can_write_has_its_intent_ignored_and_is_made_private(tmp_path, caplog):
    folder = tmp_path / "shared"
    folder.mkdir()
    best, intent = _precious(folder)
    lock = _plant_lock(folder, {**intent, "staging": ".partial-" + "0" * 32 + "-1"})
    (folder / (".partial-" + "0" * 32 + "-1")).mkdir()
    store = CheckpointStore(folder)
    with caplog.at_level("WARNING", logger="jupyter_traincontrol"):
        store.acquire()
    store.release()
    assert best.read_bytes() == b"the user's own model"
    assert (folder / (".partial-" + "0" * 32 + "-1")).is_dir()  # what the record names is not acted on
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    assert any("writable by others" in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)


def test_an_intent_acts_only_on_the_names_a_save_makes(tmp_path):
    """A private lock file whose intent names a file the tool never makes
    (best.keras, a folder that is no staging folder): neither is touched."""
    folder = tmp_path / "own"
    folder.mkdir()
    best, intent = _precious(folder)
    (folder / "data").mkdir()
    _plant_lock(folder, {**intent, "staging": "data"}, mode=0o600)
    CheckpointStore(folder).acquire().release()
    assert best.read_bytes() == b"the user's own model" and (folder / "data").is_dir()
