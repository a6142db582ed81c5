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
  processes list their own records in hidden registry folders.
- Any process that takes a command (from its FIFO, Ctrl+C, SIGTERM) proposes
  it: a sequence number from a counter, the command under ``cmd/N`` with the
  step to apply it at (the next batch boundary), then it waits for every
  process to acknowledge it. While it waits, no process can finish the next
  step (each step needs all of them), so every process sees the proposal
  before that step and applies it there (`job_channel`). The training
  thread pays two checks per batch: a watcher thread per process blocks on
  the next ``cmd/N`` key and queues what it finds.
- ``save`` is written once, by process 0 (weights are replicated); the others
  wait until process 0 says it exists (or why not): `job_stores`.
- SIGTERM (a preemption) on any process is a ``stop`` with a checkpoint, at
  an agreed step: `job_signals`.
- Each watcher writes a heartbeat every `heartbeat_seconds`; a peer whose
  process is gone, whose heartbeat stops for `lost_after` seconds, or that
  ended ``failed``, is lost (`job_liveness`): the others end ``failed``,
  their record naming it (``lost_process``), and leave the process if they
  are stuck in a collective `exit_grace` seconds later.

`ControlCallback` finds the job by itself (`current_job`) when JAX's
distributed runtime is initialized with more than one process.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .commands import Command, Request, parse_request
from .fit_watchdog import _find_fit_frame
from .job_channel import AgreedChannel
from .job_liveness import Peers, exit_when_stuck, fit_running, this_process
from .job_signals import PreemptionNotice, SigtermRelay
from .job_stores import FollowerStore, LeaderStore

__all__ = ["Job", "JobLostError", "current_job", "JOB_REGISTRY"]

logger = logging.getLogger("jupyter_traincontrol")

KEY_ROOT = "traincontrol"
#: Where the processes other than 0 list their records (hidden from `list`),
#: each in its subfolder ``process-N``.
JOB_REGISTRY = ".job-processes"
#: How long the watcher blocks on the next proposal at a time (what ending
#: a `fit` waits for it, at most).
_WATCH_SECONDS = 0.25
_fit_counter = itertools.count()


class JobLostError(RuntimeError):
    """A process of the job was lost while this one waited for it."""


