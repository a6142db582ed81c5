"""Jobs across processes (JAX, gloo, on 127.0.0.1): every command, sent at
random moments by every means (CLI, echo, Ctrl+C, SIGTERM), is applied by
every process at the same step, in jobs of 2 and 4 processes (68 commands,
plus 2 stops of the resume test); a lost process (SIGKILL, SIGSTOP) makes
the other end failed, its record naming it, and exit.

Each process of a job is `tests/programs/job_worker.py`; each writes its own
log of the commands it applied, with the batch boundary it applied them at,
and its final record. Jobs are reused for many commands (starting a JAX job
costs 10-30 s on these 2-core machines).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import TESTS_DIR, child_env, cli, free_port, wait_until

pytest.importorskip("jax")
pytestmark = [
    pytest.mark.timeout(420),
    pytest.mark.backends("tensorflow", reason="the job's processes run JAX themselves; one pass of the matrix is enough"),
]

WORKER = str(TESTS_DIR / "programs" / "job_worker.py")


def _child_signals() -> None:
    # Whatever the runner was started with: default Ctrl+C and SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class JobProcesses:
    """N worker processes of one job; `kill_all` ends whatever still runs."""

    def __init__(self, tmp_path: Path, n: int, name: str, *args: str):
        self.n, self.name = n, name
        self.log = tmp_path / f"{name}-{n}-{time.monotonic_ns()}.log"
        self.ckpt = tmp_path / "ck"
        port = str(free_port())
        self.processes = [
            subprocess.Popen(
                [sys.executable, WORKER, str(i), str(n), port, name, str(self.ckpt), str(self.log), *args],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=child_env(), preexec_fn=_child_signals,
            )
            for i in range(n)
        ]
        self.fifo = None
        self.stderr = [""] * n  # each process's, once it ended
        try:
            self._wait_ready()
        except BaseException:
            self.kill_all()
            raise

    def _wait_ready(self) -> None:
        for i, process in enumerate(self.processes):
            line = process.stdout.readline()
            while line and not line.startswith("READY "):  # gloo says hello on stdout
                line = process.stdout.readline()
            assert line.startswith("READY "), f"process {i} did not start: {process.stderr.read()[-3000:]}"
            if i == 0:
                self.fifo = line.split()[2]

    def events(self, i: int) -> list[dict]:
        path = Path(f"{self.log}.{i}")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def applied(self, i: int) -> list[tuple[str, int]]:
        return [(e["message"], e["boundary"]) for e in self.events(i) if e["kind"] in ("command", "state")]

    def wait(self, timeout: float, only: list[int] | None = None) -> list[int]:
        """Exit codes (None: still running after `timeout` s), of the processes `only` names, or all."""
        deadline = time.monotonic() + timeout
        codes = []
        for i in only if only is not None else range(self.n):
            process = self.processes[i]
            try:
                self.stderr[i] = process.communicate(timeout=max(0.1, deadline - time.monotonic()))[1]
            except subprocess.TimeoutExpired:
                pass
            codes.append(process.poll())
        return codes

    def kill_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.communicate()
        # Listing removes the folders (FIFOs) that killed processes left.
        from jupyter_traincontrol.distributed import JOB_REGISTRY
        from jupyter_traincontrol.registry import list_runs, registry_root

        list_runs()
        for i in range(1, self.n):
            if (registry_root() / JOB_REGISTRY / f"process-{i}").exists():
                list_runs(registry_root() / JOB_REGISTRY / f"process-{i}")


@pytest.fixture
def jobs():
    started: list[JobProcesses] = []

    def start(*args, **kwargs):
        job = JobProcesses(*args, **kwargs)
        started.append(job)
        return job

    yield start
    for job in started:
        job.kill_all()


ACK_WAIT_SECONDS = 60


def _send(job: JobProcesses, command: str, means: str) -> None:
    if means == "cli":
        # The CLI gives up after ACK_WAIT_SECONDS itself and says so: the test waits longer than it.
        result = cli("send", job.name, command, "--wait", str(ACK_WAIT_SECONDS), timeout=ACK_WAIT_SECONDS + 30)
        assert result.returncode == 0, f"{result.stderr}{_where_each_process_is(job)}"
    else:  # a shell writing to the job's FIFO
        subprocess.run(["sh", "-c", f"echo {command} > '{job.fifo}'"], check=True, timeout=10)


def _where_each_process_is(job: JobProcesses) -> str:
    """What a failed send shows: each process's exit code and last logged
    events, the job's record, and where process 0's threads were (the
    failed test's job ends here)."""
    lines = [f"process {i} (exit code {process.poll()}): {job.events(i)[-6:]}" for i, process in enumerate(job.processes)]
    listed = cli("list", "--json")
    try:  # what the record says of commands and processes, not its loss curve
        record = {key: value for key, value in json.loads(listed.stdout)[0].items() if key not in ("history", "loss_curve")}
    except (ValueError, IndexError, AttributeError):
        record = (listed.stdout or listed.stderr)[-3000:]
    return "\n".join([*lines, f"record: {record}", _threads_of_process_0(job)])


def _threads_of_process_0(job: JobProcesses) -> str:
    """Process 0's thread stacks (its worker dumps them on SIGUSR1 to its
    stderr), read once it is killed: its reader thread takes the commands."""
    process = job.processes[0]
    if process.poll() is not None:
        return "process 0 had ended"
    process.send_signal(signal.SIGUSR1)
    time.sleep(1)
    process.kill()
    job.stderr[0] = process.communicate()[1]
    return f"process 0's threads:\n{job.stderr[0][-6000:]}"


def _result(job: JobProcesses, i: int) -> dict:
    return next(e for e in job.events(i) if e["kind"] == "result")


def _final(job: JobProcesses, i: int) -> dict:
    """The final state of process `i` as its own record had it."""
    events = job.events(i)
    final = next((e for e in events if e["kind"] == "final"), None)
    assert final is not None, f"process {i} logged no final state: {events[-10:]}; stderr: {job.stderr[i][-3000:]}"
    return final


def _ended(job: JobProcesses, timeout: float) -> list[int]:
    codes = job.wait(timeout)
    assert None not in codes, f"still running after {timeout} s: {codes}"
    return codes


# The last command of each job: SIGTERM through JAX's preemption service,
# Ctrl+C on a random process, abort; and a job whose batch-end hooks all run
# on Keras's pool (every callback async-safe: each training thread runs ahead
# of the steps its devices have done, by as many as it has queued).
JOBS = [(2, 0, "sigterm", ()), (2, 1, "sigint", ()), (4, 2, "abort", ()), (2, 3, "abort", ("--async-hooks",))]
COMMANDS_PER_JOB = 16


@pytest.mark.parametrize("n, seed, last, options", JOBS)
def test_every_command_is_applied_by_every_process_at_one_step(tmp_path, jobs, runtime_dir, n, seed, last, options):
    """17 commands per job (save, pause/save/resume, then its last one), at
    random moments, by CLI or echo: 68 trials in all."""
    rng = random.Random(seed)
    job = jobs(tmp_path, n, f"job{seed}", *options)
    listed = json.loads(cli("list", "--json").stdout)
    assert [r["name"] for r in listed] == [job.name]  # listed once
    wait_until(lambda: len(json.loads(cli("list", "--json").stdout)[0].get("processes", [])) == n, timeout=30,
               message="every process in the record")
    sent = []
    while len(sent) < COMMANDS_PER_JOB:
        for command in ["save", "save", "pause", "save", "resume"][: COMMANDS_PER_JOB - len(sent)]:
            time.sleep(rng.uniform(0, 0.4))
            _send(job, command, "cli" if command != "save" or rng.random() < 0.5 else "echo")
            sent.append(command)
    record = json.loads(cli("list", "--json").stdout)[0]
    assert record["num_processes"] == n and {p["process"] for p in record["processes"]} == set(range(n))
    time.sleep(rng.uniform(0, 0.4))
    if last in ("sigint", "sigterm"):
        job.processes[rng.randrange(n)].send_signal(signal.SIGINT if last == "sigint" else signal.SIGTERM)
    else:
        _send(job, last, "echo")
    codes = _ended(job, 120)
    assert codes == [0] * n, [text[-3000:] for text in job.stderr]
    logs = [job.applied(i) for i in range(n)]
    assert all(log == logs[0] for log in logs), logs
    errors = [[e["message"] for e in job.events(i) if e["kind"] == "error"] for i in range(n)]
    assert errors == [[]] * n  # every save was the job's one checkpoint, on every process
    commands = [message.split()[0] for message, _ in logs[0] if message.endswith("received")]
    assert commands[: len(sent)] == sent
    assert commands[len(sent)] == ("abort" if last == "abort" else "stop")
    final = "aborted" if last == "abort" else "stopped"
    results = [_result(job, i) for i in range(n)]
    assert {r["state"] for r in results} == {final}
    assert all(r["sigterm_restored"] for r in results)
    # Every process ended at the same step with the same model.
    assert len({r["optimizer_step"] for r in results}) == 1


def test_a_new_job_resumes_from_the_checkpoint_of_a_job_stopped_by_sigterm(tmp_path, jobs):
    """SIGTERM on process 1 (our own handler: JAX's preemption service off)
    stops both at one step with a checkpoint; a 4-process job goes on from it."""
    first = jobs(tmp_path, 2, "resumed", "--no-preemption-service")
    first.processes[1].send_signal(signal.SIGTERM)
    assert _ended(first, 120) == [0, 0]
    results = [_result(first, i) for i in range(2)]
    assert {r["state"] for r in results} == {"stopped"} and all(r["sigterm_restored"] for r in results)
    assert len({r["optimizer_step"] for r in results}) == 1 and results[0]["checkpoints"]
    stopped_at = results[0]["optimizer_step"]
    second = jobs(tmp_path, 4, "resumed", "--resume")
    _send(second, "stop", "cli")
    assert _ended(second, 120) == [0] * 4
    results = [_result(second, i) for i in range(4)]
    assert len({r["optimizer_step"] for r in results}) == 1
    assert results[0]["optimizer_step"] > stopped_at


def _said(stderr: str | None) -> str:
    """What a job's process said on stderr about its end: the package's lines, JAX's fatal ones, the last lines."""
    lines = (stderr or "").splitlines()
    ours = [line for line in lines if line.startswith(("[job ", "[traincontrol]", "F0000", "E0000")) or "Terminating" in line]
    return "\n".join(ours[-40:] + ["... the last lines:"] + lines[-15:])


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_lost_process_makes_the_others_fail_naming_it(tmp_path, jobs, runtime_dir, how):
    """SIGKILL (its pid is gone: found at the next heartbeat) or SIGSTOP (its
    heartbeat stops: found after --lost-after 5 s) on process 1: process 0
    ends failed, its record naming process 1, and exits (code 70) instead
    of waiting for ever in a collective or in JAX's shutdown."""
    job = jobs(tmp_path, 2, f"lost-{how}")
    victim = job.processes[1]
    try:
        victim.send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        [code] = job.wait(60, only=[0])
    finally:
        if how == "hung":
            victim.kill()
    assert code == 70, (code, _said(job.stderr[0]))
    final = _final(job, 0)
    assert final["state"] == "failed" and final["lost_process"] == 1
    why = "its process (pid" if how == "killed" else "no heartbeat for"
    assert final["error"].startswith(f"Process 1 of 2 was lost: {why}"), final
    assert [p["state"] for p in final["processes"]] == ["failed", "lost"]
    # The job's last record (kept a while after its process exits) says so too.
    from jupyter_traincontrol.registry import read_tombstone

    record = read_tombstone(job.name, runtime_dir)
    assert record["state"] == "failed" and record["lost_process"] == 1, record


def test_a_command_that_reaches_the_job_after_a_peer_ended_fit_is_answered_at_once(tmp_path, jobs):
    """Process 0 still works at the end of the last epoch when a save comes;
    process 1 has ended its fit. Proposed at process 0's next boundary (after
    its work), the save is answered at once, not applied (the job cannot
    agree on it: no 60 s wait for an acknowledgement that cannot come, no
    error raised into fit), and the job ends as it trained: finished."""
    # No end checkpoint: every process takes part in it, so process 1 would not end before process 0's work.
    job = jobs(tmp_path, 2, "late", "--epochs", "2", "--batch-sleep", "0", "--end-work", "0:5", "--no-save-at-end")
    wait_until(lambda: any(e["kind"] == "end-work" for e in job.events(0)), timeout=120, message="process 0's end work")
    wait_until(lambda: any(e["kind"] == "final" for e in job.events(1)), timeout=60, message="process 1 to end fit")
    started = time.monotonic()
    result = cli("send", "late", "save", "--wait", "30", timeout=60)
    answered_in = time.monotonic() - started
    assert result.returncode == 6, (result.returncode, result.stdout, result.stderr)
    assert "not applied: process 1 of 2 has ended its training" in result.stderr
    assert answered_in < 30, answered_in  # the 5 s of work, then at once (not the 60 s agree timeout)
    assert job.wait(120) == [0, 0], [text[-3000:] for text in job.stderr]
    finals = [next(e for e in job.events(i) if e["kind"] == "final") for i in range(2)]
    assert [f["state"] for f in finals] == ["finished", "finished"], finals


def test_a_command_agreed_on_after_the_last_batch_never_counts_as_applied(tmp_path, jobs):
    """Both processes still work at the end of the last epoch when a stop
    comes: the job agrees on it for the next step, which never comes. Like a
    single run's command that came after its last batch, it is never
    answered as if it had been applied: `send --wait` says the run ended
    before applying it (exit 4), and the job ends finished."""
    job = jobs(tmp_path, 2, "last", "--epochs", "2", "--batch-sleep", "0", "--end-work", "0:2", "--end-work", "1:10")
    wait_until(lambda: any(e["kind"] == "end-work" for e in job.events(0)), timeout=120, message="process 0's end work")
    result = cli("send", "last", "stop", "--wait", "60", timeout=90)
    assert result.returncode == 4, (result.returncode, result.stdout, result.stderr)
    assert "ended (finished) before applying stop" in result.stderr
    assert job.wait(120) == [0, 0], [text[-3000:] for text in job.stderr]
    assert [next(e for e in job.events(i) if e["kind"] == "final")["state"] for i in range(2)] == ["finished"] * 2
