"""Never lose more than minutes: SIGTERM is a graceful stop, autosave bounds what a kill loses.

The SIGTERM and SIGKILL stories run the training in a subprocess
(`programs/never_lose.py`: a Keras `fit` or a PyTorch `TrainLoop`), as
``docker stop``, a scheduler or the kernel's OOM killer would meet it; the
autosave stories run a real `fit` in this process.
"""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pytest

from driving import drive_fit
from helpers import TrainingProcess, cli, read_sidecar, wait_until
from jupyter_traincontrol import ControlCallback
from jupyter_traincontrol.checkpoint import AUTOSAVES_KEPT
from jupyter_traincontrol.protocol import Command

PROGRAM = str(Path(__file__).parent / "programs" / "never_lose.py")
SIGTERMED = -signal.SIGTERM  # Popen's return code of a process killed by SIGTERM


def start(driver: str, name: str, folder: Path, *args: str) -> TrainingProcess:
    """`programs/never_lose.py` in a subprocess, once it has trained a batch."""
    return TrainingProcess("--driver", driver, "--name", name, "--checkpoint-dir", str(folder), *args, script=PROGRAM)


@pytest.fixture
def scripts():
    """Starts scripts (`start`); kills what still runs at teardown."""
    started: list[TrainingProcess] = []

    def starting(*args) -> TrainingProcess:
        script = start(*args)
        started.append(script)
        return script

    yield starting
    for script in started:
        script.kill()


def _signal(script: TrainingProcess, signum: int) -> float:
    """Sends `signum`; returns when (``time.time()``)."""
    sent = time.time()
    script.process.send_signal(signum)
    return sent


def _end(script: TrainingProcess, timeout: float = 90) -> tuple[int, str, str]:
    """Waits for the end; returns (return code, stdout, stderr)."""
    code, _result, err = script.finish(timeout)
    return code, script.stdout, err


def _listed_checkpoints(out: str) -> list[str]:
    (line,) = [line for line in out.splitlines() if line.startswith("CHECKPOINTS ")]
    return json.loads(line[len("CHECKPOINTS "):])


def _ended_record(name: str) -> dict:
    listed = json.loads(cli("list", "--all", "--json").stdout)
    (record,) = [record for record in listed if record["name"] == name]
    return record


def _sidecars(folder: Path) -> list[dict]:
    """The sidecars of the complete checkpoints in `folder`, oldest first, with their commit time."""
    found = []
    for path in sorted(folder.glob("ckpt-*.json")):
        info = json.loads(path.read_text())
        found.append({**info, "committed": path.stat().st_mtime})
    return found


# SIGTERM ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["fit", "span", "loop"])
def test_sigterm_at_a_random_moment_stops_with_a_checkpoint_then_ends_the_script(tmp_path, scripts, driver):
    delay = random.Random(f"sigterm-{driver}").uniform(0.2, 1.5)
    script = scripts(driver, "term", tmp_path / "ck")
    time.sleep(delay)
    _signal(script, signal.SIGTERM)
    code, out, err = _end(script)
    assert code == SIGTERMED, (code, err)
    assert "SIGTERM: stopping after this " + ("item" if driver == "loop" else "batch") in err
    assert "RESULT" not in out  # the process ended as SIGTERM asked, once training had ended
    (newest,) = _listed_checkpoints(out)[-1:]
    assert read_sidecar(newest)["reason"] == "interrupt"
    if driver != "loop":  # fit returned the usual way: a callback after the run's saw on_train_end
        assert "TRAIN_END" in out
    record = _ended_record("term")
    assert (record["state"], record["end_reason"]) == ("stopped", "interrupt")
    assert [ack["ids"][0].split("-")[0] for ack in record["acks"]] == ["sigterm"], record["acks"]
    position = read_sidecar(newest)
    # the step where it stopped (the record counts epochs from 1, as the panels do)
    assert (position["epoch"] + 1, position["step_in_epoch"]) == (record["epoch"], record["step"]), record