def current_job(**options) -> "Job | None":
    """The job of this process, or None when it is not one of several.

    Only looks (never imports JAX): a job exists once
    ``jax.distributed.initialize`` ran with more than one process.

    Args:
        **options: `Job`'s keyword arguments (``lost_after=5``, ...).
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
    options.setdefault("preemption_service", state.preemption_sync_manager is not None)
    return Job(state.client, state.process_id, state.num_processes, **options)


class Job:
    """One process's part in a multi-process job.

    Args:
        client: The coordination service's client (``key_value_set``,
            ``blocking_key_value_get``, ``key_value_increment``,
            ``key_value_dir_get``, ``key_value_try_get``).
        process_id: This process's index.
        num_processes: How many processes the job has.
        lost_after: Seconds without a change in a peer's heartbeat (or
            without an answer from the coordination service) before the
            peer counts as lost. A peer on this host whose process is gone
            is lost at the next heartbeat. Defaults to 10.
        heartbeat_seconds: How often each process writes its heartbeat and
            reads the others'. Defaults to 1.
        agree_timeout: Seconds to wait for every process to acknowledge a
            proposal, or for process 0 to share the run's name. Defaults
            to 60.
        save_timeout: Seconds the other processes wait for process 0's
            checkpoint. Defaults to 600.
        exit_grace: Seconds a process whose peer was lost waits for its
            `fit` to come out of a collective before it exits (code 70);
            one waiting in JAX's shutdown barrier at exit exits at once.
            None never exits. Defaults to 10.
        preemption_service: True when JAX's preemption service handles
            SIGTERM (`current_job` finds out): the job then watches its
            notice instead of installing a SIGTERM handler. Defaults to
            False.
    """

    def __init__(self, client, process_id: int, num_processes: int, *, lost_after: float = 10.0,
                 heartbeat_seconds: float = 1.0, agree_timeout: float = 60.0, save_timeout: float = 600.0,
                 exit_grace: float | None = 10.0, preemption_service: bool = False):
        for name, value in (("lost_after", lost_after), ("heartbeat_seconds", heartbeat_seconds)):
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"Job's {name} must be a number of seconds above 0, got {value!r}.")
        if lost_after < 2 * heartbeat_seconds:
            raise ValueError(
                f"Job's lost_after ({lost_after!r} s) must be at least twice heartbeat_seconds ({heartbeat_seconds!r} s)."
            )
        self.client = client
        self.process_id = process_id
        self.num_processes = num_processes
        self.lost_after = lost_after
        self.heartbeat_seconds = heartbeat_seconds
        self.agree_timeout = agree_timeout
        self.save_timeout = save_timeout
        self.exit_grace = exit_grace
        self.preemption_service = preemption_service
        self.prefix: str | None = None
        self.lost: str | None = None
        self.lost_process: int | None = None
        self._watcher: threading.Thread | None = None
        self._closing = threading.Event()
        self._verdict = threading.Event()
        self._agreed: list[tuple[int, int, Request]] = []  # heap of (step, seq, request)
        self._agreed_lock = threading.Lock()
        self._saves = 0
        self._peers = Peers(process_id, num_processes, lost_after, agree_timeout)
        self._sigterm: SigtermRelay | None = None
        self._notice: PreemptionNotice | None = None
        self._lifecycle = None

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

    def wait_for(self, key: str, timeout: float, what: str) -> str:
        """The value of `key` once set, waiting up to `timeout` seconds, in
        slices: a lost process ends the wait at once.

        Raises:
            JobLostError: A process was lost meanwhile.
            TimeoutError: `key` was not set in time.
        """
        deadline = time.monotonic() + timeout
        while True:
            if self.lost:
                raise JobLostError(f"Gave up waiting for {what}: {self.lost}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"Waited {timeout:g} s for {what}.")
            try:
                return self._get(key, min(left, self.heartbeat_seconds))
            except Exception as error:
                if not _timed_out(error):
                    raise

    # The run's name, before the record is claimed --------------------------

    def begin(self, lifecycle) -> None:
        """Before the run opens: agrees on this `fit`'s keys, and on the
        run's name (the others take process 0's)."""
        # Every process calls fit in the same order, so the count agrees.
        self.prefix = f"{KEY_ROOT}/fit{next(_fit_counter)}"
        self.lost = self.lost_process = None
        self._closing = threading.Event()  # its own per fit: a late watcher never sees the next one's
        self._verdict.clear()
        self._agreed.clear()
        self._saves = 0
        self._peers = Peers(self.process_id, self.num_processes, self.lost_after, self.agree_timeout)
        if not self.leader:
            lifecycle.name = lifecycle._requested_name = self.wait_for(
                self._key("name"), self.agree_timeout, "process 0 to name the run")

    def registry(self) -> Path | None:
        """Where this process lists its record: None (the registry) for
        process 0; for the others, a hidden folder of their own (the record
        has the job's name)."""
        if self.leader:
            return None
        from .registry import registry_root

        return registry_root() / JOB_REGISTRY / f"process-{self.process_id}"

    def opened(self, lifecycle, model, on_lost: Callable[[str], None]) -> None:
        """After the run opened (training thread): shares the name, wraps
        the store, takes SIGTERM, starts the watcher thread (proposals,
        heartbeats).

        Args:
            lifecycle: The run's open `RunLifecycle`.
            model: The model being trained.
            on_lost: Ends the run ``failed`` with a message (from any thread).
        """
        if self.leader:
            self.client.key_value_set(self._key("name"), lifecycle.name)
        lifecycle.store = (LeaderStore if self.leader else FollowerStore)(lifecycle.store, self)
        self._on_lost = on_lost
        self._lifecycle = lifecycle
        lifecycle._extra_record.update(self.record())  # kept current by the watcher
        self._state_of = lambda: {"state": str(lifecycle.state), "epoch": lifecycle.epoch, "step": lifecycle.step}
        self._fit_thread_id = threading.get_ident()
        self._fit_frame = _find_fit_frame(model)
        self._beats = itertools.count()
        self._where = this_process()
        self._beat()
        if self.preemption_service:
            self._notice = PreemptionNotice(self.client) if self.leader else None
        else:
            self._sigterm = SigtermRelay(self._on_sigterm)
            self._sigterm.install()
        atexit.register(self._at_exit)
        self._watcher = threading.Thread(target=self._watch, name=f"traincontrol-job-{lifecycle.name}", daemon=True)
        self._watcher.start()

    def channel(self, local, progress) -> AgreedChannel:
        """The channel `CommandActions` reads: agreed requests, when due."""
        return AgreedChannel(self, local, progress)

    def end(self, final_state: str | None = None, error: str | None = None) -> str | None:
        """Leaves the job (idempotent; from any thread): stops the watcher,
        restores SIGTERM; the others see this process's final state in its
        last heartbeat.

        A `fit` that raised here while every peer still looked alive (a
        collective fails at once when a peer dies) first waits, at most
        `lost_after` and two heartbeats, for the watcher to find which peer
        was lost (not a `fit` still running: a second Ctrl+C ends at once).

        Returns:
            The error to record: `error`, led by the lost process if any.
        """
        if self._closing.is_set():
            return self._explain(error)
        watcher = self._watcher
        if (str(final_state) == "failed" and self.lost is None and watcher is not None and watcher.is_alive()
                and not fit_running(self._fit_thread_id, self._fit_frame)):
            self._verdict.wait(self.lost_after + 2 * self.heartbeat_seconds)
        self._closing.set()
        atexit.unregister(self._at_exit)
        if self._sigterm is not None:
            self._sigterm.retire()
            self._sigterm = None
        error = self._explain(error)
        if str(final_state) == "failed" and self._lifecycle is not None:
            # The last batch's metrics may be arrays whose collective failed
            # (reading them raises) or never ends (reading them hangs).
            self._lifecycle.metrics = _settled(self._lifecycle.metrics)
        if self.lost_process is not None and self._lifecycle is not None:
            self._lifecycle._extra_record["lost_process"] = self.lost_process
            self._lifecycle._extra_record["processes"] = self._peers.table(self.lost_process, str(final_state))
        if final_state is not None:
            final = {"state": str(final_state)}
            if error is not None:
                final["error"] = error[:2000]
            if self.lost_process is not None:
                final["lost_process"] = self.lost_process
            self._state_of = lambda: final
            try:
                self._beat()
            except Exception:  # the coordinator is gone: nobody to tell
                pass
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=self.heartbeat_seconds + _WATCH_SECONDS + 5)
        self._watcher = None
        return error

    def _explain(self, error: str | None) -> str | None:
        if self.lost is None or (error is not None and error.startswith(self.lost)):
            return error
        return self.lost if error is None else f"{self.lost} ({error})"

    def _at_exit(self) -> None:
        # Runs before the registry's own exit handler lets the record go: a
        # fit that raised and was not ended yet is ended now, with its cause.
        if not self._closing.is_set():
            self._on_lost(self.lost or "fit raised an exception; on_train_end never ran.")

    def _on_sigterm(self) -> None:
        # In a signal handler: no printing through sys.stdout.
        lifecycle = self._lifecycle
        try:
            lifecycle.send(Command.STOP)
        except Exception:
            if lifecycle.channel is not None:
                lifecycle.channel.inject(Command.STOP)
        _write_stderr(f"\n[traincontrol] SIGTERM: stopping the job ({self.describe()}) at an agreed step, with a checkpoint.\n")

    def record(self) -> dict[str, Any]:
        """This process's part of the job's record."""
        record = {"process": self.process_id, "num_processes": self.num_processes, "processes": self.processes()}
        if self.lost_process is not None:
            record["lost_process"] = self.lost_process
        return record

    def processes(self) -> list[dict[str, Any]]:
        """Each process's last published state and step (from its heartbeat)."""
        return self._peers.table(self.lost_process)

    # Proposing and applying ---------------------------------------------------

    def propose(self, request: Request, step: int) -> None:
        """Training thread: proposes `request` for `step`, waits until every
        process has it (they cannot pass `step` meanwhile).

        Raises:
            JobLostError: A process was lost meanwhile.
            RuntimeError: A process did not acknowledge in time.
        """
        seq = self.client.key_value_increment(self._key("seq"), 1)
        line = str(request) + (f" #{request.request_id}" if request.request_id else "")
        self.client.key_value_set(self._key("cmd", seq), json.dumps({"line": line, "step": step, "from": self.process_id}))
        for process in range(self.num_processes):
            try:
                self.wait_for(self._key("ack", seq, process), self.agree_timeout, f"process {process} to acknowledge {request}")
            except (TimeoutError, RuntimeError) as error:
                if isinstance(error, JobLostError):
                    raise
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
        closing = self._closing
        next_seq = 1
        last_beat = 0.0
        failing_since: float | None = None
        while not closing.is_set():
            try:
                try:
                    value = self._get(self._key("cmd", next_seq), min(_WATCH_SECONDS, self.heartbeat_seconds))
                except Exception as error:
                    if not _timed_out(error):
                        raise
                    value = None
                if value is not None:
                    proposal = json.loads(value)
                    with self._agreed_lock:
                        heapq.heappush(self._agreed, (int(proposal["step"]), next_seq, parse_request(proposal["line"])))
                    self.client.key_value_set(self._key("ack", next_seq, self.process_id), "1")
                    next_seq += 1
                if time.monotonic() - last_beat >= self.heartbeat_seconds and not closing.is_set():
                    last_beat = time.monotonic()
                    self._beat()
                    self._check_peers()
                    if self._notice is not None and self._notice.check():
                        self._lifecycle.log("info", "A process of the job got SIGTERM (JAX's preemption notice): stopping the job.")
                        self._lifecycle.send(Command.STOP)
                failing_since = None
            except Exception as error:  # the coordinator (process 0) may be gone
                if closing.is_set():
                    return
                now = time.monotonic()
                failing_since = failing_since or now
                verdict = self._peers.verdict(now, store_answers=False)
                if verdict is None and now - failing_since >= self.lost_after:
                    verdict = 0, f"the coordination service it hosts stopped answering ({_first_line(error)})"
                if verdict is not None:
                    self._lose(*verdict)
                    return
                closing.wait(0.5)
            if self.lost:
                return

    def _beat(self) -> None:
        state = getattr(self, "_state_of", None)
        self.client.key_value_set(
            self._key("beat", self.process_id),
            json.dumps({"beat": next(self._beats), **self._where, **(state() if state else {})}),
            allow_overwrite=True,
        )

    def _check_peers(self) -> None:
        now = time.monotonic()
        beats = {}
        for key, value in self.client.key_value_dir_get(self._key("beat") + "/"):
            beats[int(key.rsplit("/", 1)[1])] = json.loads(value)
        self._peers.update(beats, now)
        lifecycle = self._lifecycle
        lifecycle._extra_record["processes"] = self._peers.table()
        lifecycle.touch()
        verdict = self._peers.verdict(now)
        if verdict is not None:
            self._lose(*verdict)

    def _lose(self, process: int, why: str) -> None:
        """A peer is lost: records it, ends the run ``failed`` and, unless
        `exit_grace` is None, ends the process if it stays stuck (both on
        a thread of their own: the watcher returns at once)."""
        self.lost_process = process
        self.lost = f"Process {process} of {self.num_processes} was lost: {why}."
        logger.error("[job %s] %s", self.describe(), self.lost)
        self._verdict.set()
        threading.Thread(target=self._after_loss, name="traincontrol-job-lost", daemon=True).start()

    def _after_loss(self) -> None:
        try:
            self._on_lost(self.lost)
        finally:
            if self.exit_grace is not None:
                exit_when_stuck(self.lost, self.exit_grace, self._fit_thread_id, self._fit_frame)


def _settled(metrics: dict | None) -> dict:
    """The metrics that are plain numbers now (without waiting on any array)."""
    settled = {}
    for key, value in (metrics or {}).items():
        try:
            is_ready = getattr(value, "is_ready", None)
            if is_ready is None or is_ready():
                settled[key] = float(value)
        except Exception:
            continue
    return settled


def _timed_out(error: BaseException) -> bool:
    text = str(error)
    return "DEADLINE_EXCEEDED" in text or "imed out" in text


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _write_stderr(text: str) -> None:
    try:
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:
        pass
