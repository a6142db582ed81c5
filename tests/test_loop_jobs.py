"""A `TrainLoop` across processes is one job: listed once, any command at one agreed step, a receipt.

The jobs are real: ``torchrun --nproc-per-node 2`` (the gloo backend on
CPU) runs `programs/torch_job.py`, a DDP loop whose every item is an
allreduce, so ranks that fell out of step would hang or fail, not pass;
two processes of a JAX job (``jax.distributed.initialize``) run
`programs/jax_loop_job.py`. The store a torch job agrees through is the one
``torchrun`` made; the tests of `TorchStoreClient` run against a real
``TCPStore``.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from helpers import PROGRAMS, child_env, cli, default_signals, free_port, read_sidecar, results_in, wait_until

pytestmark = pytest.mark.backends("tensorflow", reason="the jobs train torch or JAX themselves: one pass is enough")


class LaunchedJob:
    """The processes of a job, started and read; returns from the
    constructor once the first one said READY (it has trained an item).

    Args:
        commands: One command line a process (``torchrun`` is one process,
            whose ranks are its children).
    """

    def __init__(self, commands: list[list[str]]):
        self.processes = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                           env=child_env(), preexec_fn=default_signals, start_new_session=True)
                          for argv in commands]
        self.process = self.processes[0]
        self._out: list[str] = []
        self._err: list[str] = []
        self._ready = threading.Event()
        self._readers = []
        for process in self.processes:
            # Read by our threads to the end: `communicate` would read past what a line iterator buffered.
            streams = [(process.stdout, self._out, process is self.process), (process.stderr, self._err, False)]
            process.stdout = process.stderr = None
            for stream, lines, first in streams:
                reader = threading.Thread(target=self._read, args=(stream, lines, first), daemon=True)
                reader.start()
                self._readers.append(reader)
        self._ready.wait(180)
        if not hasattr(self, "name"):
            self.kill()
            raise AssertionError(f"the job ended before READY (exit code {self.process.returncode}): {self.stderr}")

    def _read(self, stream, lines: list[str], first: bool) -> None:
        for line in stream:
            lines.append(line)
            if first and line.startswith("READY ") and not self._ready.is_set():
                self.name, self.fifo = line.split()[1:3]
                self._ready.set()
        stream.close()
        if first:
            self._ready.set()  # it ended without READY

    @property
    def stdout(self) -> str:
        return "".join(self._out)

    @property
    def stderr(self) -> str:
        return "".join(self._err)

    def rank_pids(self) -> list[int]:
        """The pids of torchrun's ranks (its children), in rank order (their ``RANK``)."""
        return sorted(_children(self.process.pid), key=_rank_of)

    def finish(self, timeout: float = 90) -> tuple[int, dict[int, dict]]:
        """Waits for the end; returns (the first process's exit code, each rank's RESULT)."""
        for process in self.processes:
            process.wait(timeout)
        for reader in self._readers:
            reader.join(10)
        results = results_in(self.stdout)
        return self.process.returncode, {result["rank"]: result for result in results}

    def kill(self) -> None:
        """Ends every process (and a launcher's ranks) still running (teardown). Idempotent."""
        for process in self.processes:
            if process.poll() is None:
                ranks = _children(process.pid)  # torchrun starts each rank in a session of its own
                os.killpg(process.pid, signal.SIGKILL)
                for pid in ranks:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            process.wait()
        for reader in self._readers:
            reader.join(10)


