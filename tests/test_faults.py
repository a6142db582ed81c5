"""Faults and bad input against real training runs: nothing is lost, nothing leaks.

- The FIFO of a live `fit`: 50 concurrent writer processes, garbage of every
  kind, split and cut-off lines, the FIFO deleted or replaced: every whole
  valid command is applied exactly once and the run stays controllable.
- Checkpoints: savers SIGKILLed at 100 chosen and random points; a full disk
  (a real tmpfs, and RLIMIT_FSIZE) during a real `fit`.
- Security: private modes, planted symlinks and foreign owners, and no write
  outside the run's checkpoint folder and registry, whatever is commanded.
- Lifecycle: 20 runs in one process leave no thread, descriptor, FIFO,
  signal handler or active record behind.

The channel-level and store-level versions of some of these live in
test_channel.py and test_checkpoint.py; here they run against real `fit`s.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import json
import os
import random
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from driving import BATCH, drive_fit
from helpers import assert_finite_weights
from helpers import PROGRAMS, REPO, At, EventLog, child_env, run_program, wait_drained, wait_until
from jupyter_traincontrol import ControlCallback
from jupyter_traincontrol.transport.channels import NotListeningError, deliver
from jupyter_traincontrol.checkpoint import LOCK_FILE, CheckpointStore, TrainingPosition
from jupyter_traincontrol.protocol import LineDecoder
from jupyter_traincontrol.system.private_fs import UnsafePathError
from jupyter_traincontrol.protocol import ACTIVE_STATES
from jupyter_traincontrol.registry import RunFolder, list_runs



# Driving a live fit ------------------------------------------------------------


def controlled(name, tmp_path, log: EventLog | None = None, **kwargs) -> ControlCallback:
    callback = ControlCallback(name=name, checkpoint_dir=tmp_path / "ck", verbose=False, **kwargs)
    if log is not None:
        callback.lifecycle.add_listener(log)
    return callback


# The FIFO of a live fit ------------------------------------------------------



def test_fifty_writer_processes_each_command_applied_exactly_once(make_model, tiny_data, tmp_path):
    """50 processes send 100 commands each into a live fit.

    Every command leaves exactly one trace in the run's events: ``pause``
    either "pause received" or, when already paused, "Already paused";
    ``resume`` "resume received" (paused or not); ``save`` "save received"
    (saves asked for at one boundary, or while one is being written, share
    one checkpoint). So per word, traces == sent means
    none lost and none applied twice (a loss and a duplicate of the same
    word would cancel out, but would take two independent bugs).
    """
    writers, per_writer = 50, 100
    rng = random.Random(50)
    scripts = [[rng.choice(["pause", "resume"]) for _ in range(per_writer)] for _ in range(writers)]
    for index in range(3):
        scripts[index][per_writer // 2] = "save"
    sent = collections.Counter(word for script in scripts for word in script)
    log = EventLog()

    def traces():
        return {
            "pause": log.count("command", "pause received") + log.count("info", "Already paused"),
            "resume": log.count("command", "resume received"),
            "save": log.count("command", "save received"),
        }

    def script(control):
        children = [
            subprocess.Popen([sys.executable, str(PROGRAMS / "write_commands.py"), control.fifo, ",".join(words)],
                             stdin=subprocess.PIPE, env=child_env())
            for words in scripts
        ]
        for child in children:
            child.stdin.write(b"go\n")
            child.stdin.flush()
        for child in children:
            child.stdin.close()
            assert child.wait(60) == 0, "a writer failed to deliver"
        wait_until(lambda: sum(traces().values()) >= writers * per_writer, timeout=60, message="all commands applied")
        deliver(control.fifo, "resume")  # in case the last word left it paused
        log.wait_count("command", "resume received", sent["resume"] + 1)
        deliver(control.fifo, "stop")

    control = controlled("crowd", tmp_path, log)
    drive_fit(make_model(), tiny_data, control, script)
    assert control.state == "stopped"
    assert traces() == {"pause": sent["pause"], "resume": sent["resume"] + 1, "save": sent["save"]}
    assert log.count("command", "stop received") == 1
    # Saves asked for while one is written, or at one boundary, are merged
    # into one checkpoint (each was received exactly once: `traces` above).
    assert 1 <= log.count("checkpoint", "save") <= sent["save"]
    assert log.count("checkpoint", "stop") == 1
    assert log.count("rejected") == 0 and log.count("warning") == 0 and log.count("error") == 0


def _random_garbage(seed: int, size: int) -> bytes:
    """Random bytes, checked to hold no line that is a command."""
    data = random.Random(seed).randbytes(size) + b"\n"
    decoded = LineDecoder().feed(data)
    assert not [d for d in decoded if not hasattr(d, "reason")], "the random bytes happen to hold a command"
    return data


def test_garbage_in_a_live_fit_is_rejected_and_every_valid_command_acts_once(make_model, tiny_data, tmp_path):
    log = EventLog()
    garbage = _random_garbage(seed=7, size=64 * 1024)
    garbage_lines = len(LineDecoder().feed(garbage))
    one_mib_line = b"s" * (1 << 20) + b"\n"

    def write_raw(fifo, *chunks, pause=0.0):
        fd = os.open(fifo, os.O_WRONLY)  # blocking: a 1 MiB line needs the reader to drain
        try:
            for chunk in chunks:
                os.write(fd, chunk)
                if pause:
                    wait_drained(fifo)
        finally:
            os.close(fd)

    def script(control):
        fifo = control.fifo
        write_raw(fifo, garbage)
        deliver(fifo, "save")
        log.wait_count("checkpoint", None, 1)
        write_raw(fifo, b"\xff\xfe stop \xc3\x28\n")  # invalid UTF-8 around a command word: not a command
        write_raw(fifo, one_mib_line)
        deliver(fifo, "resume")
        log.wait_count("command", "resume received", 1)
        write_raw(fifo, b"pa", b"use\n", pause=True)  # one command split over two writes
        log.wait_count("state", "paused", 1)
        deliver(fifo, "resume")
        log.wait_count("state", "running", 2)
        # A writer killed in the middle of a line, then a healthy one.
        child = subprocess.Popen([sys.executable, "-c", "import os, sys, time; fd = os.open(sys.argv[1], os.O_WRONLY); "
                                  "os.write(fd, b'sto'); print('written', flush=True); time.sleep(60)", fifo],
                                 stdout=subprocess.PIPE, env=child_env())
        assert child.stdout.readline().strip() == b"written"
        child.kill()
        child.wait()
        child.stdout.close()
        wait_drained(fifo)
        deliver(fifo, "save")
        log.wait_count("checkpoint", None, 2)
        deliver(fifo, "stop")

    control = controlled("garbage", tmp_path, log)
    drive_fit(make_model(), tiny_data, control, script)
    assert control.state == "stopped"
    assert log.count("command", "save received") == 2
    assert log.count("command", "pause received") == 1
    assert log.count("command", "resume received") == 2
    assert log.count("command", "stop received") == 1  # only the real one: not the cut-off 'sto', not the UTF-8 line
    rejected = log.messages("rejected")
    assert len(rejected) == garbage_lines + 3, rejected[-5:]
    assert any("not valid UTF-8" in r for r in rejected)
    assert any(f"Line of {len(one_mib_line) - 1} bytes is too long" in r for r in rejected)
    assert any("stopped mid-line" in r for r in rejected)
    assert len(control.checkpoints) == 3  # two saves and the stop


def test_fifo_deleted_or_replaced_under_a_live_fit_is_recreated(make_model, tiny_data, tmp_path):
    log = EventLog()
    decoy = tmp_path / "decoy-fifo"
    os.mkfifo(decoy, 0o600)
    decoy_reader = os.open(decoy, os.O_RDONLY | os.O_NONBLOCK)

    def script(control):
        fifo = control.fifo
        os.unlink(fifo)
        with pytest.raises(NotListeningError):
            deliver(fifo, "save")  # meanwhile: fails at once, never hangs
        log.wait_count("warning", None, 1)
        deliver(fifo, "save")
        log.wait_count("checkpoint", None, 1)

        os.unlink(fifo)
        Path(fifo).write_text("stop\n")  # a regular file in its place: never read
        log.wait_count("warning", None, 2)
        deliver(fifo, "save")
        log.wait_count("checkpoint", None, 2)

        os.unlink(fifo)
        os.symlink(decoy, fifo)  # a symlink to someone's FIFO: removed, never followed
        log.wait_count("warning", None, 3)
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
        deliver(fifo, "save")
        log.wait_count("checkpoint", None, 3)
        deliver(fifo, "stop")

    control = controlled("replaced", tmp_path, log)
    try:
        drive_fit(make_model(), tiny_data, control, script)
        assert os.read(decoy_reader, 100) == b""  # nothing was written to the decoy
    finally:
        os.close(decoy_reader)
    assert control.state == "stopped"
    warnings = log.messages("warning")
    assert [w.split(" was ")[1] for w in warnings] == ["deleted; re-created it.", "replaced; re-created it.", "replaced; re-created it."]
    assert log.count("command", "save received") == 3 and log.count("command", "stop received") == 1
    assert stat.S_ISFIFO(os.lstat(decoy).st_mode)


# Checkpoints under SIGKILL ---------------------------------------------------

#: The phases of `CheckpointStore.save`, as its ``on_phase`` hook names them
#: (a kill lands just after the phase), plus ``model-write``: a chunk of the
#: staged model file written. ``writer-started`` and ``writer-done`` are the
#: background writer's (most saves of the saver run on its thread).
KILL_PHASES = ["locked", "recovered", "writer-started", "previous-flushed", "intent-recorded", "staging-created",
               "model-write", "staged-model", "staged-sidecar", "model-renamed", "sidecar-committed",
               "staging-removed", "intent-cleared", "flushed", "uncommitted", "pruned", "writer-done"]
SAVER_SERVER = PROGRAMS / "saver_server.py"


@pytest.fixture(scope="module")
def keras_files(tmp_path_factory):
    """Real .keras files of three sizes (about 30 KB, 1 MB and 6 MB)."""
    import keras

    folder = tmp_path_factory.mktemp("sources")
    files = []
    for units in (4, 300, 700):
        keras.utils.set_random_seed(units)
        model = keras.Sequential([keras.Input((units,)), keras.layers.Dense(units)])
        model.compile(keras.optimizers.Adam(), "mse")
        model.fit(np.ones((2, units), "float32"), np.ones((2, units), "float32"), verbose=0)
        path = folder / f"model-{units}.keras"
        model.save(path)
        files.append(path)
    return files


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class SaverServer:
    """The TensorFlow-free saver process (tests/programs/saver_server.py), driven line by line."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, str(SAVER_SERVER), ",".join(KILL_PHASES)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env(), text=True,
        )

    def ask(self, *words) -> list[str]:
        self.process.stdin.write(" ".join(map(str, words)) + "\n")
        self.process.stdin.flush()
        reply = self.process.stdout.readline().split()
        assert reply, f"the saver server died (exit code {self.process.poll()})"
        return reply

    def close(self):
        self.process.stdin.close()
        self.process.stdout.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()  # its child, if any, dies with MAX_SAVES
            self.process.wait()