def test_a_users_sigterm_handler_is_called_after_the_checkpoint(tmp_path, scripts):
    script = scripts("fit", "mine", tmp_path / "ck", "--own-handler")
    _signal(script, signal.SIGTERM)
    code, out, err = _end(script)
    assert code == 7, err  # the user's handler decided
    lines = out.splitlines()
    assert lines.index("TRAIN_END") < lines.index("USER HANDLER")
    assert [line for line in lines if line.startswith("CHECKPOINTS ")], out
    assert read_sidecar(_listed_checkpoints(out)[-1])["reason"] == "interrupt"


def test_a_second_sigterm_ends_the_script_at_once(tmp_path, scripts):
    script = scripts("fit", "twice", tmp_path / "ck", "--batch-sleep", "5")
    _signal(script, signal.SIGTERM)
    script.wait_for_stderr("stopping after this batch")
    sent = _signal(script, signal.SIGTERM)
    code, _out, err = _end(script)
    assert code == SIGTERMED, err
    assert time.time() - sent < 4  # not after the batch's 5 s
    assert "A second SIGTERM: ending the process now." in err
    assert _ended_record("twice")["end_reason"] == "process-gone"


def test_a_stop_that_outlives_the_grace_period_ends_the_script(tmp_path, scripts):
    script = scripts("loop", "slow", tmp_path / "ck", "--batch-sleep", "30", "--sigterm-grace", "1")
    sent = _signal(script, signal.SIGTERM)
    code, _out, err = _end(script)
    assert code == 143, err
    assert time.time() - sent < 10
    assert "the stop took longer than 1 s; ending the process now (exit status 143)" in err
    assert _ended_record("slow")["end_reason"] == "process-gone"


# SIGKILL and autosave ---------------------------------------------------------------------------

AUTOSAVE_SECONDS = 2.0
#: What a kill may lose beyond the interval: the run's thread notices the
#: interval twice a second, the next boundary takes the snapshot, and the
#: writer commits it (on a loaded machine, up to a second or two).
SLACK_SECONDS = 2.5


def test_sigkill_at_random_moments_loses_at_most_the_autosave_interval_and_resumes(tmp_path, scripts):
    folder, moments = tmp_path / "ck", random.Random("sigkill").sample([5.0, 6.0, 7.0, 8.0, 9.0], 2)
    resumed_from = None
    for moment in moments:
        args = ["--autosave", str(AUTOSAVE_SECONDS)] + (["--resume"] if resumed_from is not None else [])
        script = scripts("fit", "killed", folder, *args)
        if resumed_from is not None:
            assert f"Resumed from {resumed_from}" in script.stdout, script.stdout
        time.sleep(moment)
        killed_at = _signal(script, signal.SIGKILL)
        code, _out, _err = _end(script)
        assert code == -signal.SIGKILL
        newest = _sidecars(folder)[-1]
        assert newest["reason"] == "autosave"
        assert killed_at - newest["committed"] <= AUTOSAVE_SECONDS + SLACK_SECONDS, (moment, _sidecars(folder))
        autosaves = [info for info in _sidecars(folder) if info["reason"] == "autosave"]
        assert 1 <= len(autosaves) <= AUTOSAVES_KEPT
        resumed_from = folder / newest["file"]
    script = scripts("fit", "killed", folder, "--resume", "--autosave", "0")  # the newest autosave loads
    assert f"Resumed from {resumed_from}" in script.stdout, script.stdout
    time.sleep(1)  # the scenario: it trains on from there
    _signal(script, signal.SIGTERM)
    code, out, err = _end(script)
    assert code == SIGTERMED, err
    assert read_sidecar(_listed_checkpoints(out)[-1])["global_step"] > json.loads(
        (resumed_from.with_suffix(".json")).read_text())["global_step"]


