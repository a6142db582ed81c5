"""The receiving end of a run's commands: a queue filled by a daemon reader thread.

Each run has one channel in its private folder (a FIFO, `fifo`, or a spool
folder, `spool`). A daemon reader thread decodes what arrives and puts whole
requests on a queue, so the training thread only checks whether the queue
is non-empty at each batch boundary: the channel is opened once, never per
batch, and a command written while no batch runs (validation, a pause) is
read at once and waits in the queue.

Example:

>>> channel = open_channel(run_folder, on_rejected=print)  # doctest: +SKIP
>>> deliver(channel.address, "save")                        # doctest: +SKIP
>>> channel.pop().command                                   # doctest: +SKIP
<Command.SAVE: 'save'>
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Callable, Protocol

from ..protocol import Command, Rejected, Request, parse_request

__all__ = ["CommandChannel", "RejectedListener", "NoticeListener", "Ticker"]

#: How often the reader checks that the channel is still there on disk.
_HEALTH_CHECK_SECONDS = 0.5

RejectedListener = Callable[[Rejected], None]
NoticeListener = Callable[[str], None]


class Ticker(Protocol):
    """What the reader thread drives between reads (`CommandChannel.start`):
    the run's publisher (`run.publisher.Publisher`)."""

    def due_in(self) -> float:
        """Seconds until `tick` has something to do (may be infinite)."""

    def tick(self) -> None:
        """Does what is due; must not raise."""


