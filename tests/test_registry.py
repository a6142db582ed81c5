"""The run registry: private folders, unique names, stale records."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from helpers import wait_threads_ended, wait_until

from jupyter_traincontrol.system.private_fs import UnsafePathError
from jupyter_traincontrol.registry.folder import Leftovers
from jupyter_traincontrol.registry.paths import CLAIM_PREFIX
from jupyter_traincontrol.registry import (
    NameTakenError,
    RunFolder,
    RunNotFoundError,
    find_run,
    list_runs,
    unique_name,
    validate_name,
)


def test_claim_makes_private_folders_and_a_record(runtime_dir):
    folder = RunFolder.claim("alpha")
    try:
        assert stat.S_IMODE(os.lstat(runtime_dir).st_mode) == 0o700
        assert stat.S_IMODE(os.lstat(folder.path).st_mode) == 0o700
        record = json.loads(folder.record_path.read_text())
        assert record["name"] == "alpha" and record["state"] == "starting" and record["pid"] == os.getpid()
        assert [r["name"] for r in list_runs()] == ["alpha"]
    finally:
        folder.release()
    assert list_runs() == []


def test_descriptors_kept_to_close_later_are_closed_by_free_kept_and_by_release(runtime_dir, tmp_path):
    def is_open(fd):
        try:
            os.fstat(fd)
            return True
        except OSError:
            return False

    def new_fd():
        return os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)

    folder = RunFolder.claim("closing")
    try:
        kept = [new_fd() for _ in range(3)]
        for fd in kept:
            folder.close_later(fd)
        assert all(is_open(fd) for fd in kept)
        folder.free_kept()
        assert not any(is_open(fd) for fd in kept)
        last = new_fd()
        folder.close_later(last)
    finally:
        folder.release()
    assert not is_open(last)  # the release closed it
    sealed = RunFolder.claim("sealed")
    try:
        sealed.seal()
        late = new_fd()
        sealed.close_later(late)  # its run has ended: closed at once
        assert not is_open(late)
    finally:
        sealed.release()


def test_the_run_thread_does_the_chores_left_to_it_and_drops_them_once_stopped():
    from jupyter_traincontrol.run.publisher import Publisher

    published, woken, done = [], [], []
    publisher = Publisher(lambda soon: published.append(soon) or True)
    publisher.run_soon(lambda: done.append("before start"))  # not running: dropped
    publisher.start(wake=lambda: woken.append(1))
    publisher.run_soon(lambda: done.append("chore"))
    assert woken and 0 <= publisher.due_in() <= 0.01
    time.sleep(0.01)
    publisher.tick()
    assert done == ["chore"] and published == []  # a chore is no reason to write the record
    publisher.publish_soon()
    assert publisher.due_in() <= 0.01
    time.sleep(0.01)
    publisher.tick()
    assert published == [True]
    publisher.run_soon(lambda: done.append("too late"))
    publisher.stop()
    publisher.tick()
    assert done == ["chore"] and publisher.due_in() == float("inf")


def test_a_live_name_cannot_be_taken_twice():
    folder = RunFolder.claim("alpha")
    folder.write_record({"state": "running"})
    try:
        with pytest.raises(NameTakenError, match="A run named 'alpha' is already running"):
            RunFolder.claim("alpha")
    finally:
        folder.release()


def test_the_name_of_an_ended_run_may_be_reused():
    first = RunFolder.claim("alpha")
    first.write_record({"state": "stopped"})
    second = RunFolder.claim("alpha")
    try:
        assert second.run_id != first.run_id
        first.release()  # the old owner's release must not remove the new run
        assert second.path.is_dir()
    finally:
        second.release()


def test_records_of_dead_processes_are_cleaned_when_listed(runtime_dir):
    code = (
        "from jupyter_traincontrol.registry import RunFolder;"
        "f = RunFolder.claim('ghost'); f.write_record({'state': 'running'});"
        "import os; os._exit(0)"  # dies without cleaning up
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))
    assert (runtime_dir / "ghost").is_dir()
    assert list_runs(clean=False)[0]["live"] is False
    assert list_runs() == []
    assert not (runtime_dir / "ghost").exists()
    RunFolder.claim("ghost").release()  # and the name is free again


def test_names_are_validated():
    for bad in ["", "../x", "a/b", ".hidden", "x" * 65, "sp ace"]:
        with pytest.raises(ValueError, match="Invalid run name"):
            validate_name(bad)
    assert validate_name("run-1.b_2") == "run-1.b_2"


def test_unique_name_skips_listed_runs():
    folder = RunFolder.claim("run-1")
    try:
        assert unique_name() == "run-2"
    finally:
        folder.release()


def test_find_run_names_the_runs_it_knows():
    folder = RunFolder.claim("alpha")
    try:
        with pytest.raises(RunNotFoundError, match="No run named 'beta'. Runs listed: alpha."):
            find_run("beta")
    finally:
        folder.release()


def test_a_symlinked_registry_is_refused(runtime_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    runtime_dir.symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="symlink"):
        RunFolder.claim("alpha")


def test_a_preplanted_run_folder_symlink_is_refused(runtime_dir, tmp_path):
    runtime_dir.mkdir(mode=0o700)
    (runtime_dir / "alpha").symlink_to(tmp_path)
    with pytest.raises(UnsafePathError, match="symlink"):
        RunFolder.claim("alpha")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant a folder owned by another user")
def test_a_folder_owned_by_another_user_is_refused(runtime_dir):
    runtime_dir.mkdir(mode=0o700)
    planted = runtime_dir / "alpha"
    planted.mkdir(mode=0o700)
    os.chown(planted, 12345, 12345)
    with pytest.raises(UnsafePathError, match="owned by uid 12345"):
        RunFolder.claim("alpha")


def test_an_open_registry_folder_of_ours_is_tightened(runtime_dir):
    runtime_dir.mkdir(mode=0o755)
    os.chmod(runtime_dir, 0o755)
    RunFolder.claim("alpha").release()
    assert stat.S_IMODE(os.lstat(runtime_dir).st_mode) == 0o700


def test_reports_of_bad_records_are_made_once_and_remembered_within_a_bound(caplog, monkeypatch):
    from jupyter_traincontrol.registry import listing as registry

    monkeypatch.setattr(registry, "_reported", registry.OrderedDict())
    for number in range(registry._REPORTED_LIMIT + 50):  # a server that lives for weeks
        registry._report_once(Path(f"/runs/r{number}"), f"bad record r{number}")
    registry._report_once(Path("/runs/r60"), "bad record r60")  # recent: still remembered
    assert len(registry._reported) == registry._REPORTED_LIMIT
    assert caplog.messages.count("bad record r60") == 1
    registry._report_once(Path("/runs/r0"), "bad record r0")  # forgotten long ago: said again
    assert caplog.messages.count("bad record r0") == 2


# The history of ended runs ------------------------------------------------------------------

#: A run in a child process: opened, trained a little (no Keras needed), then
#: ended by `{end}` (Python code, with `run` the `RunLifecycle`).
CHILD_RUN = (
    "import os, signal, sys\n"
    "from jupyter_traincontrol.run import RunLifecycle\n"
    "run = RunLifecycle({name!r}, {ckpt!r}).open()\n"
    "run.move_to('running')\n"
    "{end}\n"
)


def run_child(name: str, ckpt, end: str) -> subprocess.CompletedProcess:
    code = CHILD_RUN.format(name=name, ckpt=str(ckpt), end=end)
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True,
                          timeout=60)


def test_an_ended_run_stays_listed_with_all_after_its_process_exits(tmp_path):
    assert run_child("alpha", tmp_path / "ck", "run.close('stopped')").returncode == 0
    assert list_runs() == []  # its process is gone: not a live run
    (record,) = list_runs(ended=True)
    assert (record["name"], record["state"], record["end_reason"], record["live"]) == ("alpha", "stopped", "command",
                                                                                         False)
    assert record["checkpoint_dir"] == str(tmp_path / "ck") and record["fifo"] is None
    assert "folder" not in record


def test_a_killed_run_is_kept_as_process_gone_and_a_new_process_sees_it(tmp_path, runtime_dir):
    killed = run_child("ghost", tmp_path / "ck", "run.publish(force=True); os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == -signal.SIGKILL
    assert list_runs() == []  # the dead run's folder is swept...
    assert not (runtime_dir / "ghost").exists()
    (record,) = list_runs(ended=True)  # ...and its last record kept
    assert (record["state"], record["end_reason"], record["live"]) == ("running", "process-gone", False)
    assert (record["fifo"], record["commands"]) == (None, [])
    # A fresh reader (a restarted server, another terminal) finds it too.
    code = "import json; from jupyter_traincontrol.registry import list_runs; print(json.dumps(list_runs(ended=True)))"
    again = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True,
                           timeout=60)
    assert [(r["name"], r["run_id"], r["end_reason"]) for r in json.loads(again.stdout)] == [
        ("ghost", record["run_id"], "process-gone")]
    from jupyter_traincontrol.registry import read_tombstone

    assert read_tombstone("ghost")["live"] is False  # a waiting sender answers at once


def test_a_live_process_s_ended_run_is_listed_live_and_the_history_has_each_instance(tmp_path):
    from jupyter_traincontrol.registry import read_tombstone
    from jupyter_traincontrol.run import RunLifecycle

    first = RunLifecycle("twice", tmp_path / "a").open()
    first.close("finished")
    (live,) = list_runs(ended=True)
    assert (live["live"], live["end_reason"]) == (True, "finished")  # its process lives: the record stays
    second = RunLifecycle("twice", tmp_path / "b").open()  # the name taken again: the first goes to the history
    second.close("aborted")
    second.forget()
    records = list_runs(ended=True)
    assert [(r["run_id"], r["state"], r["live"]) for r in records] == [(first.run_id, "finished", False),
                                                                       (second.run_id, "aborted", False)]
    assert read_tombstone("twice")["run_id"] == second.run_id  # the newest of the name
    assert "live" not in read_tombstone("twice")


def test_a_process_keeps_its_newest_ended_runs_and_a_claim_moves_older_ones_to_the_history(tmp_path, monkeypatch):
    from jupyter_traincontrol.registry import folder as registry_folder
    from jupyter_traincontrol.run import RunLifecycle

    monkeypatch.setattr(registry_folder, "ENDED_RUNS_KEPT", 3)
    active = RunLifecycle("active", tmp_path / "active").open()  # never ended: never let go
    reused = RunLifecycle("reused", tmp_path / "reused").open()
    reused.close("finished")  # the oldest ended run, until its next open takes its folder again
    ended = []
    for number in range(5):
        run = RunLifecycle(None, tmp_path / f"ck{number}").open()
        run.close("finished")
        ended.append(run)
        if number == 2:
            reused.open()
    runs = [active, reused, *ended]
    try:
        runs.append(RunLifecycle(None, tmp_path / "last").open())  # a claim: 4 ended left, 3 kept
        live = {record["name"]: record["state"] for record in list_runs()}
        assert live == {"active": "starting", "reused": "starting", "run-3": "finished", "run-4": "finished",
                        "run-5": "finished", "run-1": "starting"}  # run-1: the name the fifth claim let go
        history = [record["run_id"] for record in list_runs(ended=True) if not record["live"]]
        assert history == [ended[0].run_id, ended[1].run_id]  # their last records, in the history
        with pytest.raises(RunNotFoundError, match="The last run named 'run-2' has ended \\(state finished"):
            find_run("run-2")
        runs.append(RunLifecycle(None, tmp_path / "again").open())
        assert runs[-1].name == "run-2"  # a name let go is free again
    finally:
        for run in runs:
            run.close("finished")
            run.forget()


def test_the_history_keeps_the_last_fifty_runs_of_the_last_seven_days(runtime_dir):
    from jupyter_traincontrol.registry.tombstones import HISTORY_RUNS, HISTORY_SECONDS

    for number in range(HISTORY_RUNS + 5):
        folder = RunFolder.claim(f"r{number}")
        folder.write_record({"state": "finished", "started": float(number), "ended": time.time()})
        folder.release()
    names = [record["name"] for record in list_runs(ended=True)]
    assert names == [f"r{number}" for number in range(5, HISTORY_RUNS + 5)]
    oldest = sorted((runtime_dir / ".ended").iterdir(), key=lambda path: path.stat().st_mtime)[0]
    week_ago = time.time() - HISTORY_SECONDS - 60
    os.utime(oldest, (week_ago, week_ago))
    assert len(list_runs(ended=True)) == HISTORY_RUNS - 1
    assert not oldest.exists()  # removed by the next sweep


def test_a_name_many_runs_reused_keeps_its_newest_in_the_history_and_pushes_no_other_run_out(runtime_dir):
    """A loop of `fit` calls with one named callback is a run each: the
    history keeps the newest few of that name, and the runs of other names
    stay listed."""
    from jupyter_traincontrol.registry import read_tombstone
    from jupyter_traincontrol.registry.tombstones import HISTORY_RUNS_PER_NAME

    now = time.time()
    names = ["before", "other"] + ["loop"] * (HISTORY_RUNS_PER_NAME + 3)
    for number, name in enumerate(names):
        folder = RunFolder.claim(name)
        folder.write_record({"state": "finished", "started": float(number), "ended": now - 100 + number})
        folder.release()
    history = [(record["name"], record["started"]) for record in list_runs(ended=True)]
    newest_loops = range(len(names) - HISTORY_RUNS_PER_NAME, len(names))
    assert history == [("before", 0.0), ("other", 1.0)] + [("loop", float(number)) for number in newest_loops]
    assert read_tombstone("loop")["started"] == float(len(names) - 1)


def test_a_malformed_tombstone_is_skipped_and_reported_once(runtime_dir, caplog):
    folder = RunFolder.claim("fine")
    folder.write_record({"state": "stopped"})
    folder.release()
    (runtime_dir / ".ended" / "bad.0123.json").write_text('{"name": "bad", "pid": ')
    assert [record["name"] for record in list_runs(ended=True)] == ["fine"]
    assert [record["name"] for record in list_runs(ended=True)] == ["fine"]
    assert sum("bad.0123.json" in message for message in caplog.messages) == 1


def test_a_run_has_one_thread_which_publishes_soon_and_ticks(runtime_dir, tmp_path):
    from jupyter_traincontrol.protocol import RunState
    from jupyter_traincontrol.run.lifecycle import RunLifecycle

    before = {t.ident for t in threading.enumerate()}
    run = RunLifecycle("onethread", tmp_path / "ck").open()
    try:
        started = [t.name for t in threading.enumerate() if t.ident not in before and t.name.startswith("traincontrol-")]
        assert started == ["traincontrol-reader-onethread"], started
        ticks = []
        run.publisher.add_tick_hook(lambda: ticks.append(threading.current_thread().name))
        run.move_to(RunState.RUNNING)  # published soon, by the run's thread
        wait_until(lambda: find_run("onethread")["state"] == "running", timeout=5,
                   message="the running state published")
        wait_until(lambda: ticks, timeout=5, message="a tick hook run about twice a second")
        assert set(ticks) == {"traincontrol-reader-onethread"}
    finally:
        run.close(RunState.FINISHED)
    assert find_run("onethread")["state"] == "finished"
    wait_threads_ended()  # by itself, after close
    run.publish_soon()  # after close: nothing to wake
    assert find_run("onethread")["state"] == "finished"


def run_folder_leftovers(folder: Path) -> list[str]:
    """What a run folder holds besides its lock, record and FIFO: a record
    write's temporary file (``.run.json.*.tmp``), say, left behind."""
    return sorted(p.name for p in folder.iterdir() if p.name not in ("lock", "run.json", "control"))


