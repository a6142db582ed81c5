"""The CLI: against runs in this process, and against a training script in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import TrainingProcess, child_env, cli, read_sidecar, wait_until
from jupyter_traincontrol.control.cli import main
from jupyter_traincontrol.protocol import COMMAND_HELP, Command, parse_request
from jupyter_traincontrol.run import RunLifecycle
from jupyter_traincontrol.registry import find_run, list_runs



def run_main(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_prints_a_readable_table(live_run, capsys):
    code, out, _ = run_main(capsys, "list")
    assert code == 0
    header, row = out.strip().splitlines()
    assert header.split() == ["NAME", "STATE", "EPOCH", "STEP", "LOSS", "LR", "AGE", "WHERE"]
    assert row.split()[:7] == ["alpha", "running", "3/20", "7/50", "0.2135", "-", "0s"]


def test_list_shows_the_learning_rate(live_run, capsys):
    live_run.source.tunables = {"learning_rate": 0.00012345, "beta_1": 0.9}
    live_run.source.version += 1
    live_run.publish(force=True)
    _, out, _ = run_main(capsys, "list")
    assert out.strip().splitlines()[1].split()[5] == "0.000123"


def test_send_takes_a_command_as_one_argument_or_as_words(live_run, capsys):
    assert run_main(capsys, "send", "alpha", "set lr=1e-4")[:2] == (0, "Sent set learning_rate=0.0001 to alpha.\n")
    assert run_main(capsys, "send", "alpha", "set", "lr=1e-4", "beta_1=0.8")[0] == 0
    assert run_main(capsys, "send", "alpha", "rollback", "2")[0] == 0
    first, second, third = (live_run.channel.get(5) for _ in range(3))
    assert first.args == ("learning_rate=0.0001",) and first.request_id.startswith("cli-")
    assert second.args == ("learning_rate=0.0001", "beta_1=0.8")
    assert (third.command, third.args) == (Command.ROLLBACK, ("2",))
    code, out, err = run_main(capsys, "send", "alpha", "set", "lr=fast")
    assert (code, out) == (2, "")
    assert err == "jupyter-traincontrol: error: 'set learning_rate=' takes a finite number (like 0.001 or 1e-4), got 'fast'.\n"
    assert not live_run.channel.pending


def test_list_json_has_the_documented_fields(live_run, capsys):
    code, out, _ = run_main(capsys, "list", "--json")
    (record,) = json.loads(out)
    for field in ["name", "state", "fifo", "checkpoint_dir", "checkpoints", "epoch", "step", "metrics", "pid", "started"]:
        assert field in record, field
    assert record["fifo"] == live_run.channel.address
    assert record["checkpoint_dir"] == str(live_run.store.directory)


def test_list_with_no_runs(capsys):
    assert run_main(capsys, "list") == (0, "No training runs are listed.\n", "")
    assert run_main(capsys, "list", "--json") == (0, "[]\n", "")


def test_send_delivers_through_the_fifo(live_run, capsys):
    code, out, err = run_main(capsys, "send", "alpha", "save")
    assert (code, out, err) == (0, "Sent save to alpha.\n", "")
    assert live_run.channel.get(5).command is Command.SAVE


def test_send_to_a_listening_fifo_reads_no_record(live_run, capsys, monkeypatch):
    """A live run's FIFO has a reader, its own: the send writes there by the run's name
    alone, and reads the run's record only when nothing listens (the tests below)."""
    from jupyter_traincontrol.control import client

    def no_record(name):
        raise AssertionError(f"the record of {name!r} was read")

    monkeypatch.setattr(client, "find_run", no_record)
    code, out, _ = run_main(capsys, "send", "alpha", "stop")
    assert (code, out) == (0, "Sent stop to alpha.\n")
    assert live_run.channel.get(5).command is Command.STOP
    live_run.channel.close()  # nobody reads now: the record is read, to say why
    with pytest.raises(AssertionError, match="the record of 'alpha' was read"):
        client.send("alpha", "stop")


@pytest.mark.parametrize(
    "argv, code, message",
    [
        (["send", "alpha", "frobnicate"], 2, "Unknown command 'frobnicate'. Expected one of: stop, save, abort, pause, resume, set, rollback."),
        (["send", "nobody", "stop"], 3, "No run named 'nobody'. Runs listed: alpha."),
        (["send", "save"], 2, "send save: the run's name is missing; expected `jupyter-traincontrol send NAME save` "
                              "(`jupyter-traincontrol list` shows the names)."),
        (["send", "alpha"], 2, "send alpha: the command is missing; expected one of: stop, save, abort, pause, "
                               "resume, set, rollback."),
    ],
)
def test_send_errors_are_one_line_with_distinct_exit_codes(live_run, capsys, argv, code, message):
    got_code, out, err = run_main(capsys, *argv)
    assert got_code == code
    assert err == f"jupyter-traincontrol: error: {message}\n"
    assert out == ""
    assert not live_run.channel.pending


