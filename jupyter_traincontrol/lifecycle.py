"""A run's life: its identity, its state machine, its event log and its record.

`RunLifecycle` owns what a run has besides the model: its claimed registry
folder (name, run id, liveness lock), its command channel, its checkpoint
store, its state and a short event log. It publishes all of that as the
run's JSON record: at once on every state change, and otherwise from its own
named publisher thread, at most about twice a second while progress changes.

The training thread writes progress with plain attribute assignments (cheap
enough for every batch). Nothing here touches Keras, so the same object
serves `ControlCallback` in a script and `TrainingRun` in a notebook.

Example:

>>> lifecycle = RunLifecycle("demo", "ckpt").open()   # doctest: +SKIP
>>> lifecycle.set_state(RunState.RUNNING)              # doctest: +SKIP
>>> lifecycle.close(RunState.FINISHED)                 # doctest: +SKIP
"""

from __future__ import annotations

import collections
import logging
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from . import fit_watchdog
from .channel import ChannelError, CommandChannel, NotListeningError, open_channel, send_command
from .checkpoint import Checkpoint, CheckpointStore
from .commands import FINAL_STATES, Command, Rejected, Request, RunState, allowed_commands, parse_request
from .loss_curve import LossCurve
from .registry import NameTakenError, RunFolder, unique_name, validate_name

__all__ = ["RunLifecycle", "RunEvent"]

logger = logging.getLogger("jupyter_traincontrol")

_PUBLISH_INTERVAL_SECONDS = 0.5
_EVENTS_KEPT = 50
_ACKS_KEPT = 50

Listener = Callable[["RunLifecycle", "RunEvent | None"], None]


class RunEvent(dict):
    """One line of a run's log: ``{"time", "kind", "message"}``.

    Kinds: ``command``, ``checkpoint``, ``rejected``, ``warning``, ``info``,
    ``error``, ``state``.
    """


