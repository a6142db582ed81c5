"""Jobs across processes: one command, applied by every process at one agreed step.

Keras 3 scales out with JAX: every process of a job runs the same `fit`
(``jax.distributed.initialize``, then ``keras.distribution.DataParallel``),
and every training step is a collective. A command taken by one process at
its own batch would leave the others inside a collective that never
completes. `Job` makes the processes agree, through the JAX coordination
service's key-value store (the way TensorFlow's `PreemptionCheckpointHandler`
agrees on a preemption step):

- Process 0 owns the run's registry entry and FIFO: the job is listed once,
  with a ``processes`` section (each process's state and step). The other
  processes list their own records in a hidden registry folder.
- Any process that takes a command (from its FIFO, Ctrl+C, SIGTERM) proposes
  it: a sequence number from a counter, the command under ``cmd/N`` with the
  step to apply it at (the next batch boundary), then it waits for every
  process to acknowledge it. While it waits, no process can finish the next
  step (each step needs all of them), so every process sees the proposal
  before that step and applies it there. The training thread pays nothing
  per batch: a watcher thread per process blocks on the next ``cmd/N`` key
  and queues what it finds.
- ``save`` is written once, by process 0 (weights are replicated); the others
  wait until process 0 says it exists (or why not).
- Each watcher writes a heartbeat every `heartbeat_seconds`; a process whose
  heartbeat stops for `lost_after` seconds (or a coordinator that stops
  answering) is lost: the others end ``failed``, saying which, and leave the
  process if their `fit` is still stuck in a collective after `exit_grace`.

`ControlCallback` finds the job by itself (`current_job`) when JAX's
distributed runtime is initialized with more than one process.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .checkpoint import CheckpointError
from .commands import Request, parse_request
from .fit_watchdog import FitWatchdog

__all__ = ["Job", "current_job", "JOB_REGISTRY"]

logger = logging.getLogger("jupyter_traincontrol")

KEY_ROOT = "traincontrol"
#: Where the processes other than 0 list their records (hidden from `list`).
JOB_REGISTRY = ".job-processes"
_WATCH_SECONDS = 1.0
_HOLD_POLL_SECONDS = 0.05
_fit_counter = itertools.count()


def current_job(**options) -> "Job | None":
    """The job of this process, or None when it is not one of several.

    Only looks (never imports JAX): a job exists once
    ``jax.distributed.initialize`` ran with more than one process.
    """
    if "jax" not in sys.modules:
        return None
    try:
        from jax._src import distributed
    except ImportError:
        return None
    state = distributed.global_state
    if state.client is None or (state.num_processes or 1) <= 1:
        return None
    return Job(state.client, state.process_id, state.num_processes, **options)


class Job:
    """One process's part in a multi-process job.

    Args:
        client: The coordination service's client (``key_value_set``,
            ``blocking_key_value_get``, ``key_value_increment``,
            ``key_value_dir_get``).
        process_id: This process's index.
        num_processes: How many processes the job has.
        lost_after: Seconds without a peer's heartbeat before it counts as
            lost. Defaults to 20.
        heartbeat_seconds: How often each process writes its heartbeat.
            Defaults to 1.
        agree_timeout: Seconds to wait for every process to acknowledge a
            proposal, or for process 0 to share the run's name. Defaults
            to 60.
        save_timeout: Seconds the other processes wait for process 0's
            checkpoint. Defaults to 600.
        exit_grace: Seconds a process whose peer was lost waits for its
            `fit` to return before it exits (code 70). None never exits.
            Defaults to 10.
    """

    def __init__(self, client, process_id: int, num_processes: int, *, lost_after: float = 20.0,
                 heartbeat_seconds: float = 1.0, agree_timeout: float = 60.0, save_timeout: float = 600.0,
                 exit_grace: float | None = 10.0):
        self.client = client
        self.process_id = process_id
        self.num_processes = num_processes
        self.lost_after = lost_after
        self.heartbeat_seconds = heartbeat_seconds
        self.agree_timeout = agree_timeout
        self.save_timeout = save_timeout
        self.exit_grace = exit_grace
        self.prefix: str | None = None
        self.lost: str | None = None
        self._watcher: threading.Thread | None = None
        self._closing = threading.Event()
        self._agreed: list[tuple[int, int, Request]] = []  # heap of (step, seq, request)
        self._agreed_lock = threading.Lock()
        self._saves = 0
        self._peers: dict[int, dict[str, Any]] = {}

    @property
    def leader(self) -> bool:
        """True in process 0, which owns the run's record, FIFO and checkpoints."""
        return self.process_id == 0

    def describe(self) -> str:
        return f"process {self.process_id} of {self.num_processes}"

    # Keys ------------------------------------------------------------------

    def _key(self, *parts: Any) -> str:
        return "/".join([self.prefix, *map(str, parts)])

    def _get(self, key: str, timeout: float) -> str:
        return self.client.blocking_key_value_get(key, int(timeout * 1000))

    # The run's name, before the record is claimed --------------------------

    def begin(self, lifecycle) -> None:
        """Before the run opens: agrees on this `fit`'s keys, and on the
        run's name (the others take process 0's)."""
        # Every process calls fit in the same order, so the count agrees.
        self.prefix = f"{KEY_ROOT}/fit{next(_fit_counter)}"
        self.lost = None
        self._closing.clear()
        self._agreed.clear()
        self._saves = 0
        if not self.leader:
            lifecycle.name = lifecycle._requested_name = self._get(self._key("name"), self.agree_timeout)

    def registry(self) -> Path | None:
        """Where this process lists its record: None (the registry) for
        process 0, a hidden folder of it for the others."""
        if self.leader:
            return None
        from .registry import registry_root

        return registry_root() / JOB_REGISTRY

    def opened(self, lifecycle, model, on_lost: Callable[[str], None]) -> None:
        """After the run opened: shares the name, wraps the store, starts
        the watcher thread (proposals, heartbeats)."""
        if self.leader:
            self.client.key_value_set(self._key("name"), lifecycle.name)
        lifecycle.store = (LeaderStore if self.leader else FollowerStore)(lifecycle.store, self)
        self._on_lost = on_lost
        self._lifecycle = lifecycle
        lifecycle._extra_record.update(self.record())  # kept current by the watcher
        self._state_of = lambda: {"state": str(lifecycle.state), "epoch": lifecycle.epoch, "step": lifecycle.step}
        self._fit_watchdog = FitWatchdog(model, lambda: None)
        self._beats = itertools.count()
        self._beat()
        self._watcher = threading.Thread(target=self._watch, name=f"traincontrol-job-{lifecycle.name}", daemon=True)
        self._watcher.start()

    def channel(self, local, progress) -> "AgreedChannel":
        """The channel `CommandActions` reads: agreed requests, when due."""
        return AgreedChannel(self, local, progress)

    def end(self, final_state: str | None = None) -> None:
        """Stops the watcher (idempotent; from any thread); the others see
        this process's final state in its last heartbeat."""
        if self._closing.is_set():
            return
        self._closing.set()
        if final_state is not None:
            self._state_of = lambda: {"state": str(final_state)}
            try:
                self._beat()
            except Exception:  # the coordinator is gone: nobody to tell
                pass
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=self.heartbeat_seconds + _WATCH_SECONDS + 5)
        self._watcher = None

    def record(self) -> dict[str, Any]:
        """This process's part of the job's record."""
        return {"process": self.process_id, "num_processes": self.num_processes, "processes": self.processes()}

    def processes(self) -> list[dict[str, Any]]:
        """Each process's last published state and step (from its heartbeat)."""
        return [dict(self._peers.get(p, {"process": p, "state": "unknown"})) for p in range(self.num_processes)]

    # Proposing and applying ---------------------------------------------------

    def propose(self, request: Request, step: int) -> None:
        """Training thread: proposes `request` for `step`, waits until every
        process has it (they cannot pass `step` meanwhile)."""
        seq = self.client.key_value_increment(self._key("seq"), 1)
        line = str(request) + (f" #{request.request_id}" if request.request_id else "")
        self.client.key_value_set(self._key("cmd", seq), json.dumps({"line": line, "step": step, "from": self.process_id}))
        for process in range(self.num_processes):
            try:
                self._get(self._key("ack", seq, process), self.agree_timeout)
            except Exception as error:
                raise RuntimeError(
                    f"Process {process} of {self.num_processes} did not acknowledge {request} "
                    f"within {self.agree_timeout:g} s: {_first_line(error)}"
                ) from None

    def due(self, boundary: int) -> bool:
        agreed = self._agreed
        return bool(agreed) and agreed[0][0] <= boundary

    def pop_due(self, boundary: int) -> Request | None:
        with self._agreed_lock:
            if self._agreed and self._agreed[0][0] <= boundary:
                return heapq.heappop(self._agreed)[2]
        return None

    def undelivered(self) -> list[Request]:
        """Agreed requests whose step never came (the `fit` ended first)."""
        with self._agreed_lock:
            left, self._agreed = [entry[2] for entry in sorted(self._agreed)], []
        return left

    # The watcher thread ------------------------------------------------------

    def _watch(self) -> None:
        next_seq = 1
        last_beat = 0.0
        failing_since: float | None = None
        while not self._closing.is_set():
            try:
                try:
                    value = self._get(self._key("cmd", next_seq), min(_WATCH_SECONDS, self.heartbeat_seconds))
                except Exception as error:
                    if "DEADLINE_EXCEEDED" not in str(error) and "imed out" not in str(error):
                        raise
                    value = None
                if value is not None:
                    proposal = json.loads(value)
                    with self._agreed_lock:
                        heapq.heappush(self._agreed, (int(proposal["step"]), next_seq, parse_request(proposal["line"])))
                    self.client.key_value_set(self._key("ack", next_seq, self.process_id), "1")
                    next_seq += 1
                if time.monotonic() - last_beat >= self.heartbeat_seconds:
                    last_beat = time.monotonic()
                    self._beat()
                    self._check_peers()
                failing_since = None
            except Exception as error:  # the coordinator (process 0) may be gone
                if self._closing.is_set():
                    return
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since >= self.lost_after:
                    self._lose(0, f"the coordination service stopped answering ({_first_line(error)})")
                    return
                self._closing.wait(0.5)
            if self.lost:
                return

    def _beat(self) -> None:
        state = getattr(self, "_state_of", None)
        self.client.key_value_set(
            self._key("beat", self.process_id),
            json.dumps({"beat": next(self._beats), **(state() if state else {})}),
            allow_overwrite=True,
        )

    def _check_peers(self) -> None:
        now = time.monotonic()
        for key, value in self.client.key_value_dir_get(self._key("beat") + "/"):
            process = int(key.rsplit("/", 1)[1])
            info = json.loads(value)
            seen = self._peers.get(process)
            if seen is None or seen.get("beat") != info.get("beat"):
                self._peers[process] = {"process": process, **info, "_seen": now}
        lifecycle = self._lifecycle
        lifecycle._extra_record["processes"] = [
            {key: value for key, value in entry.items() if not key.startswith("_")} for entry in self.processes()
        ]
        lifecycle.touch()
        for process in range(self.num_processes):
            seen = self._peers.get(process)
            since = seen["_seen"] if seen else None
            if since is not None and now - since >= self.lost_after and seen.get("state") not in _ENDED:
                self._lose(process, f"no heartbeat for {now - since:.0f} s")
                return

    def _lose(self, process: int, why: str) -> None:
        self.lost = f"Process {process} of {self.num_processes} was lost: {why}."
        logger.error("[job %s] %s", self.describe(), self.lost)
        try:
            self._on_lost(self.lost)
        finally:
            if self.exit_grace is not None:
                threading.Thread(target=self._exit_if_stuck, name="traincontrol-job-exit", daemon=True).start()

    def _exit_if_stuck(self) -> None:
        deadline = time.monotonic() + self.exit_grace
        watchdog = self._fit_watchdog
        gone = []
        watchdog._on_lost = lambda: gone.append(True)
        while time.monotonic() < deadline:
            watchdog.check()
            if gone:
                return
            time.sleep(0.1)
        try:
            os.write(2, f"\n[traincontrol] {self.lost} fit is stuck in a collective; exiting (code 70).\n".encode())
        finally:
            os._exit(70)