def test_runs_opened_and_closed_back_to_back_leave_no_replaced_records_behind(runtime_dir, tmp_path):
    """A loop of runs too short for their thread to tick (a reused callback's
    2-batch fits) leaves nothing in the folder beside its lock, its record
    and its FIFO."""
    from jupyter_traincontrol.protocol import RunState
    from jupyter_traincontrol.run.lifecycle import RunLifecycle

    run = RunLifecycle("loop", tmp_path / "ck")
    for _run in range(30):
        run.open()
        run.close(RunState.FINISHED)
    wait_threads_ended()
    assert run_folder_leftovers(run._folder.path) == []
    assert find_run("loop")["state"] == "finished"


def test_ended_runs_leave_only_their_lock_and_record_in_the_runtime_folder(runtime_dir, tmp_path, monkeypatch):
    """Runs that end (finished, stopped, failed, one whose thread had ended
    before it, one ended while a claim took its name over) leave no
    ``.run.json.*`` file beside their record in their folder, whichever
    thread wrote their records."""
    from jupyter_traincontrol.protocol import RunState
    from jupyter_traincontrol.run.lifecycle import RunLifecycle

    ended = []
    for name, final in [("done", RunState.FINISHED), ("halted", RunState.STOPPED), ("broken", RunState.FAILED)]:
        run = RunLifecycle(name, tmp_path / name).open()
        run.move_to(RunState.RUNNING)
        time.sleep(0.05)  # its thread wrote the running record
        run.publish(force=True)  # a write of this thread beside the run's thread's
        run.close(final, error="Traceback: boom" if final == RunState.FAILED else None)
        ended.append(run)
    wait_threads_ended()
    for run in ended:
        assert run_folder_leftovers(run._folder.path) == [], run.name
        assert find_run(run.name)["state"] == run.state
    again = RunLifecycle("done", tmp_path / "done").open()  # the same name: the ended run's folder serves it
    again.close(RunState.FINISHED)
    wait_threads_ended()
    assert run_folder_leftovers(again._folder.path) == []
    records = [p for p in runtime_dir.rglob("*") if ".run.json." in p.name]
    assert records == [], records