def test_send_to_an_ended_run_says_it_no_longer_listens(tmp_path, capsys):
    control = RunLifecycle("done", tmp_path / "ck").open()
    control.close("finished")
    code, _, err = run_main(capsys, "send", "done", "stop")
    assert code == 4
    assert err == "jupyter-traincontrol: error: Run 'done' has ended (finished); it takes no more commands.\n"


def test_send_never_hangs_when_nobody_reads(live_run, capsys):
    """A record that still says running, but whose FIFO has no reader."""
    live_run.channel.close()  # the reader is gone, the record is stale
    started = time.monotonic()
    code, _, err = run_main(capsys, "send", "alpha", "stop")
    assert code == 4 and "not listening" in err
    assert time.monotonic() - started < 2


def test_help_on_each_verb():
    for argv in (["--help"], ["list", "--help"], ["send", "--help"]):
        result = cli(*argv)
        assert result.returncode == 0, result.stderr
        assert "usage: jupyter-traincontrol" in result.stdout
    help_text = cli("send", "--help").stdout
    for command, text in COMMAND_HELP.items():  # the vocabulary's one help table
        assert f"{command.value:<9} {text}" in " ".join(help_text.split("\n        "))  # argparse may wrap


def test_jupyter_traincontrol_subcommand_works():
    exe = subprocess.run([sys.executable, "-m", "jupyter", "traincontrol", "--help"], capture_output=True, text=True, env=child_env())
    assert exe.returncode == 0, exe.stderr
    assert "list" in exe.stdout and "send" in exe.stdout


def test_the_cli_does_not_import_keras_or_tensorflow():
    code = "import sys, jupyter_traincontrol.control.cli; sys.exit(bool({'keras', 'tensorflow'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], env=child_env()).returncode == 0