_ENDED = {"stopped", "aborted", "finished", "failed"}


class AgreedChannel:
    """What `CommandActions` reads in a job: the requests every process
    agreed on, each once its step has come. Requests that arrive locally
    (FIFO, Ctrl+C) are proposed first. Cheap per batch: two checks."""

    def __init__(self, job: Job, local, progress):
        self.job = job
        self.local = local
        self.progress = progress
        self._holding = False

    @property
    def kind(self) -> str:
        return self.local.kind

    @property
    def address(self) -> str:
        return self.local.address

    @property
    def pending(self) -> bool:
        if self.local.pending:
            self._propose_local()
        return self.job.due(self.progress.boundary)

    def _propose_local(self) -> None:
        # Held, every process waits at this very boundary: apply it here.
        step = self.progress.boundary + (0 if self._holding else 1)
        while (request := self.local.pop()) is not None:
            self.job.propose(request, step)

    def pop(self) -> Request | None:
        return self.job.pop_due(self.progress.boundary)

    def get(self, timeout: float | None) -> Request | None:
        """While paused: proposes what arrives, returns what is due."""
        self._holding = True
        try:
            deadline = time.monotonic() + (timeout or 0)
            while True:
                if self.local.pending:
                    self._propose_local()
                request = self.pop()
                if request is not None or self.job.lost or time.monotonic() >= deadline:
                    return request
                time.sleep(_HOLD_POLL_SECONDS)
        finally:
            self._holding = False


