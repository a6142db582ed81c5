"""Which process of a job was lost: heartbeats, and a bounded way out.

Each process of a job writes a heartbeat into the job's key-value store (its state, step, host and pid) every
`Job.heartbeat_seconds`; each reads the others'. `Peers` turns what it read
into a verdict:

- a peer on this host whose process is gone (its pid no longer runs, or is
  a zombie) is lost at once;
- a peer whose heartbeat has not changed for `lost_after` seconds (hung, or
  on another host) is lost;
- a peer that ended ``failed`` takes the job down with it (naming the
  process it found lost, if any).

A process whose peer was lost cannot finish a collective: `exit_when_stuck`
ends it (code 70) once its `fit` has been stuck for `grace` seconds, or at
once when it waits in JAX's shutdown barrier at exit (that barrier needs
the lost process too). A `fit` that left by an exception, and code after it,
run as usual.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
from typing import Any, Callable

from ..protocol import FINAL_STATES, RunState
from ..registry import release_all
from ..system.frames import any_thread_in, on_stack
from ..system.processes import pid_gone

__all__ = ["Heartbeat", "Peers", "exit_when_stuck", "this_process", "EXIT_CODE"]

#: The exit code of a process ended because a peer was lost (EX_SOFTWARE).
EXIT_CODE = 70
#: States a process ends in without taking the job down.
ENDED_WELL = frozenset(str(state) for state in FINAL_STATES - {RunState.FAILED})
_STUCK_POLL_SECONDS = 0.1


def this_process() -> dict[str, Any]:
    """Where this process runs, as its heartbeat says it (host, pid,
    pid namespace: a pid is only meaningful within its namespace)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = None
    return {"host": socket.gethostname(), "pid": os.getpid(), "pidns": namespace}


class Peers:
    """What this process knows of the others, from their heartbeats.

    Args:
        process_id: This process's index.
        num_processes: How many processes the job has.
        lost_after: Seconds without a change in a peer's heartbeat before it
            counts as lost.
        startup: Seconds a peer may take to send its first heartbeat
            (processes of a loaded machine start their `fit` seconds apart).
    """

    def __init__(self, process_id: int, num_processes: int, lost_after: float, startup: float):
        self.process_id = process_id
        self.num_processes = num_processes
        self.lost_after = lost_after
        self.startup = max(startup, lost_after)
        self.started = time.monotonic()
        self.seen: dict[int, dict[str, Any]] = {}
        self._here = this_process()

    def update(self, beats: dict[int, dict[str, Any]], now: float) -> None:
        """Takes the heartbeats just read (process -> its last beat)."""
        for process, info in beats.items():
            seen = self.seen.get(process)
            if seen is None or seen.get("beat") != info.get("beat"):
                self.seen[process] = {"process": process, **info, "_seen": now}

    def table(self, lost: int | None = None, own_state: str | None = None) -> list[dict[str, Any]]:
        """Each process's last published state and step, for the record
        (this process's state as `own_state` says, when given)."""
        rows = []
        for process in range(self.num_processes):
            seen = self.seen.get(process, {"state": "unknown"})
            row = {"process": process, **{k: v for k, v in seen.items() if k in ("state", "epoch", "step")}}
            if process == lost:
                row["state"] = "lost"
            elif process == self.process_id and own_state is not None:
                row["state"] = own_state
            rows.append(row)
        return rows

    def verdict(self, now: float, store_answers: bool = True) -> tuple[int, str] | None:
        """The first peer found lost, and why; or None while all live.

        Args:
            now: ``time.monotonic()``.
            store_answers: False while the key-value store does not answer:
                only what can be checked without it (a pid here) counts.
        """
        failed = None
        for process in range(self.num_processes):
            if process == self.process_id:
                continue
            seen = self.seen.get(process)
            state = seen.get("state") if seen else None
            if state in ENDED_WELL:
                continue
            if seen is not None and self._gone_here(seen):
                return process, f"its process (pid {seen['pid']}) is gone"
            if state == "failed":
                failed = failed or seen
                continue
            if not store_answers:
                continue
            if seen is None:
                if now - self.started >= self.startup:
                    return process, f"no heartbeat at all in {now - self.started:.0f} s"
            elif now - seen["_seen"] >= self.lost_after:
                return process, f"no heartbeat for {now - seen['_seen']:.0f} s"
        if failed is not None:
            named = failed.get("lost_process")
            error = str(failed.get("error") or "it failed")
            if isinstance(named, int) and named != self.process_id:
                return named, f"as process {failed['process']} found: {error}"
            return failed["process"], f"it failed: {error}"
        return None

    def _gone_here(self, seen: dict[str, Any]) -> bool:
        here = self._here
        pid = seen.get("pid")
        if not isinstance(pid, int) or seen.get("host") != here["host"] or seen.get("pidns") != here["pidns"]:
            return False
        return pid_gone(pid)


class Heartbeat:
    """This process's heartbeat in the job's key-value store, and reading the others'.

    Args:
        kv: The job's `coordination.Coordination`.
        process_id: This process's index.
        peers: Where what is read of the others is kept.
        state_of: Returns this process's state and step, for its beat.
    """

    def __init__(self, kv, process_id: int, peers: Peers, state_of: Callable[[], dict[str, Any]]):
        self.kv = kv
        self.process_id = process_id
        self.peers = peers
        self.state_of = state_of
        self._beats = itertools.count()
        self._where = this_process()

    def beat(self) -> None:
        """Writes this process's heartbeat (its state, step, host and pid)."""
        self.kv.set(self.kv.key("beat", self.process_id),
                    json.dumps({"beat": next(self._beats), **self._where, **self.state_of()}), overwrite=True)

    def read_peers(self, now: float) -> None:
        """Reads every process's last heartbeat into `peers` (in one read
        where the store lists a folder, else one read a process)."""
        beats = {}
        if self.kv.lists_folders:
            for key, value in self.kv.entries(self.kv.key("beat") + "/"):
                beats[int(key.rsplit("/", 1)[1])] = json.loads(value)
        else:
            for process in range(self.peers.num_processes):
                value = self.kv.try_get(self.kv.key("beat", process))
                if value is not None:
                    beats[process] = json.loads(value)
        self.peers.update(beats, now)


def exit_when_stuck(message: str, grace: float, fit_thread_id: int, fit_frame) -> None:
    """Ends the process (code `EXIT_CODE`) once it is stuck because a peer
    was lost: its `fit` still runs `grace` seconds from now (blocked in a
    collective), or any thread waits in JAX's shutdown barrier. Polls until
    then; run it on a daemon thread."""
    deadline = time.monotonic() + grace
    while True:
        if any_thread_in("shutdown", "jax/_src/distributed.py"):
            _exit(f"{message} JAX's shutdown waits for it")
        if time.monotonic() >= deadline and on_stack(fit_thread_id, fit_frame):
            _exit(f"{message} Its training is stuck in a collective")
        time.sleep(_STUCK_POLL_SECONDS)


def _exit(why: str) -> None:
    try:
        os.write(2, f"\n[traincontrol] {why}; exiting (code {EXIT_CODE}).\n".encode("utf-8", "replace"))
        release_all()  # what exit would do: the last records stay readable a while
    finally:
        os._exit(EXIT_CODE)