def test_cli_stops_a_training_script(tmp_path):
    training = TrainingProcess("--name", "script", "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "200")
    listed = json.loads(cli("list", "--json").stdout)
    assert [r["name"] for r in listed] == ["script"] and listed[0]["state"] == "running"
    assert listed[0]["pid"] == training.process.pid
    saved = cli("send", "script", "save", "--wait", "30")
    assert saved.returncode == 0, saved.stderr
    assert "checkpoint written" in saved.stdout
    assert len(json.loads(cli("list", "--json").stdout)[0]["checkpoints"]) == 1
    stopped = cli("send", "script", "stop")
    assert stopped.returncode == 0, stopped.stderr
    code, result, err = training.finish()
    assert code == 0, err
    assert result["state"] == "stopped"
    assert len(result["checkpoints"]) == 2
    assert read_sidecar(result["checkpoints"][-1])["reason"] == "stop"
    # The process is gone: its record goes with it.
    assert json.loads(cli("list", "--json").stdout) == []
    assert cli("send", "script", "stop").returncode == 3


def test_cli_steers_a_training_script(tmp_path):
    training = TrainingProcess("--name", "steer", "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "200")
    changed = cli("send", "steer", "set", "lr=1e-4", "--wait", "30")
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout.startswith("Sent set learning_rate=0.0001 to steer: learning_rate 0.01 -> 0.0001")
    refused = cli("send", "steer", "set momentum=0.9", "--wait", "30")
    assert refused.returncode == 6
    assert "Cannot set momentum: not an optimizer hyperparameter Adam has. Can set: learning_rate (lr)" in refused.stderr
    assert cli("send", "steer", "rollback", "--wait", "30").returncode == 6  # no checkpoint yet
    assert cli("send", "steer", "save", "--wait", "30").returncode == 0
    rolled = cli("send", "steer", "rollback", "--wait", "30")
    assert rolled.returncode == 0, rolled.stderr
    assert "rolled back to ckpt-000001-" in rolled.stdout
    assert "0.0001" in cli("list").stdout.splitlines()[1].split()
    record = json.loads(cli("list", "--json").stdout)[0]
    assert [c["name"] for c in record["changes"]] == ["learning_rate", "rollbacks"]
    assert record["changes"][0]["by"].startswith("'set learning_rate=0.0001' #cli-")
    assert cli("send", "steer", "stop").returncode == 0
    code, result, err = training.finish()
    assert code == 0, err
    assert read_sidecar(result["checkpoints"][-1])["tunables"] == {"learning_rate": 0.0001}


def test_echo_into_the_fifo_stops_a_training_script(tmp_path):
    training = TrainingProcess("--name", "echo", "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "200")
    subprocess.run(["sh", "-c", f"echo stop > '{training.fifo}'"], check=True, timeout=10)
    code, result, err = training.finish()
    assert code == 0, err
    assert result["state"] == "stopped" and len(result["checkpoints"]) == 1


def test_first_ctrl_c_stops_with_a_checkpoint(tmp_path):
    training = TrainingProcess("--name", "sig", "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "200")
    training.process.send_signal(signal.SIGINT)
    code, result, err = training.finish()
    assert code == 0, err
    assert result["state"] == "stopped"
    assert read_sidecar(result["checkpoints"][-1])["reason"] == "interrupt"
    assert "Ctrl+C: stopping after this batch" in err


def test_second_ctrl_c_raises_keyboard_interrupt(tmp_path):
    # A slow batch keeps the run inside fit between the two presses.
    training = TrainingProcess("--name", "sig2", "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "200", "--batch-sleep", "1.0")
    training.process.send_signal(signal.SIGINT)
    training.wait_for_stderr("Ctrl+C: stopping after this batch")  # the first press was handled
    training.process.send_signal(signal.SIGINT)
    code, result, err = training.finish()
    assert code != 0 and result is None, err
    assert "KeyboardInterrupt" in err


def test_resume_continues_after_a_stopped_script(tmp_path):
    ckpt = str(tmp_path / "ck")
    first = TrainingProcess("--name", "part1", "--checkpoint-dir", ckpt, "--epochs", "6", "--batch-sleep", "0.05")
    wait_until(lambda: (find_run("part1").get("epoch") or 0) >= 2, timeout=60, message="epoch 2")
    assert cli("send", "part1", "stop").returncode == 0
    code, stopped, err = first.finish()
    assert code == 0, err
    info = read_sidecar(stopped["checkpoints"][-1])
    # A run resumes the checkpoints of its own name (the checkpoint-store issue).
    second = TrainingProcess("--name", "part1", "--checkpoint-dir", ckpt, "--epochs", "6", "--batch-sleep", "0", "--resume")
    code, resumed, err = second.finish()
    assert code == 0, err
    assert resumed["state"] == "finished"
    assert resumed["epochs"][0] == info["resume_epoch"]
    assert resumed["optimizer_step"] == 6 * 14  # 448 training samples / 32 = 14 batches an epoch
    assert list_runs() == []


def test_help_shows_plain_text_not_rst_markup():
    for argv in (["--help"], ["send", "--help"], ["list", "--help"]):
        text = cli(*argv).stdout
        assert "``" not in text, argv
    assert "a save that could not be written, a set this optimizer refuses" in " ".join(cli("--help").stdout.split())


def test_a_wait_on_a_run_that_has_not_called_fit_says_why(tmp_path, capsys):
    starting = RunLifecycle("early", tmp_path / "ck").open()  # a notebook run whose cell loads its data first
    try:
        code, out, err = run_main(capsys, "send", "early", "stop", "--wait", "0.3")
    finally:
        starting.close("aborted")
    assert (code, out) == (7, "")
    assert err.startswith("jupyter-traincontrol: error: Sent stop to run 'early', but it did not acknowledge it "
                          "within 0.3 s: the run is starting: its code has not called fit yet")


def test_list_all_keeps_ended_runs_with_how_they_ended_after_their_process_is_gone(tmp_path):
    finished = TrainingProcess("--name", "done", "--checkpoint-dir", str(tmp_path / "a"), "--epochs", "2",
                               "--batch-sleep", "0")
    code, result, err = finished.finish()
    assert code == 0 and result["state"] == "finished", err
    killed = TrainingProcess("--name", "killed", "--checkpoint-dir", str(tmp_path / "b"), "--epochs", "200")
    assert cli("send", "killed", "save", "--wait", "30").returncode == 0
    killed.process.kill()
    killed.finish()

    assert cli("list").stdout == "No training runs are listed.\n"  # plain `list`: live runs only, as before
    listed = json.loads(cli("list", "--all", "--json").stdout)  # each `cli` is a fresh process
    assert [(r["name"], r["state"], r["end_reason"], r["live"]) for r in listed] == [
        ("done", "finished", "finished", False), ("killed", "running", "process-gone", False)]
    done, gone = listed
    assert [read_sidecar(path)["reason"] for path in done["checkpoints"]] == ["end"]
    assert len(gone["checkpoints"]) == 1 and gone["fifo"] is None and gone["commands"] == []
    header, *rows = cli("list", "--all").stdout.strip().splitlines()
    assert header.split() == ["NAME", "STATE", "EPOCH", "STEP", "LOSS", "LR", "AGE", "ENDED", "WHERE"]
    assert "finished, " in rows[0] and " ago" in rows[0] and f"(pid {finished.process.pid}, gone)" in rows[0]
    assert "process-gone, " in rows[1] and rows[1].split()[1] == "gone"  # not "running": its process died
    newest = gone["checkpoints"][-1].rsplit("/", 1)[-1]
    assert rows[2:] == [f"killed: its process is gone. Its newest checkpoint is {newest}: continue from it with "
                        "resume=True (run killed)."]
    sent = cli("send", "done", "stop")  # an ended run takes no commands, and the error says how it ended
    assert sent.returncode == 3 and "The last run named 'done' has ended (state finished, end reason finished)" in sent.stderr


def test_an_ended_run_is_gone_only_once_its_process_is():
    """``list --all``: an ended run of a kernel that lives on is not "gone"."""
    from jupyter_traincontrol.control.cli import format_table

    ended = {"name": "kept", "state": "finished", "end_reason": "finished", "live": False, "origin": "notebook"}
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    rows = format_table([{**ended, "pid": os.getpid()}, {**ended, "pid": int(dead.stdout)}], ended=True).splitlines()
    assert rows[1].endswith(f"notebook (pid {os.getpid()})")
    assert rows[2].endswith(f"notebook (pid {int(dead.stdout)}, gone)")


def test_send_wait_finds_its_answer_after_many_other_answers_at_one_boundary(live_run):
    """A waited command answered among 60 others with answers of their own
    (more than the record's newest 50): its sender still finds it, and the
    record stays bounded however many waited answers pile up."""
    from jupyter_traincontrol.control.client import send, wait_for_ack
    from jupyter_traincontrol.run.journal import ACKS_KEPT, WAITED_ACKS_KEPT

    waited = send("alpha", "set momentum=0.5", sender="cli", waited=True)
    live_run.journal.acknowledge(live_run.channel.get(5), "applied", "momentum 0.9 -> 0.5")
    for index in range(60):
        live_run.journal.acknowledge(parse_request(f"set beta_1=0.{index + 1} #o{index}"), "applied", f"beta_1 -> {index}")
    live_run.publish(force=True)
    assert wait_for_ack("alpha", waited, timeout=5)["message"] == "momentum 0.9 -> 0.5"  # was: exit 4, "ended"
    for index in range(3 * WAITED_ACKS_KEPT):
        live_run.journal.acknowledge(parse_request(f"save #cli-w{index:012x}"), "applied", f"checkpoint {index}")
    assert len(live_run.journal.as_record()["acks"]) <= ACKS_KEPT + WAITED_ACKS_KEPT


def test_a_burst_of_answers_keeps_the_record_small_and_send_wait_finds_its_own(live_run, capsys):
    """10,000 identical answers are one entry of bounded size in the record,
    and a ``send --wait`` among them still finds its id there."""
    from jupyter_traincontrol.control.client import send, wait_for_ack

    waited = []
    for index in range(10_000):
        if index in (17, 5_000, 9_998):  # a waiting sender's request, answered in the middle of the burst
            waited.append(send("alpha", "save", sender="cli", waited=True))
            request = live_run.channel.get(5)
        else:
            request = parse_request(f"save #s{index}")
        live_run.journal.acknowledge(request, "applied", "checkpoint written: ck-1.keras")
    live_run.publish(force=True)
    record = find_run("alpha")
    (entry,) = record["acks"]
    assert entry["count"] == 10_000 and entry["ids"][-1] == "s9999"
    assert len(json.dumps(record["acks"])) < 2_000  # was 147 KB
    for request in waited:
        assert wait_for_ack("alpha", request, timeout=5)["outcome"] == "applied"
    journal = live_run.journal  # in memory: the newest ids (4096) and every waited one
    assert journal.acks_of("s9000")["count"] == 10_000 and journal.acks_of("s20") is None
    assert journal.acks_of(waited[0].request_id) is not None
    code, out, _ = run_main(capsys, "send", "alpha", "save", "--wait", "0.2")
    assert code == 7 and live_run.channel.get(5).request_id.startswith("cli-w")  # --wait marks its id