@pytest.mark.backends("tensorflow", reason="the store's protocol (no fit, no backend in the saver) needs one pass of the matrix")
def test_sigkill_at_100_points_never_leaves_a_broken_latest_checkpoint(keras_files, tmp_path):
    """100 SIGKILLs during saves, in three sizes; after each, what is left is checked.

    The folder also holds files the store did not write (a hand copy, a
    ModelCheckpoint file, another run's checkpoint, look-alikes of a killed
    save's remains, a malformed sidecar): none is ever changed or removed.

    Kill points (seed 100): 75 targeted, just after the k-th time (k drawn
    from 1-3; 1 for ``recovered``, which a save reaches once, after a kill
    left an intent) a save completes a phase taken in turn from KILL_PHASES,
    4 or 5 for each of its 17 phases; the test asserts that each landed in its
    phase. And 25 at a random moment within three saves' time; their phases
    vary from run to run (printed with -s). Sizes: 34 kills with a 16 KB
    model, 33 with 1 MB, 33 with 6 MB.
    """
    from programs.foreign_files import fingerprint, plant

    rng = random.Random(100)
    server = SaverServer()
    landed = collections.Counter()
    timed = collections.Counter()
    try:
        plan = [34, 33, 33]
        targeted = 0
        for source, kills in zip(keras_files, plan):
            directory = tmp_path / source.stem
            foreign = plant(directory, source.read_bytes())
            foreign_prints = fingerprint(directory, foreign)
            source_sha, size = _sha(source), source.stat().st_size
            save_seconds = float(server.ask("TIME", directory, source, tmp_path / f"time-{source.stem}")[0])
            last_completed = 0
            for index in range(kills):
                if index % 4 == 3:
                    killed, phase, completed = server.ask("KILL", directory, source, "timer", "-", rng.uniform(0, 3 * save_seconds))
                    timed[phase] += 1
                else:
                    target = KILL_PHASES[targeted % len(KILL_PHASES)]
                    targeted += 1
                    k = 1 if target == "recovered" else rng.randint(1, 3)
                    killed, phase, completed = server.ask("KILL", directory, source, "op", target, k)
                    assert phase == target, f"kill aimed at {target!r} landed in {phase!r}"
                    landed[phase] += 1
                assert killed == "1", "the saver was not killed (its kill point was never reached)"
                last_completed = max(last_completed, int(completed))
                _check_what_a_kill_left(directory, source_sha, size, last_completed, foreign)
                assert fingerprint(directory, foreign) == foreign_prints, "a file that is not ours was changed"
            assert int(server.ask("CLEAN", directory, source)[0]) > last_completed
            store = CheckpointStore(directory)
            kept = {name for c in store.list() for name in (c.path.name, c.sidecar.name)}
            assert len(kept) == 4
            assert sorted(os.listdir(directory)) == sorted([*kept, *foreign, LOCK_FILE]), "a save left debris behind"
            assert fingerprint(directory, foreign) == foreign_prints
            _check_loads(store.latest().path, source)
    finally:
        server.close()
    print(f"\ntargeted kills per phase: {dict(landed)}; timed kills per phase: {dict(timed)}")
    assert sum(landed.values()) + sum(timed.values()) == 100
    assert set(landed) == set(KILL_PHASES)


