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
  it to all; every process applies it at the same batch boundary
  (`agreement`). The training thread pays two checks per batch: a watcher
  thread per process blocks on the next proposal and queues what it finds.
- ``save`` is written once, by process 0 (weights are replicated); the others
  wait until process 0 says it exists (or why not): `checkpoints`.
- SIGTERM (a preemption) on any process is a ``stop`` with a checkpoint, at
  an agreed step: `signals`.
- Each watcher writes a heartbeat every `heartbeat_seconds`; a peer whose
  process is gone, whose heartbeat stops for `lost_after` seconds, or that
  ended ``failed``, is lost (`liveness`): the others end ``failed``,
  their record naming it (``lost_process``), and leave the process if they
  are stuck in a collective `exit_grace` seconds later.

The parts run one way: `Job` composes them, each works through
`coordination` only. The job sees the run through `JobRun` (a few members
of a `run.RunLifecycle`), so it imports neither the run nor `fit`.

`ControlCallback` finds the job by itself (`current_job`) when JAX's
distributed runtime is initialized with more than one process.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..protocol import Command, Request
from ..registry import registry_root
from ..system.frames import on_stack
from ..system.signals import write_stderr
from .agreement import AgreedChannel, Agreement
from .checkpoints import FollowerStore, LeaderStore
from .coordination import KEY_ROOT, Coordination, JobLostError, first_line
from .liveness import Heartbeat, Peers, exit_when_stuck
from .port import JobRun
from .receipts import Receipts
from .signals import PreemptionNotice, SigtermRelay

__all__ = ["Job", "JobLostError", "JOB_REGISTRY"]

logger = logging.getLogger("jupyter_traincontrol")