def test_train_loops_that_finish_or_fail_leave_no_record_files_behind(runtime_dir, tmp_path):
    from jupyter_traincontrol import TrainLoop

    state = {"w": 0}

    def save(folder):
        Path(folder, "w.json").write_text(json.dumps(state))

    def load(folder):
        state.update(json.loads(Path(folder, "w.json").read_text()))

    for name, fails in [("loop-ok", False), ("loop-fails", True), ("loop-ok", False)]:
        with pytest.raises(ValueError) if fails else contextlib.nullcontext():
            with TrainLoop(name=name, checkpoint_dir=tmp_path / name, save=save, load=load, handle_sigint=False,
                           handle_sigterm=False, verbose=False) as loop:
                for _epoch in loop.epochs(2):
                    for item in loop.batches(range(3)):
                        state["w"] += item
                        loop.log(loss=1.0 / (1 + state["w"]))
                        if fails and state["w"] > 2:
                            raise ValueError("boom")
        assert loop.state == ("failed" if fails else "finished")
    wait_threads_ended()
    folders = [folder for folder in runtime_dir.iterdir() if not folder.name.startswith(".")]
    assert sorted(folder.name for folder in folders) == ["loop-fails", "loop-ok"]
    for folder in folders:
        assert run_folder_leftovers(folder) == [], folder.name