class RunLifecycle:
    """The identity, state, event log and record of one training run.

    Args:
        name: The run's name. Defaults to the first free ``run-N``.
        checkpoint_dir: Folder of the run's checkpoints. Defaults to
            ``checkpoints/NAME`` under the current directory.
        keep: Checkpoints to keep. Defaults to 3.
        channel_kind: ``"fifo"`` or ``"spool"``; defaults to the platform's.
        registry: The registry folder. Defaults to the Jupyter runtime dir's.
        origin: A few words saying where the run lives (a script, a kernel),
            shown by ``list``. Defaults to the script's path.
        extra_record: Fields added to the record (for example a kernel id).
    """

    def __init__(
        self,
        name: str | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        keep: int = 3,
        *,
        channel_kind: str | None = None,
        registry: Path | None = None,
        origin: str | None = None,
        extra_record: dict[str, Any] | None = None,
    ):
        if name is not None:
            validate_name(name)
        self._requested_name = name
        self._requested_checkpoint_dir = checkpoint_dir
        self._keep = keep
        CheckpointStore(".", keep)  # validates keep now, not at train begin
        self._channel_kind = channel_kind
        self._registry = registry
        self.origin = origin or (Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python")
        self._extra_record = dict(extra_record or {})
        self.name: str | None = name
        self.store: CheckpointStore | None = None
        self.channel: CommandChannel | None = None
        self._folder: RunFolder | None = None
        self._state = RunState.STARTING
        self._state_lock = threading.RLock()
        self.events: collections.deque[RunEvent] = collections.deque(maxlen=_EVENTS_KEPT)
        self.acks: collections.deque[dict[str, Any]] = collections.deque(maxlen=_ACKS_KEPT)
        self.error: str | None = None
        self.started: float | None = None
        self.ended: float | None = None
        self._checkpoints: list[Checkpoint] = []
        self._listeners: list[Listener] = []
        self._tick_hooks: list[Callable[[], None]] = []
        self._publisher: threading.Thread | None = None
        self._closing = threading.Event()
        self._reset_progress()

    def _reset_progress(self) -> None:
        # Progress, written by the training thread with plain assignments.
        self.epoch = 0  # 1-based number of the epoch in progress; 0 before the first
        self.epochs: int | None = None
        self.step = 0  # batches done in the epoch in progress
        self.steps: int | None = None
        self.global_step: int | None = None
        self.metrics: dict[str, float] = {}
        self.epoch_history: list[dict[str, Any]] = []
        self.loss_curve = LossCurve()  # the loss of every batch, for charts (fed by the callback)
        self.tunables: dict[str, float | None] = {}  # what `set` can change, and its current values
        self.changes: list[dict[str, Any]] = []  # what set, rollback and the NaN policy changed
        self._progress_version = 0
        self._published_version = -1
        self._last_publish = 0.0

    # Opening and closing -------------------------------------------------

    @property
    def is_open(self) -> bool:
        """True between `open` and `close`."""
        return self._folder is not None and self._state not in FINAL_STATES

    def open(self) -> "RunLifecycle":
        """Claims the run's name, opens its channel and publishes its record.

        Returns:
            self.

        Raises:
            NameTakenError: If a live run has the requested name.
            UnsafePathError: If the registry folder is not private.
        """
        if self.is_open:
            raise RuntimeError(f"Run {self.name!r} is already open.")
        fit_watchdog.check_all()  # a run of this process whose fit raised ends now, not later
        self.forget()  # the record of an earlier, ended run of this object
        self._folder = self._claim_folder()
        self.name = self._folder.name
        self.store = CheckpointStore(  # the tool's own default folder is made private
            self._requested_checkpoint_dir or Path("checkpoints") / self.name, self._keep,
            run=self.name, private=self._requested_checkpoint_dir is None,
        )
        self._checkpoints = self.store.list()
        self.started, self.ended, self.error = time.time(), None, None
        self._state = RunState.STARTING
        self.events.clear()
        self.acks.clear()
        self._reset_progress()
        try:
            self.channel = open_channel(
                self._folder.path,
                self._channel_kind,
                on_rejected=self._on_rejected,
                on_notice=lambda text: self.log("warning", text),
                name=self.name,
                dir_fd=self._folder.dir_fd,
            )
        except BaseException:
            self._folder.release()
            self._folder = None
            raise
        self.publish(force=True)
        self._closing.clear()
        self._publisher = threading.Thread(
            target=self._run_publisher, name=f"traincontrol-publisher-{self.name}", daemon=True
        )
        self._publisher.start()
        return self

    def _claim_folder(self) -> RunFolder:
        if self._requested_name is not None:
            return RunFolder.claim(self._requested_name, self._registry)
        for _attempt in range(20):
            try:
                return RunFolder.claim(unique_name("run", self._registry), self._registry)
            except NameTakenError:
                continue  # another process took it between listing and claiming
        raise NameTakenError("Could not find a free run name; pass name= explicitly.")

    def close(self, final_state: RunState | str, error: str | None = None) -> None:
        """Ends the run: records `final_state`, closes the channel and stops
        the publisher thread.

        The record stays, with its final state, while this process lives.
        Idempotent: only the first call after `open` has an effect.

        Args:
            final_state: One of ``stopped``, ``aborted``, ``finished``,
                ``failed``.
            error: For ``failed``: the error text (a traceback) to record.
        """
        final_state = _as_state(final_state)
        if final_state not in FINAL_STATES:
            raise ValueError(
                f"Unknown final state {str(final_state)!r}. "
                f"Expected one of: {', '.join(sorted(str(s) for s in FINAL_STATES))}."
            )
        with self._state_lock:
            if not self.is_open:
                return
            self.error = error
            self.ended = time.time()
            channel, self.channel = self.channel, None
        if channel is not None:
            channel.close()
        self._closing.set()
        publisher = self._publisher
        if publisher is not None and publisher is not threading.current_thread():
            publisher.join()
        self._publisher = None
        self.set_state(final_state)
        self._folder.seal()  # the last record is written

    def forget(self) -> None:
        """Removes the run's record from the registry (after `close`)."""
        if self._folder is not None:
            self._folder.release()
            self._folder = None

    # State and events ----------------------------------------------------

    @property
    def state(self) -> RunState:
        """The run's `RunState`."""
        return self._state

    def set_state(self, state: RunState | str) -> None:
        """Moves the run to `state`, logs it and publishes at once."""
        state = _as_state(state)
        with self._state_lock:
            if state == self._state:
                return
            self._state = state
        self.log("state", str(state))
        self.publish(force=True)

    def log(self, kind: str, message: str) -> RunEvent:
        """Adds an event to the run's log and tells the listeners."""
        event = RunEvent(time=time.time(), kind=kind, message=message)
        self.events.append(event)
        self._progress_version += 1
        level = logging.WARNING if kind in ("warning", "rejected", "error") else logging.INFO
        logger.log(level, "[%s] %s: %s", self.name, kind, message)
        self._notify(event)
        return event

    def acknowledge(self, request: Request, outcome: str, message: str) -> None:
        """Says what became of a request with an id: its sender finds the id
        in the record's ``acks``, ``{"ids", "command", "outcome", "message",
        "time"}`` (published with the next `publish`). Requests with the same
        answer in a row share one entry, so a burst of a thousand merged
        saves is one entry, not a thousand.

        Args:
            request: The request.
            outcome: ``applied``, ``ignored`` (it changed nothing, the
                message says why) or ``failed``.
            message: One line for a person.
        """
        if request.request_id is None:
            return
        with self._state_lock:  # the checkpoint writer's thread acknowledges saves too
            last = self.acks[-1] if self.acks else None
            if last is not None and (last["command"], last["outcome"], last["message"]) == (str(request), outcome, message):
                last["ids"].append(request.request_id)
            else:
                self.acks.append(
                    {"ids": [request.request_id], "command": str(request), "outcome": outcome, "message": message, "time": time.time()}
                )
        self.touch()

    def add_listener(self, listener: Listener) -> None:
        """Calls `listener(lifecycle, event)` on each event, and with None on
        progress (from the publisher thread, at most about twice a second)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Undoes `add_listener`."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def add_tick_hook(self, hook: Callable[[], None]) -> None:
        """Calls `hook()` from the publisher thread about twice a second."""
        self._tick_hooks.append(hook)

    def remove_tick_hook(self, hook: Callable[[], None]) -> None:
        """Undoes `add_tick_hook`."""
        if hook in self._tick_hooks:
            self._tick_hooks.remove(hook)

    def _notify(self, event: RunEvent | None) -> None:
        for listener in list(self._listeners):
            try:
                listener(self, event)
            except Exception:  # a display must never break training
                logger.exception("A run listener failed")

    def _on_rejected(self, rejected: Rejected) -> None:
        self.log("rejected", f"{rejected.text}: {rejected.reason}")

    def _run_publisher(self) -> None:
        while not self._closing.wait(_PUBLISH_INTERVAL_SECONDS):
            for hook in list(self._tick_hooks):
                try:
                    hook()
                except Exception:
                    logger.exception("A run tick hook failed")
            if self.publish():
                self._notify(None)

    # Progress ------------------------------------------------------------

    def touch(self) -> None:
        """Marks progress as changed (after assigning progress attributes)."""
        self._progress_version += 1

    def record_epoch(self, epoch: int, logs: dict[str, Any] | None) -> None:
        """Keeps an epoch's final metrics for charts."""
        entry = {"epoch": epoch + 1}
        if self.loss_curve.batches:  # the batch index of the epoch's end, counted across epochs
            entry["batch"] = self.loss_curve.batches
        for key, value in (logs or {}).items():
            try:
                entry[key] = float(value)
            except (TypeError, ValueError):
                continue
        self.epoch_history.append(entry)
        self.touch()

    def add_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Notes a checkpoint the run wrote (the store may have pruned older ones)."""
        self._checkpoints = self.store.list()
        self.log("checkpoint", f"{checkpoint.info.get('reason')}: {checkpoint.path}")

    def checkpoints(self) -> list[Checkpoint]:
        """The run's complete checkpoints, oldest first (as of its last save)."""
        return list(self._checkpoints)

    def checkpoint_paths(self) -> list[Path]:
        """The paths of the run's complete checkpoints, oldest first."""
        return [checkpoint.path for checkpoint in self._checkpoints]

    @property
    def address(self) -> str | None:
        """Where to write commands while the run listens (its FIFO), else None."""
        channel = self.channel
        return channel.address if channel is not None else None

    def record(self) -> dict[str, Any]:
        """The run's record as published (without the registry's fields)."""
        channel = self.channel
        return {
            **self._extra_record,
            "state": str(self.state),
            "commands": [str(command) for command in allowed_commands(self.state)],
            "origin": self.origin,
            "channel": channel.kind if channel else None,
            "fifo": channel.address if channel is not None and channel.kind == "fifo" else None,
            "address": channel.address if channel is not None else None,
            "checkpoint_dir": str(self.store.directory) if self.store else None,
            "checkpoints": [str(c.path) for c in self._checkpoints],
            "checkpoints_this_run": sum(1 for c in self._checkpoints if c.info.get("run_id") == self.store.run_id),
            "epoch": self.epoch,
            "epochs": self.epochs,
            "step": self.step,
            "steps": self.steps,
            "global_step": self.global_step,
            "metrics": _finite_numbers(self.metrics),
            "history": [_finite_numbers(entry) for entry in self.epoch_history[-200:]],
            "loss_curve": self.loss_curve.points(),
            "tunables": dict(self.tunables),
            "changes": [dict(change) for change in self.changes],
            "events": list(self.events)[-20:],
            "acks": [dict(ack, ids=list(ack["ids"])) for ack in list(self.acks)],
            "error": self.error,
            "started": self.started,
            "ended": self.ended,
        }

    def publish(self, force: bool = False) -> bool:
        """Writes the record if progress changed and enough time passed.

        Args:
            force: Write now, whatever changed or however recently.

        Returns:
            True if the record was written.
        """
        folder = self._folder
        if folder is None:
            return False
        now = time.monotonic()
        version = self._progress_version
        if not force and (version == self._published_version or now - self._last_publish < _PUBLISH_INTERVAL_SECONDS):
            return False
        try:
            folder.write_record(self.record())
        except OSError as error:
            logger.warning("Could not write the record of run %r: %s", self.name, error)
            return False
        self._published_version, self._last_publish = version, now
        return True

    # Commands --------------------------------------------------------------

    def send(self, command: str | Command | Request) -> Request:
        """Sends a command to this run through its channel, like any writer.

        Args:
            command: A command line (``"stop"``, ``"save #id"``), `Command`
                or `Request`.

        Returns:
            The request sent.

        Raises:
            UnknownCommandError: If `command` is not a command.
            NotListeningError: If the run has ended.
        """
        request = parse_request(command)
        channel = self.channel
        if channel is None:
            raise NotListeningError(f"Run {self.name!r} is {self.state}; it takes no more commands.")
        try:
            send_command(channel.address, request)
        except ChannelError as error:
            # The FIFO could not take it (deleted this instant, say): queue it
            # directly, so an in-process sender is never lost.
            channel.inject(request)
            self.log("warning", f"Delivered {request} directly: {error}")
        return request


def _finite_numbers(values: dict[str, Any]) -> dict[str, float | None]:
    """Metrics as JSON can carry them: NaN and infinities become None (null),
    and what is not a number is left out."""
    plain: dict[str, float | None] = {}
    for key, value in values.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        plain[str(key)] = number if math.isfinite(number) else None
    return plain


def _as_state(state: RunState | str) -> RunState:
    try:
        return RunState(state)
    except ValueError:
        raise ValueError(
            f"Unknown state {state!r}. Expected one of: {', '.join(str(s) for s in RunState)}."
        ) from None