class SlowDown:
    """A Keras callback that sleeps after each batch (a step of a real size)."""

    def __new__(cls, seconds: float):
        import keras

        class _SlowDown(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                time.sleep(seconds)

        return _SlowDown()


def _reasons(control) -> list[str]:
    return [read_sidecar(path)["reason"] for path in control.checkpoints]


def test_autosave_writes_a_checkpoint_after_each_interval_of_training(make_model, tiny_data, ckpt):
    control = ControlCallback(name="auto", checkpoint_dir=ckpt, autosave=0.8, verbose=False)

    def script(control):
        wait_until(lambda: _reasons(control).count("autosave") >= 2, timeout=60, message="two autosaves")
        control.send(Command.STOP)

    drive_fit(make_model(), tiny_data, control, script, callbacks=[SlowDown(0.01)])
    reasons = _reasons(control)
    assert reasons[-1] == "stop" and reasons.count("autosave") == AUTOSAVES_KEPT, reasons
    first, second = (read_sidecar(path) for path in control.checkpoints[:2])
    assert first["global_step"] < second["global_step"]


def test_autosaves_never_push_out_the_checkpoints_the_user_asked_for(make_model, tiny_data, ckpt):
    control = ControlCallback(name="kept", checkpoint_dir=ckpt, keep=2, autosave=0.5, verbose=False)
    autosaves_written = []

    def script(control):
        for _ in range(2):
            request = control.send(Command.SAVE)
            wait_until(lambda: any(request.request_id in a["ids"] for a in control.lifecycle.record()["acks"]),
                       timeout=30, message="the save's checkpoint")
        wait_until(lambda: _autosave_count(control) >= AUTOSAVES_KEPT + 1, timeout=60, message="three autosaves")
        autosaves_written.append(_autosave_count(control))
        kept = _reasons(control)
        control.send(Command.STOP)
        assert kept.count("save") == 2, kept  # both of the user's, with keep=2
        assert kept.count("autosave") == AUTOSAVES_KEPT, kept

    drive_fit(make_model(), tiny_data, control, script, callbacks=[SlowDown(0.01)])
    assert autosaves_written[0] > AUTOSAVES_KEPT


def _autosave_count(control) -> int:
    events = control.lifecycle.record()["events"]
    return sum(event["kind"] == "checkpoint" and event["message"].startswith("autosave:") for event in events)


def test_paused_time_is_not_training_time(make_model, tiny_data, ckpt):
    control = ControlCallback(name="paused", checkpoint_dir=ckpt, autosave=1.0, verbose=False)

    def script(control):
        control.send(Command.PAUSE)
        wait_until(lambda: control.state == "paused", timeout=30, message="the pause")
        time.sleep(2.5)  # the scenario: paused for more than two intervals
        assert "autosave" not in _reasons(control)
        control.send(Command.RESUME)
        wait_until(lambda: "autosave" in _reasons(control), timeout=60, message="an autosave after the resume")
        control.send(Command.STOP)

    drive_fit(make_model(), tiny_data, control, script, callbacks=[SlowDown(0.01)])


@pytest.mark.parametrize("options, message", [
    ({"autosave": -1}, "autosave must be a number of seconds (0 turns it off), got -1."),
    ({"autosave": "10m"}, "autosave must be a number of seconds (0 turns it off), got '10m'."),
    ({"sigterm_grace": 0}, "sigterm_grace must be a number of seconds above 0, got 0."),
])
def test_bad_settings_say_what_was_given(options, message):
    with pytest.raises(ValueError) as raised:
        ControlCallback(name="bad", **options)
    assert str(raised.value) == message


def test_autosave_zero_is_off(make_model, tiny_data, ckpt):
    control = ControlCallback(name="off", checkpoint_dir=ckpt, autosave=0, verbose=False)

    def script(control):
        time.sleep(1.5)  # the scenario: longer than any interval a test uses
        control.send(Command.STOP)

    drive_fit(make_model(), tiny_data, control, script, callbacks=[SlowDown(0.01)])
    assert _reasons(control) == ["stop"]