def test_a_record_built_before_the_end_is_never_written_after_the_last_one(runtime_dir, tmp_path):
    """The run's thread may be building a record as the run ends; the end
    writes the last record while that thread ends, and the older one must
    not land after it (`RunLifecycle.publish` writes them in order)."""
    from jupyter_traincontrol.protocol import RunState
    from jupyter_traincontrol.run.lifecycle import RunLifecycle

    run = RunLifecycle("ordered", tmp_path / "ck").open()
    building, go_on = threading.Event(), threading.Event()
    record = run.record

    def slow_record():
        built = record()
        if threading.current_thread().name.startswith("traincontrol-reader") and not building.is_set():
            building.set()  # the run's thread holds a record of a running run
            go_on.wait(10)
        return built

    run.record = slow_record
    ending = threading.Thread(target=run.close, args=(RunState.FINISHED,))
    try:
        run.move_to(RunState.RUNNING)  # published soon, by the run's thread
        assert building.wait(10), "the run's thread never published"
        ending.start()
        time.sleep(0.2)  # the end gets as far as it can
    finally:
        go_on.set()
        ending.join(10)
    assert not ending.is_alive()
    assert find_run("ordered")["state"] == "finished"


def test_a_checkpoint_folder_a_fit_left_empty_is_freed_by_the_runs_thread_as_it_ends(
        make_model, tiny_data, tmp_path, monkeypatch):
    """A fit that writes no checkpoint removes the folder it made; the last
    close of that folder frees it (0.2 ms on ext4), which the training thread
    leaves to the run's thread: it closes it as it ends, while the training
    thread writes the run's last record. Nothing is left open."""
    from jupyter_traincontrol import ControlCallback

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to list descriptors")
    ckpt = tmp_path / "ck"

    def removed_folder_fds():
        held = []
        for name in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{name}") == f"{ckpt} (deleted)":
                    held.append(int(name))
            except OSError:
                pass  # closed meanwhile (this listing's own descriptor)
        return held

    closers = []
    free_kept = Leftovers.free_kept

    def noted_free_kept(self):
        if self._descriptors:
            closers.append((threading.current_thread().name, removed_folder_fds() == self._descriptors))
        free_kept(self)

    monkeypatch.setattr(Leftovers, "free_kept", noted_free_kept)
    model, (x, y) = make_model(), tiny_data
    callback = ControlCallback(name="empty", checkpoint_dir=ckpt, save_at_end=False, verbose=False, handle_sigint=False)
    for _fit in range(3):
        model.fit(x[:8], y[:8], batch_size=4, epochs=1, verbose=0, callbacks=[callback])
        assert not ckpt.exists()  # removed as the run let go of it
        wait_until(lambda: removed_folder_fds() == [], timeout=5, message="the run's thread to close the folder")
    assert closers == [("traincontrol-reader-empty", True)] * 3