class LeaderStore:
    """Process 0's checkpoint store: saves as usual, then tells the others
    what it wrote (or why it could not)."""

    def __init__(self, store, job: Job):
        self._store = store
        self._job = job

    def __getattr__(self, name):
        return getattr(self._store, name)

    def save(self, *args, **kwargs):
        job = self._job
        job._saves += 1
        key = job._key("saved", job._saves)
        try:
            checkpoint = self._store.save(*args, **kwargs)
        except CheckpointError as error:
            job.client.key_value_set(key, json.dumps({"error": str(error)}))
            raise
        job.client.key_value_set(key, json.dumps({"path": str(checkpoint.path)}))
        return checkpoint


class FollowerStore:
    """The store of a process other than 0: reads the job's checkpoints
    (resume), never writes or locks them; a save waits for process 0's."""

    def __init__(self, store, job: Job):
        self._store = store
        self._job = job

    def __getattr__(self, name):
        return getattr(self._store, name)

    def acquire(self):
        return self

    def release(self) -> None:
        pass

    @property
    def held(self) -> bool:
        return False

    def save(self, model, *args, **kwargs):
        job = self._job
        job._saves += 1
        # Serializing the model's global arrays takes collectives: run the
        # same `model.save` as process 0 (into a scratch file), in step with it.
        with tempfile.TemporaryDirectory(prefix="traincontrol-follower-") as scratch:
            model.save(os.path.join(scratch, "model.keras"))
        try:
            said = json.loads(job._get(job._key("saved", job._saves), job.save_timeout))
        except Exception as error:
            raise CheckpointError(f"Process 0 did not write the job's checkpoint within {job.save_timeout:g} s: {_first_line(error)}") from None
        if "error" in said:
            raise CheckpointError(f"Process 0 could not write the job's checkpoint: {said['error']}")
        for checkpoint in self._store.list():
            if str(checkpoint.path) == said["path"]:
                return checkpoint
        raise CheckpointError(f"Process 0 wrote {said['path']}, but it is not readable here (is the folder shared?).")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