class CommandChannel:
    """Base of the channel kinds: a queue filled by a daemon reader thread.

    The reader thread reads: it decodes what arrives, queues whole
    commands, reports rejected lines, and repairs the channel on disk if
    something removed or replaced it. Between two reads it drives the
    run's `Ticker`, if `start` was given one: the run needs no second
    thread.

    Args:
        folder: The run's private folder; the channel lives inside it.
        on_rejected: Called from the reader thread with each line that is
            not a command. Must not raise.
        on_notice: Called from the reader thread with a sentence about the
            channel itself (for example a FIFO re-created after deletion).
        name: Used to name the reader thread.
        health_check_seconds: How often the reader checks that the channel
            is still there on disk. Defaults to 0.5.
        dir_fd: An open descriptor of `folder`. The channel then creates,
            checks and re-creates itself through it, so a folder renamed or
            swapped under a live run cannot redirect it.
    """

    kind = "abstract"

    def __init__(
        self,
        folder: Path,
        *,
        on_rejected: RejectedListener | None = None,
        on_notice: NoticeListener | None = None,
        name: str = "run",
        health_check_seconds: float = _HEALTH_CHECK_SECONDS,
        dir_fd: int | None = None,
    ):
        self.folder = Path(folder)
        self._health_check_seconds = health_check_seconds
        self._dir_fd = dir_fd
        self._on_rejected = on_rejected or (lambda rejected: None)
        self._on_notice = on_notice or (lambda text: None)
        self._queue: queue.SimpleQueue[Request] = queue.SimpleQueue()
        #: Called (from the thread that queued it) after each request is
        #: queued: the driver of the training is told a command waits.
        self.on_request: Callable[[], None] | None = None
        self._closed = threading.Event()  # set by `stop`: the reader ends
        self._close_lock = threading.RLock()  # held by the reader while it repairs the channel, so none follows `stop`
        self._done: set[str] = set()  # `_remove` and `_close_descriptors`, once done (`_once`)
        self._close_at_end = False  # set by `end`: the thread closes the descriptors as it ends
        self._reader_done = False  # set by the thread as it ends
        self._last: Callable[[], None] | None = None  # left by `stop` to the thread
        self._ticker: Ticker | None = None
        self._thread = threading.Thread(
            target=self._run_reader, name=f"traincontrol-reader-{name}", daemon=True
        )

    @property
    def address(self) -> str:
        """Where writers send commands (the FIFO, or the inbox folder)."""
        raise NotImplementedError

    @property
    def pending(self) -> bool:
        """True when a command waits. Cheap enough for every batch."""
        return not self._queue.empty()

    def pop(self) -> Request | None:
        """Takes the oldest waiting request, or returns None."""
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def get(self, timeout: float | None) -> Request | None:
        """Takes the oldest request, waiting up to `timeout` seconds for one.

        Returns:
            The request, or None if none came in time.
        """
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def inject(self, request: Request | Command) -> None:
        """Queues a request directly, for an in-process sender whose write
        to the channel failed."""
        self._queue.put(parse_request(request))
        self._tell()

    def wake(self) -> None:
        """Has the reader thread ask its ticker again at once. Any thread; cheap."""
        if not self._closed.is_set():
            self._wake_reader()

    def start(self, ticker: Ticker | None = None) -> "CommandChannel":
        """Starts the reader thread. Returns self.

        Args:
            ticker: Driven by the reader thread too: ``ticker.tick()`` is
                called between reads, whenever ``ticker.due_in()`` says and
                after each `wake`.
        """
        self._ticker = ticker
        self._thread.start()
        return self

    def stop(self, last: Callable[[], None] | None = None) -> None:
        """Tells the reader thread to end, without waiting for it: it reads
        nothing more and ends by itself while the caller goes on; `close`
        then joins it. Idempotent; any thread.

        Args:
            last: Work left to the thread, which calls it as it ends (or
                `close`, if the thread never ran).
        """
        with self._close_lock:  # after a repair of the channel in progress: none comes after this
            if self._closed.is_set():
                return
            self._last = last
            self._closed.set()
        self._wake_reader()

    def end(self, last: Callable[[], None] | None = None) -> None:
        """`stop`, and removes the channel from disk now; the thread closes
        its descriptors as it ends, after `last`, and nobody waits for it
        (a run's end: its last record is written meanwhile). Its own name is
        then free for the next run at once. Idempotent; any thread.

        Args:
            last: As for `stop`.
        """
        with self._close_lock:
            self._close_at_end = True
            done = self._reader_done or self._thread.ident is None
        self.stop(last)
        self._once(self._remove)
        if done:  # the thread never started, or has ended: nothing else will
            self.close()

    def close(self) -> None:
        """Stops the reader, joins its thread and removes the channel from
        disk. Idempotent; when it returns, the thread has ended."""
        self.stop()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self._do_last()
        self._once(self._remove)
        self._once(self._close_descriptors)

    def _once(self, action: Callable[[], None]) -> None:
        """Calls `action` (a method) unless it was called already, from any thread."""
        with self._close_lock:
            if action.__name__ in self._done:
                return
            self._done.add(action.__name__)
        action()

    def _do_last(self) -> None:
        """Calls what `stop` left to the thread, once."""
        with self._close_lock:
            last, self._last = self._last, None
        if last is not None:
            try:
                last()
            except Exception as error:
                self._on_notice(f"Command channel problem: {error}")

    def _deliver(self, results: list[Request | Rejected]) -> None:
        for result in results:
            if isinstance(result, Request):
                self._queue.put(result)
                self._tell()
            else:
                self._on_rejected(result)

    def _tell(self) -> None:
        told = self.on_request
        if told is not None:
            told()

    def _run_reader(self) -> None:
        interval = self._health_check_seconds
        next_check = time.monotonic() + interval
        last_problem = None
        ticker = self._ticker
        while not self._closed.is_set():
            try:
                timeout = max(0.0, next_check - time.monotonic())
                self._read_some(timeout if ticker is None else min(timeout, ticker.due_in()))
                if ticker is not None and not self._closed.is_set():
                    ticker.tick()
                if time.monotonic() >= next_check and not self._closed.is_set():
                    next_check = time.monotonic() + interval
                    with self._close_lock:  # `stop` waits for a repair: no FIFO is re-made after `end` removed it
                        if not self._closed.is_set():
                            self._check_health()
                last_problem = None
            except Exception as error:  # the reader must outlive any hiccup
                problem = f"Command channel problem: {error}"
                if problem != last_problem:
                    self._on_notice(problem)
                last_problem = problem
                self._closed.wait(interval)
        self._do_last()
        with self._close_lock:
            self._reader_done = True
            close_now = self._close_at_end
        if close_now:
            self._once(self._close_descriptors)

    # Subclass interface.
    def _read_some(self, timeout: float) -> None:
        raise NotImplementedError

    def _check_health(self) -> None:
        """Repairs the channel on disk if something removed or replaced it."""

    def _wake_reader(self) -> None:
        """Makes a blocked `_read_some` return at once (and the next one,
        if none is blocked now)."""

    def _remove(self) -> None:
        """Removes the channel from disk; runs once, after `stop`."""

    def _close_descriptors(self) -> None:
        """Closes the channel's descriptors; runs once, after the reader."""