def test_a_claim_of_an_ended_run_of_this_process_takes_its_folder_over_and_leaves_the_rest_to_its_runs_thread(
        runtime_dir, tmp_path, monkeypatch):
    """A new callback of the same name each `fit`: the ended run's record goes
    to the history and its folder serves the new run as it is (no staging,
    no folder removed); bounding the history and the claim's sweep of dead
    runs (about 0.3 ms) are left to the new run's thread."""
    from jupyter_traincontrol.protocol import RunState
    from jupyter_traincontrol.registry import folder as folder_module, liveness, tombstones
    from jupyter_traincontrol.run import RunLifecycle

    first = RunLifecycle("again", tmp_path / "a").open()
    first.publish_soon()
    first.close(RunState.FINISHED)
    wait_threads_ended()  # the first run's (its sweep of dead runs too)
    old_folder = first._folder.path.stat().st_ino

    staged, pruned_by, swept_by = [], [], []
    mkdtemp, prune = folder_module.tempfile.mkdtemp, tombstones.remove_old_tombstones
    sweep = folder_module.sweep_dead_runs
    for module in (folder_module, liveness):  # bounded alone, or by the sweep
        monkeypatch.setattr(module, "remove_old_tombstones",
                            lambda root: pruned_by.append(threading.current_thread().name) or prune(root))
    monkeypatch.setattr(tombstones, "remove_old_tombstones",  # as the ended run's record becomes a tombstone
                        lambda root: pruned_by.append("keep_tombstone") or prune(root))
    monkeypatch.setattr(folder_module, "sweep_dead_runs",  # by the claim (this thread) or the run's thread
                        lambda root: swept_by.append(threading.current_thread().name) or sweep(root))
    monkeypatch.setattr(folder_module.tempfile, "mkdtemp", lambda **kw: staged.append(1) or mkdtemp(**kw))
    second = RunLifecycle("again", tmp_path / "b").open()
    try:
        assert staged == [] and second._folder.path.stat().st_ino == old_folder
        wait_until(lambda: pruned_by and swept_by, timeout=5, message="the new run's thread to tidy the registry")
        assert pruned_by == ["traincontrol-reader-again"]  # the history bounded there, by the sweep
        assert swept_by == ["traincontrol-reader-again"]
        assert find_run("again")["run_id"] == second.run_id
        assert first.run_id in [r["run_id"] for r in list_runs(ended=True) if r["name"] == "again"]  # in the history
        wait_until(lambda: sorted(p.name for p in second._folder.path.iterdir() if not p.name.endswith(".tmp"))
                   == ["control", "lock", "run.json"], timeout=5, message="only the lock, record and FIFO")
        assert not [p.name for p in runtime_dir.iterdir() if p.name.startswith((".removed-", ".claim-"))]
        with pytest.raises(NameTakenError, match="already starting"):
            first.open()  # the first run's object again: its folder is the live second's now
    finally:
        second.close(RunState.FINISHED)
    assert find_run("again")["run_id"] == second.run_id
    first.open()  # ended now: taken over again, by the first object
    first.close(RunState.FINISHED)
    assert {first.run_id, second.run_id} <= {r["run_id"] for r in list_runs(ended=True) if r["name"] == "again"}


