"""A run's journal: its log of events, what became of requests, and what was steered.

Any thread may write to it (the training thread, the channel's reader, the
checkpoint writer, a job's watcher): `log` adds an event and tells the
listeners (the panels), `acknowledge` answers a request by its id (a sender
waiting with ``send --wait`` finds it in the record's ``acks``),
`add_change` keeps what ``set``, ``rollback`` and the NaN policy changed;
`say` prints what a run says to its user (one line, ``[traincontrol] ...``,
unless its driver is quiet).
All three are bounded, and so is the record they make (`as_record`): an
entry that merges a burst of identical answers shows its ``count``, every
id whose sender waits for it (``send --wait``: `protocol.is_waited_id`)
and the newest `ACK_IDS_PUBLISHED` others; `version` changes with every entry, so the run's
publisher knows when to write the record again. An entry a sender waits for
outlives the `ACKS_KEPT` newest: pushed out of them by a burst of other
answers, it is kept apart for `WAITED_ACKS_SECONDS` (at most
`WAITED_ACKS_KEPT` such entries), so ``send --wait`` finds its answer
whatever else was answered at the same boundary.

Example:

>>> journal = Journal(lambda: "demo")
>>> journal.log("info", "hello")["message"]
'hello'
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from typing import Any, Callable, TextIO

from ..protocol import Request, is_waited_id

__all__ = ["Journal", "say", "RunEvent", "Listener", "EVENTS_KEPT", "ACKS_KEPT", "CHANGES_KEPT", "ACK_IDS_KEPT",
           "ACK_IDS_PUBLISHED", "WAITED_ACKS_KEPT", "WAITED_ACKS_SECONDS"]

logger = logging.getLogger("jupyter_traincontrol")

EVENTS_KEPT = 50
ACKS_KEPT = 50
CHANGES_KEPT = 50
#: Ids one merged acknowledgement keeps in memory (the newest; waited ones too).
ACK_IDS_KEPT = 4096
#: Ids of senders that do not wait, shown per entry in the record (the newest).
ACK_IDS_PUBLISHED = 16
#: Entries with a waited id pushed out of the newest `ACKS_KEPT`: how many are
#: kept apart, and for how long (longer than any sender waits in practice).
WAITED_ACKS_KEPT = 200
WAITED_ACKS_SECONDS = 600.0

#: Called with each event, and with None when progress changed (panels).
Listener = Callable[[Any, "RunEvent | None"], None]


class RunEvent(dict):
    """One line of a run's log: ``{"time", "kind", "message"}``.

    Kinds: ``command``, ``checkpoint``, ``rejected``, ``warning``, ``info``,
    ``error``, ``state``, ``change``, ``rollback``.
    """


class Journal:
    """The events, acknowledgements and changes of one run.

    Args:
        name_of: Returns the run's name (for the log lines).
        owner: What listeners are told the event is of (the run).
    """

    def __init__(self, name_of: Callable[[], str | None], owner: Any = None):
        self._name_of = name_of
        self._owner = owner
        self._lock = threading.RLock()  # the checkpoint writer's thread acknowledges saves too
        self.events: collections.deque[RunEvent] = collections.deque(maxlen=EVENTS_KEPT)
        self.acks: collections.deque[dict[str, Any]] = collections.deque(maxlen=ACKS_KEPT)
        #: Entries with waited ids that newer answers pushed out of `acks`, oldest first.
        self.waited_acks: collections.deque[dict[str, Any]] = collections.deque(maxlen=WAITED_ACKS_KEPT)
        self.changes: list[dict[str, Any]] = []
        self._listeners: list[Listener] = []
        self.version = 0
        #: Set by a job for the life of its run (and put back to None): called
        #: with each answer to a request with an id; True means it answers later
        #: itself (`settle`), once every process of the job has.
        self.receipt: Callable[[Request, str, str], bool] | None = None

    def clear(self) -> None:
        """Forgets everything (a new run of the same object)."""
        with self._lock:
            self.events.clear()
            self.acks.clear()
            self.changes = []
            self.version += 1

    def log(self, kind: str, message: str) -> RunEvent:
        """Adds an event to the run's log and tells the listeners."""
        event = RunEvent(time=time.time(), kind=kind, message=message)
        self.events.append(event)
        self.version += 1
        level = logging.WARNING if kind in ("warning", "rejected", "error") else logging.INFO
        logger.log(level, "[%s] %s: %s", self._name_of(), kind, message)
        self.notify(event)
        return event

    def acknowledge(self, request: Request, outcome: str, message: str) -> None:
        """Says what became of a request with an id: its sender finds the id
        in the record's ``acks``, ``{"ids", "count", "command", "outcome",
        "message", "time"}`` (published with the next publish). Requests
        with the same answer in a row share one entry (``count`` of them),
        so a burst of a thousand merged saves is one entry, not a thousand;
        the record shows its waited ids and its newest others (`as_record`).

        Args:
            request: The request.
            outcome: ``applied``, ``ignored`` (it changed nothing, the
                message says why) or ``failed``.
            message: One line for a person.
        """
        if request.request_id is None:
            return
        receipt = self.receipt
        if receipt is not None and receipt(request, outcome, message):
            return
        self.settle(request, outcome, message)

    def settle(self, request: Request, outcome: str, message: str) -> None:
        """Answers a request with an id, whatever `receipt` would do with it
        (a job's answer, once every process said what it did)."""
        request_id = request.request_id
        if request_id is None:
            return
        with self._lock:
            last = self.acks[-1] if self.acks else None
            if last is not None and (last["command"], last["outcome"], last["message"]) == (str(request), outcome, message):
                ids = last["ids"]
                if len(ids) >= ACK_IDS_KEPT:
                    del ids[0]
                ids.append(request_id)
                last["count"] += 1
            else:
                last = {"ids": [request_id], "count": 1, "command": str(request), "outcome": outcome,
                        "message": message, "time": time.time(), "waited": []}
                if len(self.acks) == self.acks.maxlen and self.acks[0]["waited"]:
                    self.waited_acks.append(self.acks[0])  # its sender may not have read it yet
                self.acks.append(last)
                self._forget_old_waited(last["time"])
            if is_waited_id(request_id):
                waited = last["waited"]  # kept apart: the record shows them all
                waited.append(request_id)
                del waited[:-ACK_IDS_KEPT]
            self.version += 1

    def add_change(self, change: dict[str, Any]) -> None:
        """Keeps one steered change (``{"time", "by", "name", "old", "new", ...}``)."""
        with self._lock:
            # A new list, swapped in whole: the run's thread reads the old or the new.
            self.changes = [*self.changes, change][-CHANGES_KEPT:]
            self.version += 1

    def _forget_old_waited(self, now: float) -> None:
        while self.waited_acks and now - self.waited_acks[0]["time"] > WAITED_ACKS_SECONDS:
            self.waited_acks.popleft()

    def acks_of(self, request_id: str) -> dict[str, Any] | None:
        """The acknowledgement of `request_id`, or None (yet)."""
        with self._lock:
            for ack in (*self.waited_acks, *self.acks):
                if request_id in ack["ids"] or request_id in ack["waited"]:
                    return _shown(ack, list(ack["ids"]))
            return None

    def as_record(self) -> dict[str, Any]:
        """The journal's fields of the run's record."""
        with self._lock:
            return {
                "events": list(self.events)[-20:],
                "acks": [*(_shown(ack, list(ack["waited"])) for ack in self.waited_acks),
                         *(_shown(ack, _published_ids(ack["ids"], ack["waited"])) for ack in self.acks)],
                "changes": [dict(change) for change in self.changes],
            }

    # Listeners ---------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        """Calls `listener(run, event)` on each event (and with None when the
        run's progress was published)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Undoes `add_listener`."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def notify(self, event: RunEvent | None) -> None:
        """Tells every listener; a listener that fails is logged, never raised."""
        for listener in list(self._listeners):
            try:
                listener(self._owner, event)
            except Exception:  # a display must never break training
                logger.exception("A run listener failed")


def _shown(ack: dict[str, Any], ids: list[str]) -> dict[str, Any]:
    """An acknowledgement as readers see it, with `ids`."""
    shown = {key: value for key, value in ack.items() if key != "waited"}
    shown["ids"] = ids
    return shown


def _published_ids(ids: list[str], waited) -> list[str]:
    """The ids of an entry the record shows: the ones waited for, then the
    newest `ACK_IDS_PUBLISHED` (of any kind)."""
    newest = ids[-ACK_IDS_PUBLISHED:]
    if not waited:
        return newest
    shown = set(newest)
    return [request_id for request_id in waited if request_id not in shown] + newest


def say(message: str, *, verbose: bool, stream: TextIO | None = None) -> None:
    """Prints ``[traincontrol] MESSAGE`` to `stream` (stdout by default), flushed.

    Args:
        message: The line, without the prefix.
        verbose: The driver's ``verbose`` setting: False prints nothing.
        stream: Where to print; stdout (as it is at the call) by default.
    """
    if verbose:
        stream = stream or sys.stdout
        stream.write(f"[traincontrol] {message}\n")  # one write: processes sharing a pipe do not cut it
        stream.flush()
