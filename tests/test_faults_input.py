"""Outside data and honest answers: nothing a file or a sender does breaks a run.

- Run records: truncated, hand-edited, hostile or not JSON; one bad record
  is skipped (reported once) and every other run still works.
- Numbers JSON cannot carry: NaN and infinities are null on disk, nan on screen.
- ``send --wait`` says what became of this very command: applied, failed,
  the run died, or no answer in time; each with its own exit code.
- Bursts: a thousand saves in a moment are a few checkpoints, every sender
  answered.
- Planted paths: a "FIFO" that is not one is never opened; a run folder
  swapped under a live run cannot redirect its writes; a SIGKILLed run's
  FIFO is gone when the next run starts.
- A fit that raises leaves no handler, thread or signal behind.

The checkpoint-folder side of these (user files, folder lock, malformed
sidecars) is in test_checkpoint_*.py.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import At, cli, wait_threads_ended, wait_until
from jupyter_traincontrol import ControlCallback
from jupyter_traincontrol.transport.fifo import FIFO_NAME
from jupyter_traincontrol.transport.channels import NotListeningError, deliver
from jupyter_traincontrol.control.client import send, wait_for_ack
from jupyter_traincontrol.boundary.progress import TrainingProgress
from jupyter_traincontrol.run import RunLifecycle
from jupyter_traincontrol.system.private_fs import UnsafePathError
from jupyter_traincontrol.registry import (
    RECORD_NAME,
    RunFolder,
    find_run,
    list_runs,
    registry_root,
)
from jupyter_traincontrol.protocol.record import validate_record

BATCH = 8


def plant_record(name: str, content: str | bytes) -> None:
    """A run folder with `content` as its record, as a hostile or broken
    writer would leave it (no lock: no live process holds it)."""
    folder = registry_root() / name
    folder.mkdir(mode=0o700, parents=True)
    os.chmod(registry_root(), 0o700)
    data = content.encode() if isinstance(content, str) else content
    (folder / RECORD_NAME).write_bytes(data)


def good_record(name: str, **fields) -> str:
    return json.dumps({"name": name, "run_id": "x" * 32, "pid": os.getpid(), "state": "running", **fields})


# Run records ----------------------------------------------------------------

HOSTILE_RECORDS = {
    "truncated": good_record("bad")[:20],
    "not-json": "\x00\xff garbage",
    "a-list": "[1, 2, 3]",
    "huge-pid": good_record("bad", pid=2**80),
    "text-time": good_record("bad", started="yesterday"),
    "name-not-text": json.dumps({"name": ["bad"], "run_id": "x", "pid": 1, "state": "running"}),
    "other-name": good_record("someone-else"),
    "nan-metric": good_record("bad", metrics={"loss": float("nan")}),
    "unknown-state": good_record("bad", state="exploding"),
    "deep": "[" * 100_000 + "]" * 100_000,
    # Fields the run writes that the reader once let through unchecked.
    "loss-curve-object": good_record("bad", loss_curve={}),
    "tunables-text": good_record("bad", tunables={"learning_rate": "fast"}),
    "changes-of-numbers": good_record("bad", changes=[1, 2]),
    "checkpoints-this-run-text": good_record("bad", checkpoints_this_run="all"),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_RECORDS))
def test_a_hostile_record_is_skipped_and_every_other_run_works(kind, live_run, caplog):
    plant_record("bad", HOSTILE_RECORDS[kind])
    # Held by this (live) process, so the listing cannot clean it away as dead.
    os.link(live_run._folder.path / "lock", registry_root() / "bad" / "lock")

    names = [record["name"] for record in list_runs()]
    assert names == ["alpha"]
    assert sum("bad" in message for message in caplog.messages) == 1  # reported, in one line
    list_runs()
    assert sum("bad" in message for message in caplog.messages) == 1  # once

    listed = cli("list", "--json")
    assert listed.returncode == 0 and [r["name"] for r in json.loads(listed.stdout)] == ["alpha"]
    table = cli("list")
    assert table.returncode == 0 and "alpha" in table.stdout and "Traceback" not in table.stderr
    assert cli("send", "alpha", "save").returncode == 0
    assert live_run.channel.get(5).command.value == "save"
    refused = cli("send", "bad", "stop")
    assert refused.returncode == 3 and "Traceback" not in refused.stderr


def test_a_malformed_record_of_a_dead_run_never_holds_its_name():
    plant_record("stuck", "{ not json")
    RunFolder.claim("stuck").release()  # the name is free: no live lock, the folder goes


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_as_a_record_are_valid_or_one_clear_reason(data):
    record, problem = validate_record(data.decode("utf-8", "replace"), "alpha")
    assert (record is None) != (problem == "")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
_fields = st.dictionaries(
    st.sampled_from(["name", "run_id", "pid", "state", "epoch", "started", "metrics", "events", "acks", "history", "fifo",
                     "loss_curve", "tunables", "changes", "checkpoints_this_run"]),
    _json,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_fields)
def test_any_json_as_a_record_is_valid_or_one_clear_reason(fields):
    record, problem = validate_record(json.dumps(fields), "alpha")
    assert (record is None) != (problem == "")
    if record is not None:  # what is accepted is what a reader may rely on
        assert isinstance(record["pid"], int) and record["name"] == "alpha"


# Numbers JSON cannot carry ------------------------------------------------------


def _strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"invalid JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def test_nan_and_infinity_are_null_on_disk_and_nan_on_screen(tmp_path):
    run = RunLifecycle("diverging", tmp_path / "ck").open()
    try:
        progress = TrainingProgress()
        progress.metrics = {"loss": float("nan"), "mae": float("inf"), "val_loss": 1.5}
        run.follow(progress)
        run.history.record_epoch(0, {"loss": float("-inf")})
        run.publish(force=True)
        on_disk = _strict_json((run._folder.path / RECORD_NAME).read_text())
        assert on_disk["metrics"] == {"loss": None, "mae": None, "val_loss": 1.5}
        assert on_disk["history"][0]["loss"] is None
        listed = cli("list", "--json")
        assert _strict_json(listed.stdout)[0]["metrics"]["loss"] is None
        table = cli("list").stdout.splitlines()
        assert table[1].split()[4] == "nan"  # the LOSS column
    finally:
        run.close("stopped")


def test_a_metric_that_cannot_be_read_is_left_out_and_the_record_still_written(tmp_path):
    """A JAX job whose peer died leaves the last step's metrics as arrays
    whose collective failed: reading one raises. The record goes on without it."""

    class FailedArray:
        def __float__(self):
            raise RuntimeError("Gloo all-reduce failed: Connection reset by peer")

    run = RunLifecycle("peerless", tmp_path / "ck").open()
    try:
        progress = TrainingProgress()
        progress.metrics = {"loss": FailedArray(), "val_loss": 1.5}
        run.follow(progress)
        assert run.publish(force=True)
        on_disk = _strict_json((run._folder.path / RECORD_NAME).read_text())
        assert on_disk["metrics"] == {"val_loss": 1.5}
    finally:
        run.close("failed", error="Process 1 of 2 was lost.")


# send --wait tells the truth ------------------------------------------------------


def test_wait_reports_the_command_applied_by_its_id(training, tmp_path):
    script = training("--name", "honest", "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "200", linger=True)
    saved = cli("send", "honest", "save", "--wait", "30")
    assert saved.returncode == 0, saved.stderr
    assert "Sent save to honest: checkpoint written:" in saved.stdout
    paused = cli("send", "honest", "pause", "--wait", "30")
    assert paused.returncode == 0 and "paused" in paused.stdout
    again = cli("send", "honest", "pause", "--wait", "30")
    assert again.returncode == 0 and "Already paused" in again.stdout
    stopped = cli("send", "honest", "stop", "--wait", "30")
    assert stopped.returncode == 0 and "checkpoint written" in stopped.stdout
    assert script.finish()[0] == 0


def test_wait_for_a_stop_succeeds_though_the_script_exits_at_once(training, tmp_path):
    script = training("--name", "brief", "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "200")
    stopped = cli("send", "brief", "stop", "--wait", "30")
    assert stopped.returncode == 0, stopped.stderr  # applied, then the process ended: not "died"
    assert "checkpoint written" in stopped.stdout
    assert script.finish()[0] == 0


def test_wait_exits_7_when_no_acknowledgement_comes_in_time(training, tmp_path):
    script = training("--name", "frozen", "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "200")
    script.process.send_signal(signal.SIGSTOP)  # alive (its lock held), but it will not answer
    try:
        result = cli("send", "frozen", "save", "--wait", "0.5")
    finally:
        script.process.send_signal(signal.SIGCONT)
    assert result.returncode == 7, result.stderr
    assert "did not acknowledge it within 0.5 s" in result.stderr


def test_wait_exits_4_when_the_run_dies_first(training, tmp_path):
    script = training("--name", "doomed", "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "200")
    script.process.send_signal(signal.SIGSTOP)  # it cannot apply the command before it dies
    request = send("doomed", "save")
    fifo = registry_root() / "doomed" / FIFO_NAME
    script.process.kill()
    script.process.wait()
    with pytest.raises(NotListeningError, match="died before applying save"):
        wait_for_ack("doomed", request, timeout=30)
    assert not fifo.exists()  # `echo stop >` cannot hang on it


def test_a_dead_runs_record_answers_4_then_its_fifo_is_gone(training, tmp_path):
    script = training("--name", "killed", "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "200")
    fifo = registry_root() / "killed" / FIFO_NAME
    script.process.kill()
    script.process.wait()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # left behind by the kill
    result = cli("send", "killed", "stop")
    assert result.returncode == 4 and "no longer listening" in result.stderr
    assert not fifo.exists()


def test_wait_exits_6_when_the_run_could_not_carry_it_out(training, tmp_path):
    folder = tmp_path / "ck"
    training("--name", "nodisk", "--checkpoint-dir", str(folder), "--epochs", "200", "--batch-sleep", "0.05")
    folder.rename(tmp_path / "elsewhere")  # the checkpoint folder swapped away under the run
    folder.mkdir()
    result = cli("send", "nodisk", "save", "--wait", "30")
    assert result.returncode == 6, (result.stdout, result.stderr)
    assert "could not carry out save" in result.stderr
    assert cli("send", "nodisk", "abort", "--wait", "30").returncode == 0  # still controllable


@pytest.mark.parametrize("wait", ["-1", "soon", "nan"])
def test_a_bad_wait_is_a_usage_error(live_run, wait):
    result = cli("send", "alpha", "save", "--wait", wait)
    assert result.returncode == 2 and "expected a number of seconds" in result.stderr
    assert not live_run.channel.pending


def test_error_messages_quote_at_most_80_characters_of_input(live_run):
    for argv in (("send", "x" * 5000, "stop"), ("send", "alpha", "y" * 5000)):
        result = cli(*argv)
        assert result.returncode in (2, 3)
        assert len(result.stderr) < 400, result.stderr


# Bursts -----------------------------------------------------------------------


def test_a_thousand_saves_are_a_few_checkpoints_and_every_sender_is_answered(make_model, tiny_data, tmp_path):
    control = ControlCallback(name="burst", checkpoint_dir=tmp_path / "ck", keep=50, verbose=False, handle_sigint=False)
    ids = [f"s{index}" for index in range(1000)]
    failures = []

    def burst():
        threads = [
            threading.Thread(target=lambda part=ids[i::8]: [deliver(control.fifo, f"save #{i}") for i in part])
            for i in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        def answered():
            acked = {i for ack in control.lifecycle.journal.acks for i in ack["ids"]}
            return acked >= set(ids)

        try:
            wait_until(answered, timeout=60, message="every save acknowledged")
        except AssertionError as error:
            failures.append(error)
        deliver(control.fifo, "stop")

    def start_burst(cb):  # from another thread: the training thread must go on meanwhile
        threading.Thread(target=burst, name="test-burst").start()

    x, y = tiny_data
    make_model().fit(x, y, batch_size=BATCH, epochs=100_000, verbose=0, callbacks=[control, At(0, 1, start_burst)])
    assert not failures and control.state == "stopped"
    saves = [c for c in control.lifecycle.checkpoints() if c.info["reason"] == "save"]
    assert 1 <= len(saves) <= 20, len(saves)  # a handful, not a thousand
    acks = [ack for ack in control.lifecycle.journal.acks if ack["command"] == "save"]
    assert sum(len(ack["ids"]) for ack in acks) == 1000 and all(ack["outcome"] == "applied" for ack in acks)


# Planted paths ------------------------------------------------------------------


_opened: list | None = None
_audit_installed = False


def _audit_opens(event, args):
    if _opened is not None and event == "open":
        _opened.append(args[0])


def _watch_opens(on: bool) -> list:
    """Starts or stops noting opened paths (audit hooks cannot be removed:
    it idles when off). Returns what was noted."""
    global _opened, _audit_installed
    if not _audit_installed:
        sys.addaudithook(_audit_opens)
        _audit_installed = True
    noted, _opened = list(_opened or []), ([] if on else None)
    return noted


@pytest.mark.parametrize("planted", ["file", "folder", "device"])
def test_a_channel_that_is_not_a_fifo_is_refused_without_opening_it(live_run, planted):
    fifo = live_run._folder.path / FIFO_NAME
    fifo.unlink()
    if planted == "file":
        fifo.write_text("")
    elif planted == "folder":
        fifo.mkdir(mode=0o700)
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to make a device node")
        os.mknod(fifo, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers
    _watch_opens(True)
    try:
        with pytest.raises(UnsafePathError, match="expected a fifo"):
            send("alpha", "stop")
    finally:
        opened = _watch_opens(False)
    assert [path for path in opened if str(path).endswith(f"/{FIFO_NAME}")] == []
    if fifo.is_dir():
        fifo.rmdir()
    else:
        fifo.unlink()


def test_a_run_folder_swapped_under_a_live_run_cannot_redirect_its_writes(live_run, tmp_path):
    folder = live_run._folder.path
    moved = folder.with_name("alpha-moved")
    decoy = tmp_path / "decoy"
    decoy.mkdir(mode=0o700)
    os.rename(folder, moved)
    os.symlink(decoy, folder)  # an attacker's symlink where the folder was
    live_run.source.metrics = {"loss": 0.1}
    live_run.touch()
    assert live_run.publish(force=True)
    assert list(decoy.iterdir()) == []  # nothing written through the planted path
    assert json.loads((moved / RECORD_NAME).read_text())["metrics"] == {"loss": 0.1}
    os.unlink(folder)
    os.rename(moved, folder)


def test_a_sigkilled_runs_fifo_is_removed_when_the_next_run_starts(training, tmp_path):
    script = training("--name", "gone", "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "200")
    fifo = registry_root() / "gone" / FIFO_NAME
    script.process.kill()
    script.process.wait()
    assert fifo.exists()
    RunFolder.claim("another").release()
    assert not fifo.exists()


# A failure leaves nothing behind ----------------------------------------------------


def test_a_failing_fit_leaves_no_handler_no_signal_and_the_next_fit_is_fresh(make_model, tiny_data, tmp_path):
    sigints = []
    previous = signal.signal(signal.SIGINT, lambda *args: sigints.append(args))  # a Ctrl+C as a user's program sees it
    try:
        control = ControlCallback(name="fragile", checkpoint_dir=tmp_path / "ck", verbose=False)
        x, y = tiny_data

        def explode(cb):
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            make_model().fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[control, At(0, 2, explode)])
        # A new fit right after, same name: a fresh run (the failed one is ended first).
        again = ControlCallback(name="fragile", checkpoint_dir=tmp_path / "ck2", verbose=False)
        make_model().fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[again])
        assert control.state == "failed" and again.state == "finished"
        wait_until(lambda: signal.getsignal(signal.SIGINT) is not previous and signal.getsignal(signal.SIGINT).__name__ == "<lambda>",
                   message="the user's handler back")
        time.sleep(1.0)  # not a wait for an event: time for a delayed signal to (not) arrive
        assert sigints == []  # no signal was sent to the process
        assert not [t.name for t in threading.enumerate() if t.name.startswith("traincontrol-")]
        os.kill(os.getpid(), signal.SIGINT)  # the user's next Ctrl+C is the user's
        wait_until(lambda: len(sigints) == 1, message="the user's handler to get Ctrl+C")
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("background", [False, True], ids=["on the training thread", "in the background"])
def test_a_save_of_a_model_keras_cannot_serialize_is_answered_failed_and_fit_goes_on(tiny_data, tmp_path, background):
    import keras

    class Unserializable(keras.layers.Layer):
        def call(self, inputs):
            return inputs

        def get_config(self):
            raise RuntimeError("this layer cannot be serialized")

    model = keras.Sequential([keras.Input((3,)), Unserializable(), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    control = ControlCallback(name="odd", checkpoint_dir=tmp_path / "ck", verbose=False,
                              save_in_background=background)
    x, y = tiny_data
    history = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                        callbacks=[control, At(0, 1, lambda cb: control.send("save #s"), hook="on_train_batch_begin")])
    assert len(history.history["loss"]) == 2 and control.state == "finished" and control.checkpoints == []
    record = find_run("odd")
    (answer,) = [a for a in record["acks"] if "s" in a["ids"]]
    assert answer["outcome"] == "failed" and "this layer cannot be serialized" in answer["message"]
    end = [e["message"] for e in record["events"] if e["kind"] == "error"][-1]  # the end checkpoint's, said too
    assert end == (f"Could not write a checkpoint in {tmp_path / 'ck'}: RuntimeError: this layer cannot be serialized; "
                   "there is no earlier checkpoint.")
    assert not (tmp_path / "ck").exists()  # nothing half-written: the folder the run made held nothing, and went
    wait_threads_ended()


def test_ending_a_lost_run_waits_for_an_end_another_thread_began(make_model, tiny_data, tmp_path):
    """A job ends its run from its own thread when a peer is lost, and at exit,
    while the watchdog of a `fit` that raised may be ending it already: the
    later caller returns once the run's last record is written, so what
    follows (the registry's exit, the job leaving a stuck process) finds it
    (seen under load: a job's process exited before its run said it failed)."""
    control = ControlCallback(name="lost", checkpoint_dir=tmp_path / "ck", verbose=False, save_at_end=False)
    entered, release = threading.Event(), threading.Event()

    def slow_end(run, event):  # the watchdog's end, held where the state is final but not yet written
        if event is not None and event["kind"] == "state" and event["message"] == "failed" and not entered.is_set():
            entered.set()
            release.wait(10)

    control.lifecycle.add_listener(slow_end)
    x, y = tiny_data

    def explode(cb):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        make_model().fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[control, At(0, 2, explode)])
    assert entered.wait(10), "the watchdog never ended the run of the fit that raised"
    threading.Timer(0.3, release.set).start()
    control.session.end_lost("Process 1 of 2 was lost.")  # returns once the watchdog's end is done
    record = find_run("lost")
    assert record["state"] == "failed" and "on_train_end never ran" in record["error"], record
    assert control.session.closed


def test_every_field_a_run_writes_is_declared_and_its_ids_are_one(make_model, tiny_data, tmp_path):
    """The record a real run writes holds declared fields only (the writer
    checks it against protocol.record.FIELDS, as every reader does), and its
    run_id is the one in its checkpoints' sidecars."""
    from driving import fit
    from helpers import At

    from jupyter_traincontrol import ControlCallback
    from jupyter_traincontrol.protocol.record import FIELDS

    control = ControlCallback(name="declared", checkpoint_dir=tmp_path / "ck", verbose=False)
    fit(make_model(), tiny_data, control, At(0, 1, lambda cb: control.lifecycle.channel.inject("set lr=0.02")),
        At(0, 2, lambda cb: control.lifecycle.channel.inject("save")),
        At(0, 4, lambda cb: control.lifecycle.channel.inject("stop")), epochs=1)
    record = json.loads((control.lifecycle._folder.path / RECORD_NAME).read_text())  # the last one, as written
    assert set(record) <= set(FIELDS), set(record) - set(FIELDS)
    assert {"loss_curve", "tunables", "changes", "checkpoints_this_run"} <= set(record)
    sidecars = [json.loads(path.with_suffix(".json").read_text()) for path in control.checkpoints]
    assert len(sidecars) == 2 and {sidecar["run_id"] for sidecar in sidecars} == {record["run_id"]}
    assert record["checkpoints_this_run"] == 2 and record["changes"][0]["name"] == "learning_rate"