def _children(pid: int) -> list[int]:
    """The pids of a process's children, lowest first ([] once it is gone)."""
    try:
        return sorted(int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
    except FileNotFoundError:
        return []


def _rank_of(pid: int) -> int:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    (rank,) = [int(entry[5:]) for entry in environ if entry.startswith(b"RANK=")]
    return rank


def torchrun(ranks: int, *args: str) -> list[list[str]]:
    """``torchrun --nproc-per-node RANKS programs/torch_job.py ARGS``."""
    pytest.importorskip("torch")
    return [[sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr",
             "127.0.0.1", "--master-port", str(free_port()), str(PROGRAMS / "torch_job.py"), *args]]


def jax_processes(count: int, *args: str) -> list[list[str]]:
    """`count` processes of a JAX job running `programs/jax_loop_job.py ARGS`."""
    pytest.importorskip("jax")
    port = str(free_port())
    return [[sys.executable, str(PROGRAMS / "jax_loop_job.py"), str(process), str(count), port, *args]
            for process in range(count)]


@pytest.fixture
def jobs():
    """Starts jobs (`LaunchedJob`); kills what still runs at teardown, and lists the runs (dead ones' folders go)."""
    started: list[LaunchedJob] = []

    def starting(commands) -> LaunchedJob:
        job = LaunchedJob(commands)
        started.append(job)
        return job

    yield starting
    for job in started:
        job.kill()
    from jupyter_traincontrol.distributed import JOB_REGISTRY
    from jupyter_traincontrol.registry import list_runs, registry_root

    list_runs()  # the folders of ranks that died go, as a user's listing would remove them
    for hidden in (registry_root() / JOB_REGISTRY).glob("process-*"):
        list_runs(hidden)


def _record(name: str, include_ended: bool = False) -> list[dict]:
    listed = json.loads(cli("list", "--all" if include_ended else "--json", *(["--json"] if include_ended else [])).stdout)
    return [record for record in listed if record["name"] == name]


def _paused_everywhere(processes: list[dict]) -> list[dict] | None:
    return processes if all(rank["state"] == "paused" for rank in processes) else None


def _in_step(results: dict[int, dict], ranks: int) -> dict:
    """Every rank's result, checked to have ended at one step with the same weights; returns rank 0's."""
    assert sorted(results) == list(range(ranks)), results
    first = results[0]
    for rank, result in results.items():
        for key in ("state", "trained", "epoch", "step", "weights", "checkpoints"):  # one step, one model
            assert result[key] == first[key], (rank, key, results)
    return first


def test_a_job_is_listed_once_takes_every_command_on_every_rank_at_one_step_with_a_receipt_then_resumes(tmp_path, jobs):
    folder = tmp_path / "ck"
    job = jobs(torchrun(2, "ddp", str(folder)))
    (record,) = _record("ddp")  # once, by rank 0, with the job's size
    assert (record["num_processes"], record["process"]) == (2, 0) and record["pid"] in job.rank_pids(), record

    saved = cli("send", "ddp", "save", "--wait")
    assert saved.returncode == 0, saved.stderr
    assert "checkpoint written" in saved.stdout and "on 2 of 2 ranks" in saved.stdout, saved.stdout
    steered = cli("send", "ddp", "set lr=0.02", "--wait")
    assert steered.returncode == 0 and "0.01 -> 0.02" in steered.stdout, (steered.stdout, steered.stderr)
    assert "on 2 of 2 ranks" in steered.stdout, steered.stdout
    paused = cli("send", "ddp", "pause", "--wait")
    assert paused.returncode == 0 and "on 2 of 2 ranks" in paused.stdout, (paused.stdout, paused.stderr)
    held = wait_until(lambda: _paused_everywhere(_record("ddp")[0]["processes"]), timeout=10,
                      message="every rank's heartbeat to say paused")
    time.sleep(1.5)  # every rank holds at the same item (the heartbeats say where each is)
    assert _record("ddp")[0]["processes"] == held and len({(rank["epoch"], rank["step"]) for rank in held}) == 1, held
    assert cli("send", "ddp", "resume", "--wait").returncode == 0
    rolled = cli("send", "ddp", "rollback", "--wait")  # every rank back to the save's weights, at one item
    assert rolled.returncode == 0 and "on 2 of 2 ranks" in rolled.stdout, (rolled.stdout, rolled.stderr)
    stopped = cli("send", "ddp", "stop", "--wait")
    assert stopped.returncode == 0, stopped.stderr
    assert "on 2 of 2 ranks" in stopped.stdout, stopped.stdout
    code, results = job.finish()
    assert code == 0, job.stderr
    ended = _in_step(results, 2)
    assert (ended["state"], ended["ended_by"]) == ("stopped", "stop")
    assert len(ended["checkpoints"]) == 2  # one checkpoint a command, written once for the job
    position = read_sidecar(ended["checkpoints"][-1])
    assert position["reason"] == "stop"
    assert (position["epoch"], position["step_in_epoch"]) == (ended["epoch"], ended["step"]), (position, ended)
    step_said = int(stopped.stdout.split("applied at step ")[1].split()[0])
    assert step_said == ended["trained"]  # the receipt's step: items trained, the same on every rank

    # Resume: every rank continues at the checkpoint's item, and ends as one.
    epochs = ended["epoch"] + 3
    resumed = jobs(torchrun(2, "ddp", str(folder), "--resume", "--epochs", str(epochs), "--batch-sleep", "0"))
    assert f"Resumed from {ended['checkpoints'][-1]}: epoch {ended['epoch'] + 1}" in resumed.stdout, resumed.stdout
    code, results = resumed.finish()
    assert code == 0, resumed.stderr
    again = _in_step(results, 2)
    assert again["state"] == "finished"
    assert again["trained"] == (epochs - ended["epoch"]) * 8 - ended["step"]  # the items after the checkpoint's, once

    # Another world size: one process resumes the job's newest checkpoint alone.
    alone = jobs(torchrun(1, "ddp", str(folder), "--resume", "--epochs", str(epochs + 1), "--batch-sleep", "0"))
    code, results = alone.finish()
    assert code == 0, alone.stderr
    assert (results[0]["state"], results[0]["world"], results[0]["trained"]) == ("finished", 1, 8)


def test_abort_ends_every_rank_at_one_step_without_a_checkpoint(tmp_path, jobs):
    job = jobs(torchrun(2, "abort", str(tmp_path / "ck")))
    aborted = cli("send", "abort", "abort", "--wait")
    assert aborted.returncode == 0 and "on 2 of 2 ranks" in aborted.stdout, (aborted.stdout, aborted.stderr)
    code, results = job.finish()
    assert code == 0, job.stderr
    ended = _in_step(results, 2)
    assert (ended["state"], ended["ended_by"], ended["checkpoints"]) == ("aborted", "abort", [])


def test_sigterm_on_one_rank_stops_every_rank_at_one_step_with_a_checkpoint(tmp_path, jobs):
    job = jobs(torchrun(2, "term", str(tmp_path / "ck")))
    sent = time.monotonic()
    os.kill(job.rank_pids()[1], signal.SIGTERM)  # as SLURM may signal one task only
    code, results = job.finish()
    assert code == 0, job.stderr
    assert time.monotonic() - sent < 30  # torchrun's SIGKILL comes 30 s after its SIGTERM
    ended = _in_step(results, 2)
    assert (ended["state"], ended["ended_by"]) == ("stopped", "stop")
    assert read_sidecar(ended["checkpoints"][-1])["reason"] == "interrupt"
    assert "SIGTERM: stopping the job (rank 1 of 2) at an agreed step, with a checkpoint." in job.stderr
    (record,) = _record("term", include_ended=True)
    assert (record["state"], record["end_reason"]) == ("stopped", "interrupt"), record


def test_ctrl_c_on_the_launcher_stops_every_rank_at_one_step_with_a_checkpoint(tmp_path, jobs):
    job = jobs(torchrun(2, "ctrl-c", str(tmp_path / "ck")))
    os.killpg(job.process.pid, signal.SIGINT)  # a terminal's Ctrl+C reaches torchrun and every rank
    _code, results = job.finish()  # torchrun's own exit code says it got a signal
    ended = _in_step(results, 2)
    assert (ended["state"], ended["ended_by"]) == ("stopped", "stop")
    assert read_sidecar(ended["checkpoints"][-1])["reason"] == "interrupt"


def test_a_lost_rank_ends_the_others_failed_naming_it(tmp_path, jobs):
    job = jobs(torchrun(2, "lost", str(tmp_path / "ck"), "--die", "1:30", "--lost-after", "3"))
    died = time.monotonic()
    code, results = job.finish()
    assert code != 0  # torchrun reports the rank that died
    assert time.monotonic() - died < 30, job.stderr
    assert results == {}, results  # no rank went on as if nothing happened
    (record,) = _record("lost", include_ended=True)
    assert (record["state"], record.get("lost_process")) == ("failed", 1), (record, job.stderr[-4000:])
    assert record["error"].startswith("Rank 1 of 2 was lost: its process (pid"), record["error"]


def test_a_hung_rank_ends_the_others_failed_naming_it_and_a_rank_stuck_in_a_collective_exits(tmp_path, jobs):
    job = jobs(torchrun(2, "hung", str(tmp_path / "ck"), "--lost-after", "3"))
    took = _hang_rank_one(job)
    job.finish()
    assert took < 3 + 5 + 6, took  # lost_after, then exit_grace (the program's), then a heartbeat or two
    assert "Rank 1 of 2 was lost: no heartbeat for 3 s. Its training is stuck in a collective; exiting (code 70)" \
        in job.stdout + job.stderr
    (record,) = _record("hung", include_ended=True)
    assert (record["state"], record["lost_process"]) == ("failed", 1), record


def test_a_rank_that_hangs_while_the_job_agrees_on_a_command_is_found_lost_all_the_same(tmp_path, jobs):
    """Rank 0's watcher waits for every rank's word on a proposal (here a
    ``save``); a rank that hangs meanwhile is found lost by its missing
    heartbeats, as when no command is pending, not only once the agreement
    times out (60 s): the watcher keeps its watch while it waits."""
    job = jobs(torchrun(2, "hungsave", str(tmp_path / "ck"), "--lost-after", "3"))
    # Written at once (a CLI would start slower), long before rank 1 could be found lost: it hangs before it
    # could give its word on this save.
    took = _hang_rank_one(job, then=lambda: Path(job.fifo).write_text("save\n"))
    job.finish()
    assert took < 3 + 5 + 6, took  # lost_after, then exit_grace (the program's), then a heartbeat or two
    assert "Rank 1 of 2 was lost: no heartbeat for" in job.stdout + job.stderr, job.stderr[-4000:]
    (record,) = _record("hungsave", include_ended=True)
    assert (record["state"], record.get("lost_process")) == ("failed", 1), record


def _hang_rank_one(job: LaunchedJob, then: Callable[[], object] = lambda: None) -> float:
    """Hangs rank 1 (SIGSTOP: its heartbeats stop, rank 0 waits in the next
    allreduce), does `then`, and returns how long rank 0 then took to exit;
    rank 1 is let go after, pass or fail."""
    rank0, rank1 = job.rank_pids()
    os.kill(rank1, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        then()
        wait_until(lambda: _ended(rank0), timeout=30, message="rank 0, stuck in a collective, to exit")
        return time.monotonic() - stopped
    finally:
        os.kill(rank1, signal.SIGCONT)


def _ended(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # exited, not yet reaped by torchrun
    except FileNotFoundError:
        return True


def test_a_jax_jobs_loop_applies_a_command_on_every_process_at_one_step(tmp_path, jobs):
    job = jobs(jax_processes(2, "jaxloop", str(tmp_path / "ck")))
    (record,) = _record("jaxloop")
    assert record["num_processes"] == 2, record
    saved = cli("send", "jaxloop", "save", "--wait")
    assert saved.returncode == 0 and "on 2 of 2 processes" in saved.stdout, (saved.stdout, saved.stderr)
    stopped = cli("send", "jaxloop", "stop", "--wait")
    assert stopped.returncode == 0 and "on 2 of 2 processes" in stopped.stdout, (stopped.stdout, stopped.stderr)
    code, results = job.finish()
    assert code == 0, job.stderr
    ended = _in_step(results, 2)
    assert (ended["state"], ended["ended_by"], len(ended["checkpoints"])) == ("stopped", "stop", 2)


def test_the_ddp_example_trains_as_one_job_and_resumes(tmp_path):
    """`examples/train_ddp.py`, as its docstring runs it (two short runs: the second resumes)."""
    pytest.importorskip("torch")
    example = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")
    for epochs, said in ((2, "Run 'ddp' finished."), (3, "Resumed from")):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                   "127.0.0.1", "--master-port", str(free_port()), example, "--epochs", str(epochs),
                   "--checkpoint-dir", str(tmp_path / "ck")]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=child_env(),
                              preexec_fn=default_signals)
        assert done.returncode == 0, done.stderr[-3000:]
        assert said in done.stdout and done.stdout.count(": finished") == 2, done.stdout


# The receipt, part by part ---------------------------------------------------------------------------


class DictStore:
    """A key-value client backed by a dict (the methods the job layer uses)."""

    def __init__(self):
        self.values: dict[str, str] = {}

    def key_value_set(self, key, value, allow_overwrite=False):
        self.values[key] = value

    def key_value_try_get(self, key):
        return self.values[key]

    def blocking_key_value_get(self, key, timeout_in_ms):
        if key not in self.values:
            raise TimeoutError("timed out")
        return self.values[key]

    def key_value_increment(self, key, increment):
        self.values[key] = str(int(self.values.get(key, "0")) + increment)
        return int(self.values[key])


def _receipts_of_two_ranks(ended=lambda process: False):
    from jupyter_traincontrol.job.coordination import Coordination
    from jupyter_traincontrol.job.receipts import Receipts
    from jupyter_traincontrol.protocol import parse_request

    kv = Coordination(DictStore())
    kv.begin("traincontrol/loop0")
    ranks = [Receipts(kv, rank, 2, "rank", lambda: 12, ended) for rank in (0, 1)]
    settled = []
    relays = [receipts.relay(lambda *answer: settled.append(answer)) for receipts in ranks]
    request = parse_request("save #cli-7")
    for receipts in ranks:
        receipts.agreed(request)
    return ranks, relays, request, settled


def test_process_0_answers_once_every_rank_did_naming_a_rank_that_failed():
    ranks, relays, request, settled = _receipts_of_two_ranks()
    assert relays[0](request, "applied", "checkpoint written: a.pt") is True  # held back
    ranks[0].collect()
    assert settled == []  # rank 1 has not said yet
    assert relays[1](request, "failed", "disk full") is False  # its own record answers as usual
    ranks[0].collect()
    ((_, outcome, message),) = settled
    assert (outcome, message) == ("failed", "applied on 1 of 2 ranks; rank 1 failed: disk full")


def test_a_rank_that_ended_without_answering_is_named_and_every_rank_applied_is_said_with_its_step():
    ranks, relays, request, settled = _receipts_of_two_ranks(ended=lambda process: process == 1)
    relays[0](request, "applied", "stopping")
    ranks[0].collect()
    assert settled[0][1:] == ("failed", "applied on 1 of 2 ranks; rank 1 did not say it applied it (it ended, "
                                        "or did not answer)")
    ranks, relays, request, settled = _receipts_of_two_ranks()
    relays[1](request, "applied", "stopping")
    relays[0](request, "applied", "stopping")
    ranks[0].finish(timeout=1)
    assert settled[0][1:] == ("applied", "stopping; applied at step 12 on 2 of 2 ranks")


# The store adapter, against a real TCPStore --------------------------------------------------------


@pytest.fixture(scope="module")
def store():
    """A TCPStore server (of this module: made before a test's leak check
    counts descriptors, as libuv keeps a pipe of its own for the process)."""
    pytest.importorskip("torch")
    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", free_port(), 1, is_master=True, timeout=datetime.timedelta(seconds=10))
    yield server
    del server
    gc.collect()  # the server's sockets close with it


def test_the_torch_store_client_reads_and_waits_as_the_job_layer_expects(store):
    """Set, read now, read waiting (in slices: a timeout says "timed out"), count."""
    from jupyter_traincontrol.job.coordination import Coordination, timed_out
    from jupyter_traincontrol.job.torch_store import TorchStoreClient

    kv = Coordination(TorchStoreClient(store), slice_seconds=0.05)
    kv.begin("traincontrol/fit0")
    assert kv.try_get(kv.key("name")) is None
    kv.set(kv.key("name"), "ddp")
    assert kv.try_get(kv.key("name")) == "ddp" and kv.get(kv.key("name"), 1) == "ddp"
    assert [kv.increment(kv.key("seq")) for _ in range(3)] == [1, 2, 3]
    assert kv.lists_folders is False  # heartbeats are read one key a process
    began = time.monotonic()
    with pytest.raises(TimeoutError) as raised:
        kv.get(kv.key("never"), 0.2)
    assert timed_out(raised.value) and 0.2 <= time.monotonic() - began < 2
    threading.Timer(0.2, kv.set, (kv.key("later"), "here")).start()
    assert kv.wait_for(kv.key("later"), 5, "a key set later") == "here"


def test_the_default_stores_finder_is_there_and_one_process_is_no_job():
    """`default_store` reads a private torch function (no public one exists):
    this fails the day a torch release moves it."""
    torch = pytest.importorskip("torch")
    from torch.distributed import distributed_c10d

    from jupyter_traincontrol.job import current_torch_job

    assert callable(distributed_c10d._get_default_store), torch.__version__
    assert current_torch_job() is None  # no process group here