def _check_what_a_kill_left(directory: Path, source_sha: str, size: int, last_completed: int, foreign: list[str]) -> None:
    store = CheckpointStore(directory)
    checkpoints = store.list()
    if last_completed:
        assert checkpoints and checkpoints[-1].sequence >= last_completed, "a completed save was lost"
    for checkpoint in checkpoints:
        assert checkpoint.info["size"] == size
        assert _sha(checkpoint.path) == source_sha, f"listed {checkpoint.path.name} is broken"
    for name in set(os.listdir(directory)) - set(foreign) - {LOCK_FILE}:
        path = directory / name
        if name.startswith(".partial-"):
            assert path.is_dir()  # hidden staging of the killed save: removed by the next run, by its intent record
        elif name.endswith(".keras"):
            # What a glob for *.keras sees is always a whole model (a model
            # file whose sidecar never landed is complete, just uncommitted).
            assert _sha(path) == source_sha, f"{name} is half-written"
        else:
            assert name.endswith(".json") and json.loads(path.read_text())["size"] == size, name


def _check_loads(path: Path, source: Path) -> None:
    import keras

    loaded, original = keras.models.load_model(path), keras.models.load_model(source)
    for a, b in zip(loaded.get_weights() + loaded.optimizer.variables, original.get_weights() + original.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert_finite_weights(path)


# Checkpoints after a crash, and what is flushed when --------------------------


class FileOps:
    """Records, in order, the fsyncs and deletions the store makes (spies that
    call the real functions), and the `model.save` calls of a wrapped model."""

    def __init__(self, monkeypatch):
        import jupyter_traincontrol.checkpoint.store as checkpoint_module

        self.log: list[tuple[str, str]] = []
        for name in ("_fsync_file", "_fsync_dir"):
            real = getattr(checkpoint_module, name)
            monkeypatch.setattr(checkpoint_module, name, self._spy("fsync", real))
        monkeypatch.setattr(os, "unlink", self._spy("unlink", os.unlink))

    def _spy(self, kind, real):
        def spy(path, *args, **kwargs):
            self.log.append((kind, Path(path).name))
            return real(path, *args, **kwargs)

        return spy

    def model(self, model):
        ops = self

        class Recorded:
            def save(self, path):
                ops.log.append(("model.save", Path(path).name))
                model.save(path)

        return Recorded()

    def take(self) -> list[tuple[str, str]]:
        taken, self.log[:] = list(self.log), []
        return taken


def test_saves_flush_nothing_until_one_must_go_then_the_previous_first(tmp_path, make_model, monkeypatch):
    ops = FileOps(monkeypatch)
    store = CheckpointStore(tmp_path / "ck", keep=3)
    model = ops.model(make_model())
    first = [store.save(model, TrainingPosition(0, step), reason="save") for step in range(3)]
    assert [kind for kind, _ in ops.take()] == ["model.save"] * 3  # no fsync while nothing is removed
    fourth = store.save(model, TrainingPosition(0, 3), reason="save")
    assert ops.take() == [
        ("fsync", first[2].path.name), ("fsync", first[2].sidecar.name), ("fsync", "ck"),  # before the folder changes
        ("model.save", "model.keras"),
        ("unlink", first[0].sidecar.name), ("unlink", first[0].path.name),  # uncommit, then remove
    ]
    store.save(model, TrainingPosition(0, 4), reason="save")
    assert ops.take()[:3] == [("fsync", fourth.path.name), ("fsync", fourth.sidecar.name), ("fsync", "ck")]


def test_with_keep_1_the_new_checkpoint_is_flushed_before_the_old_goes(tmp_path, make_model, monkeypatch):
    ops = FileOps(monkeypatch)
    store = CheckpointStore(tmp_path / "ck", keep=1)
    model = ops.model(make_model())
    old = store.save(model, TrainingPosition(0, 1), reason="save")
    ops.take()
    new = store.save(model, TrainingPosition(0, 2), reason="save")
    assert ops.take() == [
        ("model.save", "model.keras"),
        ("fsync", new.path.name), ("fsync", new.sidecar.name), ("fsync", "ck"),
        ("unlink", old.sidecar.name), ("unlink", old.path.name),
    ]


@pytest.mark.parametrize("reason", ["stop", "interrupt"])
def test_a_checkpoint_that_ends_a_run_is_flushed_at_once(tmp_path, make_model, monkeypatch, reason):
    ops = FileOps(monkeypatch)
    checkpoint = CheckpointStore(tmp_path / "ck").save(ops.model(make_model()), TrainingPosition(0, 1), reason=reason)
    assert ops.take() == [("model.save", "model.keras"), ("fsync", checkpoint.path.name),
                          ("fsync", checkpoint.sidecar.name), ("fsync", "ck")]


@pytest.mark.parametrize("damage", ["empty", "short", "missing"])
def test_a_model_file_a_crash_left_short_is_not_a_checkpoint(tmp_path, make_model, damage):
    """After a power cut, a file the kernel had not written back yet comes back
    empty or short: its sidecar's size tells, and the previous one is used."""
    store = CheckpointStore(tmp_path / "ck")
    model = make_model()
    first = store.save(model, TrainingPosition(0, 1), reason="save")
    second = store.save(model, TrainingPosition(0, 2), reason="save")
    if damage == "missing":
        second.path.unlink()
    else:
        os.truncate(second.path, 0 if damage == "empty" else second.info["size"] // 2)
    assert store.latest() == first
    third = store.save(model, TrainingPosition(0, 3), reason="save")
    assert third.sequence == 3  # the broken one's number is not reused
    assert sorted(os.listdir(store.directory)) == sorted(
        [first.path.name, first.sidecar.name, third.path.name, third.sidecar.name, LOCK_FILE]
    )  # and its remains are cleaned up (its sidecar says they are ours)


def test_a_failing_flush_says_the_checkpoint_was_written_and_deletes_nothing(tmp_path, make_model, monkeypatch):
    """An I/O error while flushing (which cannot be caused for real here, so
    the fsync is made to fail) keeps every checkpoint and says what happened."""
    import errno as errno_module

    import jupyter_traincontrol.checkpoint.store as checkpoint_module
    from jupyter_traincontrol.checkpoint import CheckpointError

    store = CheckpointStore(tmp_path / "ck", keep=1)
    model = make_model()
    old = store.save(model, TrainingPosition(0, 1), reason="save")

    def failing_fsync(path):
        raise OSError(errno_module.EIO, "Input/output error")

    monkeypatch.setattr(checkpoint_module, "_fsync_file", failing_fsync)
    with pytest.raises(CheckpointError, match=r"^Wrote ckpt-000002-epoch0001-step000002.keras, but could not flush "
                                              r"or remove older checkpoints in .*: Input/output error; older checkpoints may remain.$"):
        store.save(model, TrainingPosition(0, 2), reason="save")
    assert [c.sequence for c in store.list()] == [old.sequence, 2]


# A full disk -----------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (needs root); skipped where mounting is not allowed."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip() or result.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def _fill(folder: Path) -> None:
    """Fills the file system of `folder` to the last byte."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (b"\0" * 65536, b"\0"):
            try:
                while True:
                    os.write(fd, chunk)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)


def test_a_full_disk_fails_the_save_clearly_and_training_goes_on_then_stops(make_model, tiny_data, small_disk, tmp_path):
    log = EventLog()
    control = ControlCallback(name="fulldisk", checkpoint_dir=small_disk / "ck", verbose=False)
    control.lifecycle.add_listener(log)
    steps_after_failure = []

    def script(callback):
        deliver(callback.fifo, "save")
        log.wait_count("checkpoint", None, 1)
        _fill(small_disk)
        deliver(callback.fifo, "save")
        log.wait_count("error", None, 1)
        started = callback.lifecycle.progress.step + 8 * callback.lifecycle.progress.epoch
        wait_until(lambda: callback.lifecycle.progress.step + 8 * callback.lifecycle.progress.epoch > started + 10, message="training to go on")
        steps_after_failure.append(True)
        assert callback.state == "running"
        deliver(callback.fifo, "stop")

    history = drive_fit(make_model(), tiny_data, control, script)
    assert steps_after_failure and len(history.epoch) >= 1
    assert control.state == "stopped"  # as the command asked, though its checkpoint failed too
    errors = log.messages("error")
    assert len(errors) == 2
    (first,) = control.lifecycle.store.list()
    for error in errors:
        assert error.startswith(f"Could not write a checkpoint in {small_disk / 'ck'}: No space left on device; ")
        assert error.endswith(f"the previous checkpoint {first.path.name} is kept.")
    assert sorted(os.listdir(small_disk / "ck")) == sorted([first.path.name, first.sidecar.name, LOCK_FILE])
    (small_disk / "filler").unlink()
    assert_finite_weights(first.path)




def test_a_file_size_limit_fails_the_save_clearly_in_a_real_fit(tmp_path):
    """The same story as with a full disk, portable: RLIMIT_FSIZE in a child."""
    folder = tmp_path / "ck"
    result = run_program(str(PROGRAMS / "fit_under_file_size_limit.py"), str(folder), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # aborted: the program's script failed (its traceback is on stderr)
    assert report["state"] == "stopped" and report["trained_after"] == ["running"], result.stderr[-3000:]
    (checkpoint,) = report["checkpoints"]
    name = Path(checkpoint).name
    assert len(report["errors"]) == 2
    assert all(e.endswith(f"File too large; the previous checkpoint {name} is kept.") for e in report["errors"])
    assert report["files"] == sorted([name, name.replace(".keras", ".json"), LOCK_FILE])


# Security --------------------------------------------------------------------


def test_run_folder_fifo_and_record_are_private(make_model, tiny_data, tmp_path, runtime_dir):
    seen = {}

    def look(control):
        folder = Path(control.fifo).parent
        seen["modes"] = {
            "registry": stat.S_IMODE(os.lstat(runtime_dir).st_mode),
            "run folder": stat.S_IMODE(os.lstat(folder).st_mode),
            "fifo": stat.S_IMODE(os.lstat(control.fifo).st_mode),
            "record": stat.S_IMODE(os.lstat(folder / "run.json").st_mode),
        }
        deliver(control.fifo, "stop")

    old_umask = os.umask(0o000)  # a careless umask must not open anything up
    try:
        drive_fit(make_model(), tiny_data, controlled("private", tmp_path), look)
    finally:
        os.umask(old_umask)
    assert seen["modes"] == {"registry": 0o700, "run folder": 0o700, "fifo": 0o600, "record": 0o600}


def test_planted_symlinks_in_the_checkpoint_folder_are_never_followed(tmp_path, make_model):
    """Staging folders and checkpoint names planted as symlinks: the store skips
    the links (they are not its own: no sidecar of its says so, so they stay)
    and never writes or deletes through them."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    (ckdir / ".partial-1-planted").symlink_to(outside)
    (ckdir / ".partial-999999999-planted").symlink_to(outside)
    (ckdir / "ckpt-000001-epoch0000-step000001.keras").symlink_to(outside / "precious.txt")
    store = CheckpointStore(ckdir, keep=1)
    model = make_model()
    first = store.save(model, TrainingPosition(epoch=0, step_in_epoch=1), reason="save")
    second = store.save(model, TrainingPosition(epoch=0, step_in_epoch=2), reason="save")
    assert first.sequence == 2  # the planted name was skipped, not overwritten
    assert store.list() == [second]
    assert (outside / "precious.txt").read_text() == "keep me"
    assert sorted(os.listdir(outside)) == ["precious.txt"]
    planted = ["ckpt-000001-epoch0000-step000001.keras", ".partial-1-planted", ".partial-999999999-planted"]
    assert all((ckdir / name).is_symlink() for name in planted)  # not ours: left as they were
    assert sorted(os.listdir(ckdir)) == sorted([*planted, second.path.name, second.sidecar.name, LOCK_FILE])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant files owned by another user")
def test_a_registry_or_fifo_owned_by_another_user_is_refused(runtime_dir, tmp_path):
    runtime_dir.mkdir(mode=0o700)
    os.chown(runtime_dir, 12345, 12345)
    with pytest.raises(UnsafePathError, match="owned by uid 12345"):
        RunFolder.claim("alpha")
    with pytest.raises(UnsafePathError, match="owned by uid 12345"):
        list_runs()
    os.chown(runtime_dir, 0, 0)
    fifo = tmp_path / "theirs"
    os.mkfifo(fifo, 0o600)
    os.chown(fifo, 12345, 12345)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(UnsafePathError, match="owned by uid 12345"):
            deliver(fifo, "stop")
        assert os.read(reader, 100) == b""
    finally:
        os.close(reader)


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
#: Audit events that change the file system: event -> ((path arg, its dir_fd arg or None), ...).
_PATH_EVENTS = {
    "os.mkdir": ((0, 2),), "os.rename": ((0, 2), (1, 3)), "os.remove": ((0, 1),), "os.rmdir": ((0, 1),),
    "shutil.rmtree": ((0, 1),), "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.truncate": ((0, None),),
    "os.symlink": ((1, 2),), "os.link": ((1, 3),), "os.utime": ((0, 3),), "tempfile.mkstemp": ((0, None),),
    "tempfile.mkdtemp": ((0, None),), "shutil.copyfile": ((1, None),), "shutil.move": ((1, None),),
}
_recorded_writes: list[str] | None = None
_hook_installed = False
_PACKAGE = str(REPO / "jupyter_traincontrol") + os.sep


def _absolute(path, dir_fd) -> str | None:
    if not isinstance(path, (str, bytes, os.PathLike)):
        return None  # a descriptor
    path = os.fsdecode(path)
    if not os.path.isabs(path) and isinstance(dir_fd, int) and dir_fd >= 0:
        return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    return os.path.abspath(path)


def _record_writes(event, args):
    """Audit hook: notes each path the package (or Keras on its behalf) writes."""
    if _recorded_writes is None:
        return
    if event == "open":
        path, mode, flags = (list(args) + [None, None])[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS)
        targets = [(path, None)] if writing else []
    elif event in _PATH_EVENTS:
        targets = [(args[p], args[d] if d is not None and d < len(args) else None) for p, d in _PATH_EVENTS[event]]
    else:
        return
    frame = sys._getframe(1)
    while frame is not None and not frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    if frame is None:
        return  # not the package's doing
    for path, dir_fd in targets:
        if dir_fd is None:  # the "open" event does not carry os.open's dir_fd: the caller's does
            dir_fd = frame.f_locals.get("dir_fd", frame.f_locals.get("at", {}).get("dir_fd"))
        absolute = _absolute(path, dir_fd)
        if absolute is not None:
            _recorded_writes.append(absolute)


def test_no_command_makes_the_tool_write_outside_its_folders(make_model, tiny_data, tmp_path, runtime_dir):
    """Every command, garbage and an overlong line, in two real fits (one ends
    with stop, one with abort): every path the package writes, itself or
    through Keras, is in the run's checkpoint folder or its registry folder
    (or is a temporary folder of Keras's own, gone when the save returns)."""
    global _recorded_writes, _hook_installed
    if not _hook_installed:
        sys.addaudithook(_record_writes)  # audit hooks cannot be removed: it idles when not recording
        _hook_installed = True
    log = EventLog()

    def everything(ending):
        def script(control):
            for word in ["save", "pause", "save", "resume", "resume", "frobnicate", "../../etc/passwd", "x" * 300, ending]:
                fd = os.open(control.fifo, os.O_WRONLY)
                os.write(fd, word.encode() + b"\n")
                os.close(fd)
                time.sleep(0.05)
        return script

    _recorded_writes = []
    try:
        for ending in ["stop", "abort"]:
            drive_fit(make_model(), tiny_data, controlled(f"all-{ending}", tmp_path, log), everything(ending))
        writes = list(_recorded_writes)
    finally:
        _recorded_writes = None
    # 5 checkpoints (2 saves a run, and the stop's), fewer when a save that comes
    # while the previous one is still being written is merged into it (a loaded machine).
    assert 2 <= log.count("checkpoint") <= 5 and log.count("rejected") == 6
    allowed = [str(tmp_path / "ck"), str(runtime_dir)]
    outside = sorted({path for path in writes if not any(path == a or path.startswith(a + os.sep) for a in allowed)})
    # Keras's `model.save` stages a model's assets in a private temporary
    # folder (tempfile.mkdtemp, "tmpXXXXXXXX" in the system temp folder) and
    # removes it before returning: allowed, as long as none is left.
    keras_staging = [p for p in outside if Path(p).relative_to(tempfile.gettempdir()).parts[0].startswith("tmp")
                     if Path(p).is_relative_to(tempfile.gettempdir())]
    assert [p for p in keras_staging if os.path.lexists(p)] == []
    assert sorted(set(outside) - set(keras_staging)) == []
    assert any(path.startswith(str(tmp_path / "ck")) for path in writes)  # the hook did see the checkpoints


# Lifecycle -----------------------------------------------------------------


def _fd_table() -> dict[int, str]:
    table = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            table[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the descriptor listdir itself used
    return table


def _handlers() -> dict[int, object]:
    return {int(s): signal.getsignal(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)}


def _without_eventfds(table: dict[int, str]) -> dict[int, str]:
    return {fd: path for fd, path in table.items() if path != "anon_inode:[eventfd]"}


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to list descriptors")
def test_ten_runs_in_one_process_leave_nothing_behind(make_model, tiny_data, tmp_path, runtime_dir):
    model = make_model()
    x, y = tiny_data
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # TensorFlow opens its own descriptors once
    fds, threads, handlers = _fd_table(), {t.ident for t in threading.enumerate()}, _handlers()
    names = []

    for index in range(10):  # each ending twice
        word = ["save", "stop", "abort", "pause", None][index % 5]
        callback = controlled(None, tmp_path / f"run{index}")

        def act(cb, word=word, callback=callback):
            if word:
                deliver(callback.fifo, word)
                wait_until(lambda: callback.lifecycle.channel.pending, message=f"{word} queued")
            if word == "pause":
                threading.Timer(0.05, deliver, (callback.fifo, "resume")).start()

        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[callback, At(0, 3, act)])
        names.append(callback.name)
        assert callback.state == {"stop": "stopped", "abort": "aborted"}.get(word, "finished")

    wait_until(lambda: {t.ident for t in threading.enumerate()} <= threads, message="threads to end")
    # By design the process keeps one descriptor: its registry lock, which
    # keeps the records of its ended runs listed while it lives.
    # Libraries open and close eventfds of their own as they need them (a
    # backend's runtime: one opened in five runs; the ZeroMQ context of an
    # earlier test's kernel client: one closed when it was collected); this
    # package opens none, so they count on neither side.
    before, table = _without_eventfds(fds), _without_eventfds(_fd_table())
    new = {fd: path for fd, path in table.items() if fd not in before}
    assert len(new) == 1 and str(runtime_dir / ".locks") in next(iter(new.values())), new
    assert {fd: path for fd, path in table.items() if fd not in new} == before
    assert _handlers() == handlers
    assert [p for p in runtime_dir.rglob("*") if stat.S_ISFIFO(os.lstat(p).st_mode)] == []
    records = list_runs()
    assert sorted(r["name"] for r in records) == sorted(names) and len(set(names)) == 10
    assert not [r for r in records if r["state"] in ACTIVE_STATES or r.get("fifo")]