def test_a_folder_a_process_set_aside_and_never_removed_is_swept_once_old(runtime_dir, monkeypatch):
    from jupyter_traincontrol.registry import liveness

    RunFolder.claim("sweeper").release()  # makes the registry
    trash = runtime_dir / f"{liveness.TRASH_PREFIX}{'0' * 32}"
    trash.mkdir(mode=0o700)
    (trash / "run.json").write_text("{}")
    list_runs()  # a sweep: too recent to be anyone's leftover
    assert trash.exists()
    monkeypatch.setattr(liveness, "_TRASH_GRACE_SECONDS", -1.0)
    list_runs()
    assert not trash.exists()


def test_a_sweep_between_a_claims_staging_and_its_lock_link_leaves_the_claim_alone(runtime_dir, monkeypatch):
    """Another run's thread (or process) may sweep while a claim has made its
    staging folder but not yet linked its lock in: the claim still succeeds,
    and a staging folder nobody finished is swept once old."""
    from jupyter_traincontrol.registry import folder as folder_module
    from jupyter_traincontrol.registry import liveness
    from jupyter_traincontrol.registry.liveness import sweep_dead_runs

    RunFolder.claim("sweeper").release()  # makes the registry
    link = folder_module.os.link

    def link_after_a_sweep(source, target):
        sweep_dead_runs(runtime_dir)
        return link(source, target)

    monkeypatch.setattr(folder_module.os, "link", link_after_a_sweep)
    claimed = RunFolder.claim("raced")
    monkeypatch.setattr(folder_module.os, "link", link)
    try:
        assert find_run("raced")["run_id"] == claimed.run_id
    finally:
        claimed.release()
    unfinished = Path(tempfile.mkdtemp(prefix=CLAIM_PREFIX, dir=runtime_dir))
    list_runs()  # a sweep: too recent to be a dead process's
    assert unfinished.exists()
    monkeypatch.setattr(liveness, "_TRASH_GRACE_SECONDS", -1.0)
    list_runs()
    assert not unfinished.exists()