#: Where the processes other than 0 list their records (hidden from `list`),
#: each in its subfolder ``process-N``.
JOB_REGISTRY = ".job-processes"
#: How long the watcher blocks on the next proposal at a time (ending a
#: `fit` wakes it at once with an end marker; without the coordinator, the
#: most that ending waits for it).
_WATCH_SECONDS = 0.1
#: How long process 0, as its run ends, waits for the other processes' answers to a command.
_RECEIPT_WAIT_SECONDS = 10.0
_fit_counter = itertools.count()


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
        unit: What a process is called in messages and receipts
            (``rank`` in a torch job). Defaults to ``process``.
    """

    def __init__(self, client, process_id: int, num_processes: int, *, lost_after: float = 10.0,
                 heartbeat_seconds: float = 1.0, agree_timeout: float = 60.0, save_timeout: float = 600.0,
                 exit_grace: float | None = 10.0, preemption_service: bool = False, unit: str = "process"):
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
        self.unit = unit
        self.kv = Coordination(client, heartbeat_seconds)
        self.agreement = self._new_agreement()
        self._receipts: Receipts | None = None
        self.lost_process: int | None = None
        self._watcher: threading.Thread | None = None
        self._closing = threading.Event()
        self._verdict = threading.Event()
        self._last_beat = 0.0  # the watcher's last heartbeat (`_beat_when_due`)
        self._peers = Peers(process_id, num_processes, lost_after, agree_timeout)
        self._sigterm: SigtermRelay | None = None
        self._notice: PreemptionNotice | None = None
        self._run: JobRun | None = None
        self._progress = None
        self._model = None

    @property
    def leader(self) -> bool:
        """True in process 0, which owns the run's record, FIFO and checkpoints."""
        return self.process_id == 0

    @property
    def lost(self) -> str | None:
        """Why a process of the job was lost, or None while all live."""
        return self.kv.lost

    def describe(self) -> str:
        return f"{self.unit} {self.process_id} of {self.num_processes}"

    def _new_agreement(self) -> Agreement:
        return Agreement(self.kv, self.process_id, self.num_processes, self.agree_timeout, self._refuse,
                         agreed=self._agreed, while_waiting=self._beat_when_due, unit=self.unit)

    def _agreed(self, request: Request) -> None:
        receipts = self._receipts
        if receipts is not None:
            receipts.agreed(request)

    # Before and after the run opens --------------------------------------------

    def begin(self, run: JobRun) -> None:
        """Before the run opens: agrees on this `fit`'s keys, and on the
        run's name (the others take process 0's)."""
        # Every process calls fit in the same order, so the count agrees.
        self.kv.begin(f"{KEY_ROOT}/fit{next(_fit_counter)}")
        self.lost_process = None
        self._closing = threading.Event()  # its own per fit: a late watcher never sees the next one's
        self._verdict.clear()
        self.agreement = self._new_agreement()
        self._peers = Peers(self.process_id, self.num_processes, self.lost_after, self.agree_timeout)
        if not self.leader:
            run.rename(self.kv.wait_for(self.kv.key("name"), self.agree_timeout, f"{self.unit} 0 to name the run"))

    def registry(self) -> Path | None:
        """Where this process lists its record: None (the registry) for
        process 0; for the others, a hidden folder of their own (the record
        has the job's name)."""
        if self.leader:
            return None
        return registry_root() / JOB_REGISTRY / f"process-{self.process_id}"

    def store(self, store, model=None):
        """The store this process saves through: process 0 writes and tells
        the others (`LeaderStore`); they wait for its word (`FollowerStore`)."""
        if self.leader:
            return LeaderStore(store, self.kv)
        return FollowerStore(store, self.kv, model if model is not None else self._model, self.save_timeout)

    def opened(self, run: JobRun, progress, fit, on_lost: Callable[[str], None], model=None,
               step_of: Callable[[], int] | None = None) -> None:
        """After the run opened (training thread): shares the name, takes
        SIGTERM, answers the sender for every process (`receipts`), starts
        the watcher thread (proposals, heartbeats, receipts).

        Args:
            run: The run, open.
            progress: The training's counters (its ``metrics``, ``boundary``).
            fit: Where the training is: ``thread_id`` and ``frame`` (a `fit`'s
                `FitWatchdog`; a loop's with block).
            on_lost: Ends the run ``failed`` with a message (from any
                thread), returning once it has ended (an end in progress
                on another thread is waited for).
            model: A Keras model being trained (a follower's saves run its
                ``save``), or None.
            step_of: The step a receipt names. Defaults to the steps
                trained since the run opened (``progress.boundary``).
        """
        if self.leader:
            self.kv.set(self.kv.key("name"), run.name)
        self._receipts = Receipts(self.kv, self.process_id, self.num_processes, self.unit,
                                  step_of or (lambda: progress.boundary), self.agreement.ended)
        run.journal.receipt = self._receipts.relay(run.journal.settle)
        self._on_lost = on_lost
        self._run = run
        self._progress = progress
        self._model = model if model is not None else self._model
        self._record = self._job_record()
        run.add_record_fields(lambda: self._record)  # kept current by the watcher
        self._heartbeat = Heartbeat(self.kv, self.process_id, self._peers,
                                    lambda: {"state": str(run.state), "epoch": run.progress.epoch, "step": run.progress.step})
        self._fit_thread_id = fit.thread_id
        self._fit_frame = fit.frame
        self._heartbeat.beat()
        if self.preemption_service:
            self._notice = PreemptionNotice(self.kv.try_get) if self.leader else None
        else:
            self._sigterm = SigtermRelay(self._on_sigterm)
            self._sigterm.install()
        atexit.register(self._at_exit)  # until the run has ended (`run_ended`)
        self._watcher = threading.Thread(target=self._watch, name=f"traincontrol-job-{run.name}", daemon=True)
        self._watcher.start()

    def channel(self, local, progress) -> AgreedChannel:
        """The channel the boundary layer reads: agreed requests, when due.
        A request the job cannot agree on (a peer has ended its `fit`) is
        answered ``failed`` at once, saying why; the training goes on."""
        return AgreedChannel(self.agreement, local, progress, lambda: self.kv.lost)

    def _refuse(self, request: Request, why: str) -> None:
        journal = self._run.journal
        journal.log("warning", f"'{request}' not applied: {why}.")
        journal.acknowledge(request, "failed", f"not applied: {why}")

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
        if str(final_state) == "failed" and not on_stack(self._fit_thread_id, self._fit_frame):
            self.await_verdict()
        self._settle_receipts()
        self._closing.set()
        if self._sigterm is not None:
            self._sigterm.retire()
            self._sigterm = None
        error = self._explain(error)
        if str(final_state) == "failed" and self._progress is not None:
            # The last batch's metrics may be arrays whose collective failed
            # (reading them raises) or never ends (reading them hangs).
            self._progress.set_metrics(_settled(self._progress.metrics))
        if self.lost_process is not None:
            self._record = {**self._record, "lost_process": self.lost_process,
                            "processes": self._peers.table(self.lost_process, str(final_state))}
        if final_state is not None:
            final = {"state": str(final_state)}
            if error is not None:
                final["error"] = error[:2000]
            if self.lost_process is not None:
                final["lost_process"] = self.lost_process
            self._heartbeat.state_of = lambda: final
            try:
                self._heartbeat.beat()
            except Exception:  # the coordinator is gone: nobody to tell
                pass
        if watcher is not None and watcher is not threading.current_thread():
            if watcher.is_alive() and self.lost is None:  # a lost job's watcher ends by itself
                try:
                    self.agreement.mark_ended()  # wakes the watcher from its blocking read
                except Exception:  # the coordinator is gone: the read ends by itself
                    pass
            watcher.join(timeout=self.heartbeat_seconds + _WATCH_SECONDS + 5)
        self._watcher = None
        return error

    def await_verdict(self) -> None:
        """The training failed while every peer still looked alive (a
        collective fails at once when a peer dies): waits, at most
        `lost_after` and two heartbeats, for the watcher to find which peer
        was lost (at once if none could be: no watcher, or one found)."""
        watcher = self._watcher
        if self.lost is None and watcher is not None and watcher.is_alive() and not self._closing.is_set():
            self._verdict.wait(self.lost_after + 2 * self.heartbeat_seconds)

    def _settle_receipts(self) -> None:
        """Process 0 answers what it holds back (waiting a little for the
        others' answers unless a process was lost); the journal answers
        as usual from now on."""
        receipts = self._receipts
        if receipts is None:
            return
        if self.leader:
            try:
                receipts.finish(0 if self.lost else min(self.agree_timeout, _RECEIPT_WAIT_SECONDS))
            except Exception as error:  # the coordinator is gone: answer with what is known
                logger.warning("[job %s] could not read the job's answers to its commands: %s", self.describe(),
                               first_line(error))
                receipts.collect(final=True)
        self._run.journal.receipt = None
        self._receipts = None

    def run_ended(self) -> None:
        """The run of this `fit` has ended, its last record written (the
        last step of its end): the exit hook goes. Until then, an exit
        ends the run, or waits for the end another thread began."""
        atexit.unregister(self._at_exit)

    def _explain(self, error: str | None) -> str | None:
        lost = self.lost
        if lost is None or (error is not None and error.startswith(lost)):
            return error
        return lost if error is None else f"{lost} ({error})"

    def _at_exit(self) -> None:
        # Runs before the registry's own exit handler lets the record go: a
        # fit that raised and was not ended yet is ended now, with its cause;
        # an end another thread began (its watchdog's) is waited for.
        self._on_lost(self.lost or "fit raised an exception; on_train_end never ran.")

    def _on_sigterm(self) -> None:
        # In a signal handler: no printing through sys.stdout.
        try:
            self._run.send(Command.STOP, sender="sigterm")
        except Exception:  # the run ended meanwhile
            pass
        write_stderr(f"\n[traincontrol] SIGTERM: stopping the job ({self.describe()}) at an agreed step, with a checkpoint.\n")

    def _job_record(self) -> dict[str, Any]:
        record = {"process": self.process_id, "num_processes": self.num_processes, "processes": self.processes()}
        if self.lost_process is not None:
            record["lost_process"] = self.lost_process
        return record

    def record(self) -> dict[str, Any]:
        """This process's part of the job's record."""
        return dict(self._record)

    def processes(self) -> list[dict[str, Any]]:
        """Each process's last published state and step (from its heartbeat)."""
        return self._peers.table(self.lost_process)

    # The watcher thread ------------------------------------------------------

    def _watch(self) -> None:
        closing = self._closing
        self._last_beat = 0.0
        failing_since: float | None = None
        while not closing.is_set():
            try:
                self.agreement.receive(min(_WATCH_SECONDS, self.heartbeat_seconds))
                receipts = self._receipts
                if receipts is not None and receipts.waiting:
                    receipts.collect()
                if self._beat_when_due(closing) and self._notice is not None and self._notice.check():
                    self._run.journal.log("info", "A process of the job got SIGTERM (JAX's preemption notice): stopping the job.")
                    self._run.send(Command.STOP, sender="preemption")
                failing_since = None
            except Exception as error:  # the coordinator (process 0) may be gone
                if closing.is_set() or self.lost:  # lost: found while waiting for the others' word (`_beat_when_due`)
                    return
                now = time.monotonic()
                failing_since = failing_since or now
                verdict = self._peers.verdict(now, store_answers=False)
                if verdict is None and now - failing_since >= self.lost_after:
                    verdict = 0, f"the coordination service it hosts stopped answering ({first_line(error)})"
                if verdict is not None:
                    self._lose(*verdict)
                    return
                closing.wait(0.5)
            if self.lost:
                return

    def _beat_when_due(self, closing: threading.Event | None = None) -> bool:
        """Watcher thread: this process's heartbeat and a look at the others'
        once a heartbeat interval has passed since the last; also between the
        slices of a wait for the others' word on a proposal, so a process
        lost meanwhile ends that wait (`Coordination.wait_for`) instead of
        holding it for `agree_timeout`.

        Returns:
            True if it beat.
        """
        if time.monotonic() - self._last_beat < self.heartbeat_seconds or (closing or self._closing).is_set():
            return False
        self._last_beat = time.monotonic()
        self._heartbeat.beat()
        self._check_peers()
        return True

    def _check_peers(self) -> None:
        now = time.monotonic()
        self._heartbeat.read_peers(now)
        self._record = {**self._record, "processes": self._peers.table()}
        self._run.touch()
        verdict = self._peers.verdict(now)
        if verdict is not None:
            self._lose(*verdict)

    def _lose(self, process: int, why: str) -> None:
        """A peer is lost: records it, ends the run ``failed`` and, unless
        `exit_grace` is None, ends the process if it stays stuck (both on
        a thread of their own: the watcher returns at once)."""
        self.lost_process = process
        self.kv.lost = f"{self.unit.capitalize()} {process} of {self.num_processes} was lost: {why}."
        logger.error("[job %s] %s", self.describe(), self.kv.lost)
        self._verdict.set()
        threading.Thread(target=self._after_loss, name="traincontrol-job-lost", daemon=True).start()

    def _after_loss(self) -> None:
        """Lives until the process exits when the fit stays stuck (by design:
        the way out of a collective that never completes)."""
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

