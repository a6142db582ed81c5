"""A run's life, without Keras: claimed, listening, published, ended.

`RunLifecycle` opens and closes one run and holds its parts, each with a narrow job:

- its identity: the claimed registry folder (name, ``run_id``, liveness
  lock), and its checkpoint store (the same ``run_id`` in every sidecar);
- `channel`: the command channel (a FIFO), read by the run's thread
  (`run_thread.RunThread`), which also ticks the `publisher`;
- its state (`state`), moved only along `protocol.states.TRANSITIONS`
  (`move_to`, the one way a run changes state, from the training thread or
  whichever thread ends the run), each move logged and published at once;
- `journal`: the log of events, acknowledgements and changes;
- `history` (the loss per batch, each epoch's logs) and the progress the training's driver reports (`follow`);
- the record (`build_record`): written at once on a state change or an
  answered command, else at most twice a second, by its `publisher`.

Other parts get the part they need (the boundary layer logs to `journal`).
It serves `ControlCallback`, `TrainLoop` and `TrainingRun`.

Example:

>>> run = RunLifecycle("demo", "ckpt").open()   # doctest: +SKIP
>>> run.move_to(RunState.RUNNING)              # doctest: +SKIP
>>> run.close(RunState.FINISHED)               # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ..checkpoint import Checkpoint, CheckpointStore
from ..protocol import (END_REASONS, FINAL_STATES, TRANSITIONS, Command, InvalidTransitionError, Rejected, Request,
                        RunState, as_state, end_reason)
from ..registry import RunFolder, validate_name
from ..transport.receiver import CommandChannel
from ..transport.channels import ChannelError, NotListeningError, deliver, open_channel, with_id
from .history import RunHistory
from .journal import Journal, Listener, RunEvent
from .progress import ProgressSource, RunProgress
from .publisher import PUBLISH_INTERVAL_SECONDS, Publisher
from .record import RecordFields, build_record
from .run_thread import RunThread

__all__ = ["RunLifecycle", "RunEvent", "earlier_run_words"]

logger = logging.getLogger("jupyter_traincontrol")


class RunLifecycle:
    """The identity, state, journal and record of one training run.

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
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"keep must be a whole number of at least 1, got {keep!r}.")  # now, not at train begin
        self._requested_name = name
        self._requested_checkpoint_dir = checkpoint_dir
        self._keep = keep
        self._channel_kind = channel_kind
        self._registry = registry
        self.origin = origin or (Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python")
        fixed = dict(extra_record or {})
        self._record_fields: list[RecordFields] = [lambda: fixed] if fixed else []
        self.name: str | None = name
        self.run_id: str | None = None
        self.store: CheckpointStore | None = None
        self.channel: CommandChannel | None = None
        self._thread: RunThread | None = None
        self._folder: RunFolder | None = None
        self._lock = threading.RLock()
        self._publish_lock = threading.RLock()  # re-entrant: defensive, as `RunFolder.write_record`
        self._state = RunState.STARTING
        self._state_lock = threading.RLock()
        self.journal = Journal(lambda: self.name, owner=self)
        self.history = RunHistory()
        self._source: ProgressSource | None = None
        self._last_progress = RunProgress()
        self.publisher: Publisher | None = None
        self._published_version: tuple | None = None
        self._last_publish = 0.0
        self.error: str | None = None
        self.end_reason: str | None = None
        self._stopped_by: str | None = None  # the callback that ended the training early, for end reason callback
        self.started: float | None = None
        self.ended: float | None = None

    # Opening and closing -------------------------------------------------

    @property
    def is_open(self) -> bool:
        """True between `open` and `close`."""
        return self._folder is not None and self._state not in FINAL_STATES

    def rename(self, name: str) -> None:
        """Gives the run another name before it opens (a job's processes
        take process 0's)."""
        if self.is_open:
            raise RuntimeError(f"Run {self.name!r} is open; it cannot be renamed to {name!r}.")
        self.name = self._requested_name = validate_name(name)

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
        self.run_id = uuid.uuid4().hex  # this instance's, in its record and in its checkpoints' sidecars
        previous = self._folder
        if previous is None or previous.name != (self._requested_name or previous.name) \
                or not previous.reopen(self.run_id):  # an ended run of this object: its folder serves again
            self.forget()  # the record of an earlier, ended run of this object
            self._folder = RunFolder.claim_any(self._requested_name, self._registry, run_id=self.run_id,
                                               sweep_later=True)  # by the run's thread (`tidy_up`)
        self.name = self._folder.name
        before = self.store  # this object's earlier run, if any: its line goes on (`keep` counts them together)
        self.store = CheckpointStore(  # the tool's own default folder is made private
            self._requested_checkpoint_dir or Path("checkpoints") / self.name, self._keep,
            run=self.name, run_id=self.run_id, private=self._requested_checkpoint_dir is None,
            close_removed=self._folder.close_later,  # a folder left empty is freed by the run's thread as it ends
        )
        if before is not None and before.run == self.name and before.directory == self.store.directory:
            self.store.continue_own_line(before.lineage)
        self.store.list()  # what the folder holds of this name already
        self.started, self.ended, self.error, self.end_reason = time.time(), None, None, None
        self._stopped_by = None
        with self._state_lock:
            self._state = RunState.STARTING  # a new run of the same object: not a move
        self.journal.clear()
        self.history = RunHistory()
        self._source, self._last_progress = None, RunProgress()
        try:
            self.channel = open_channel(
                self._folder.path, self._channel_kind,
                on_rejected=self._on_rejected,
                on_notice=lambda text: self.journal.log("warning", text),
                dir_fd=self._folder.dir_fd,
            )
        except BaseException:
            self._folder.release()
            self._folder = None
            raise
        self.publisher = Publisher(self.publish, on_published=lambda: self.journal.notify(None))
        self._published_version = None
        self.publish(force=True)  # senders find the channel once `open` returns
        self._thread = RunThread(self.channel, self.publisher, name=self.name)
        self.publisher.start(wake=self.channel.wake)  # the run's thread waits in a read of its channel
        self._thread.start()  # one thread per run; started after the write, which it would slow
        self.publisher.run_soon(self._folder.tidy_up)  # what the claim left to it: a sweep, a folder set aside
        return self

    def close(self, final_state: RunState | str, error: str | None = None, end_reason: str | None = None) -> None:
        """Ends the run: stops the publisher, removes the channel, and
        records `final_state` while the run's thread ends by itself
        (closing its descriptors and what the run left it; nobody waits).

        The record stays, with its final state, while this process lives.
        Idempotent: only the first call after `open` has an effect.

        Args:
            final_state: One of ``stopped``, ``aborted``, ``finished``,
                ``failed``.
            error: For ``failed``: the error text (a traceback) to record.
            end_reason: How it ended (`protocol.END_REASONS`). Defaults to
                what `final_state` says (``finished``, ``error``, or
                ``command`` for a stop or abort).
        """
        final_state = as_state(final_state)
        if final_state not in FINAL_STATES:
            raise ValueError(f"Unknown final state {str(final_state)!r}. "
                             f"Expected one of: {', '.join(sorted(str(s) for s in FINAL_STATES))}.")
        if end_reason is not None and end_reason not in END_REASONS:
            raise ValueError(f"Unknown end reason {end_reason!r}. Expected one of: {', '.join(END_REASONS)}.")
        with self._lock:
            if not self.is_open:
                return
            self.error, self.ended = error, time.time()
            self.end_reason = end_reason or _default_end_reason(final_state)
            thread, self.channel, self._thread = self._thread, None, None
            self.unfollow()
        chores = self.publisher.stop(then=self._folder.free_kept)  # first: nothing wakes the thread later
        if thread is not None:  # the channel is removed now; the thread ends by itself, doing `chores`, while
            thread.end(last=chores)  # the last record is written (`publish` keeps the records in order)
        try:
            self.move_to(final_state)  # the last record
        finally:
            self._folder.seal()

    def forget(self) -> None:
        """Removes the run's record from the registry (after `close`)."""
        if self._folder is not None:
            self._folder.release()
            self._folder = None

    # State -----------------------------------------------------------------

    @property
    def state(self) -> RunState:
        """The run's `RunState`."""
        return self._state

    def move_to(self, state: RunState | str) -> bool:
        """Moves the run to `state`, logged and published at once.

        Returns:
            True if it moved; False if it was in `state` already.

        Raises:
            InvalidTransitionError: If `TRANSITIONS` has no such move (an
                ended run, say); the state is unchanged.
            ValueError: If `state` is not a state.
        """
        if not isinstance(state, RunState):
            state = as_state(state)
        with self._state_lock:
            current = self._state
            if state == current:
                return False
            if state not in TRANSITIONS.get(current, ()):
                raise InvalidTransitionError(f"A run that is {current} cannot become {state}.")
            self._state = state
        self.journal.log("state", str(state))
        if state in FINAL_STATES:
            self.publish(force=True)  # the last record, before the folder is sealed
        else:
            self.publish_soon()  # by the run's thread, at once
        return True

    def _on_rejected(self, rejected: Rejected) -> None:
        self.journal.log("rejected", f"{rejected.text}: {rejected.reason}")

    # Progress ----------------------------------------------------------------

    def follow(self, source: ProgressSource) -> None:
        """Reads progress from `source` (the driver of the training) from now on."""
        self._source = source

    def unfollow(self) -> None:
        """Stops reading the driver; its last progress stays in the record."""
        source, self._source = self._source, None
        if source is not None:
            self._last_progress = source.progress()

    @property
    def source(self) -> ProgressSource | None:
        """What the run reads its progress from now (the driver), or None."""
        return self._source

    @property
    def progress(self) -> RunProgress:
        """Where the training stands now (as the driver reports it)."""
        source = self._source
        return source.progress() if source is not None else self._last_progress

    def _version(self) -> tuple:
        source = self._source
        return self.journal.version, self.history.version, id(source), source.version if source is not None else 0

    def touch(self) -> None:
        """Marks the record as changed (published with the next tick)."""
        self.history.version += 1

    def note_stopped_by(self, name: str | None) -> None:
        """A callback of the user's ended a training of this run early (its
        class, or None if not known): the record names it (``stopped_by``)
        if the run ends with end reason ``callback``."""
        self._stopped_by = name

    def add_record_fields(self, fields: RecordFields) -> None:
        """Adds fields to the record, read at each publish (a job's processes)."""
        self._record_fields.append(fields)

    # Checkpoints -------------------------------------------------------------

    def add_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Notes a checkpoint the run wrote (the store keeps the list)."""
        self.journal.log("checkpoint", f"{checkpoint.info.get('reason')}: {checkpoint.path}")

    def checkpoints(self) -> list[Checkpoint]:
        """The run's complete checkpoints, oldest first (as of its last save)."""
        return self.store.known if self.store is not None else []

    def checkpoint_paths(self) -> list[Path]:
        """The paths of the run's complete checkpoints, oldest first."""
        return [checkpoint.path for checkpoint in self.checkpoints()]

    # The record --------------------------------------------------------------

    @property
    def address(self) -> str | None:
        """Where to write commands while the run listens (its FIFO), else None."""
        channel = self.channel
        return channel.address if channel is not None else None

    def listening_words(self, resuming: bool = False) -> str:
        """One line for the user: the run listens, and how to stop it.

        A fresh run whose folder holds checkpoints of an earlier run of its
        name says first what it found, and logs it in the journal: they
        stay (`CheckpointStore.earlier`), and a resume would continue them.

        Args:
            resuming: The run resumes, or is about to (a with block's first
                fit): nothing is said of earlier checkpoints. A run whose
                store looked for a checkpoint to resume says nothing either.
        """
        listening = (f"Run {self.name!r} is listening: `jupyter-traincontrol send {self.name} stop` or "
                     f"`echo stop > {self.address}`.")
        store = self.store
        if resuming or store is None or store.looked_for_resume:
            return listening
        earlier = earlier_run_words(store.directory, store.earlier(store.known))  # listed as the run opened
        if earlier is None:
            return listening
        self.journal.log("info", earlier)
        return f"{earlier} {listening}"

    def record(self) -> dict[str, Any]:
        """The run's record as published (without the registry's fields)."""
        store = self.store
        return build_record(
            state=self.state, origin=self.origin, channel=self.channel,
            checkpoint_dir=str(store.directory) if store is not None else None,
            checkpoints=self.checkpoints(), run_id=self.run_id or "", progress=self.progress,
            history=self.history, journal=self.journal, error=self.error, started=self.started, ended=self.ended,
            end_reason=self.end_reason if self.state in FINAL_STATES else None,
            stopped_by=self._stopped_by if self.state in FINAL_STATES and self.end_reason == "callback" else None,
            extras=self._record_fields,
        )

    def publish(self, force: bool = False) -> bool:
        """Writes the record if it changed since the last write and half a
        second has passed (with `force`: now, if it changed).

        Returns:
            True if the record was written.
        """
        folder = self._folder
        if folder is None:
            return False
        with self._publish_lock:  # a record built earlier is never written after one built later
            now = time.monotonic()
            version = self._version()
            if version == self._published_version or not force and now - self._last_publish < PUBLISH_INTERVAL_SECONDS:
                return False
            try:
                folder.write_record(self.record())
            except OSError as error:
                logger.warning("Could not write the record of run %r: %s", self.name, error)
                return False
            self._published_version, self._last_publish = version, now
        return True

    def publish_soon(self) -> None:
        """Has the run's thread write the record now (if it changed), off
        this thread; once the publisher has stopped, writes it here."""
        publisher = self.publisher
        if publisher is not None and publisher.running:
            publisher.publish_soon()
        else:
            self.publish(force=True)

    def add_listener(self, listener: Listener) -> None:
        """Calls `listener(run, event)` on each event, and with None on
        progress (from the run's thread, at most about twice a second)."""
        self.journal.add_listener(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Undoes `add_listener`."""
        self.journal.remove_listener(listener)

    # Commands ------------------------------------------------------------------

    def send(self, command: str | Command | Request, sender: str | None = "notebook", *, direct: bool = False) -> Request:
        """Sends a command to this run through its channel, like any writer
        (`transport.channels.deliver`, with a request id the run acknowledges).

        If the channel cannot take it this instant (its FIFO being
        re-created, say), the request is queued directly: an in-process
        sender is never lost. Safe in a signal handler.

        Args:
            command: A command line (``"stop"``, ``"save #id"``), `Command`
                or `Request`.
            sender: Who sends, for the request id (``panel``, ``interrupt``).
            direct: Queue it without the channel's writer side: for a
                sender on the training thread itself, whose command then
                acts at the very next boundary.

        Returns:
            The request sent.

        Raises:
            UnknownCommandError: If `command` is not a command.
            NotListeningError: If the run has ended.
        """
        request = with_id(command, sender)
        channel = self.channel
        if channel is None:
            raise NotListeningError(f"Run {self.name!r} is {self.state}; it takes no more commands.")
        if direct:
            channel.inject(request)
            return request
        try:
            deliver(channel.address, request, kind=channel.kind)
        except ChannelError as error:
            channel.inject(request)
            self.journal.log("warning", f"Delivered {request} directly: {error}")
        return request


def earlier_run_words(directory: Path, earlier: list[Checkpoint]) -> str | None:
    """What a fresh run says of the `earlier` checkpoints of its name in
    `directory` (oldest first), or None for none: ``checkpoints/quickstart
    holds 3 checkpoints of an earlier run (newest ckpt-...keras, end): they
    stay; ...``."""
    if not earlier:
        return None
    runs = len({checkpoint.lineage for checkpoint in earlier})
    newest = earlier[-1]
    shown = os.path.relpath(directory) if directory.is_relative_to(Path.cwd()) else str(directory)
    return (f"{shown} holds {len(earlier)} checkpoint{'s' if len(earlier) > 1 else ''} of "
            f"{'an earlier run' if runs == 1 else f'{runs} earlier runs'} of this name (newest "
            f"{newest.path.name}, {newest.info.get('reason')}): they stay, and this run starts afresh; "
            "to continue from the newest instead, resume: --resume, or resume=True.")


def _default_end_reason(state: RunState) -> str:
    return end_reason(str(state)) or "command"
