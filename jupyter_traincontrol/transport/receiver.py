"""The receiving end of a run's commands: a queue that `read` fills.

Each run has one channel in its private folder (a FIFO, `fifo`, or a spool
folder, `spool`). The channel only reads: the run's thread
(`run.run_thread.RunThread`) calls `read`, which waits for what arrives,
decodes it and puts whole requests on a queue, so the training thread only
checks whether the queue is non-empty at each batch boundary. The channel
is opened once, never per batch, and a command written while no batch runs
(validation, a pause) is read at once and waits in the queue.

Example:

>>> channel = open_channel(run_folder, on_rejected=print)  # doctest: +SKIP
>>> RunThread(channel).start()                              # doctest: +SKIP
>>> deliver(channel.address, "save")                        # doctest: +SKIP
>>> channel.get(timeout=1).command                          # doctest: +SKIP
<Command.SAVE: 'save'>
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Callable

from ..protocol import Command, Rejected, Request, parse_request

__all__ = ["CommandChannel", "RejectedListener", "NoticeListener"]

RejectedListener = Callable[[Rejected], None]
NoticeListener = Callable[[str], None]


class CommandChannel:
    """Base of the channel kinds: a queue that `read` fills.

    One thread reads (`read`, `check_health`: the run's thread); any
    thread takes what was read (`pending`, `pop`, `get`), wakes a read in
    progress (`wake`: the run's publisher wakes its thread so) or stops
    the reads (`stop`).

    Args:
        folder: The run's private folder; the channel lives inside it.
        on_rejected: Called from the reading thread with each line that is
            not a command. Must not raise.
        on_notice: Called from the reading thread with a sentence about the
            channel itself (for example a FIFO re-created after deletion).
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
        dir_fd: int | None = None,
    ):
        self.folder = Path(folder)
        self._dir_fd = dir_fd
        self._on_rejected = on_rejected or (lambda rejected: None)
        self.on_notice = on_notice or (lambda text: None)
        self._queue: queue.SimpleQueue[Request] = queue.SimpleQueue()
        #: Called (from the thread that queued it) after each request is
        #: queued: the driver of the training is told a command waits.
        self.on_request: Callable[[], None] | None = None
        self._closed = threading.Event()  # set by `stop`: reads return at once, nothing is repaired
        self._close_lock = threading.RLock()  # held while the channel is repaired, so no repair follows `stop`
        self._done: set[str] = set()  # `_remove` and `_close_descriptors`, once done (`_once`)

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

    # The reading thread's ---------------------------------------------------------

    def read(self, timeout: float) -> None:
        """Waits up to `timeout` seconds for what writers send, and queues
        each whole request (reports each rejected line). Returns early when
        woken (`wake`) or stopped. One thread only."""
        if not self._closed.is_set():
            self._read_some(timeout)

    def check_health(self) -> None:
        """Repairs the channel on disk if something removed or replaced it;
        never once stopped. The reading thread only."""
        with self._close_lock:  # `stop` waits for a repair: no FIFO is re-made after `remove` removed it
            if not self._closed.is_set():
                self._check_health()

    # Any thread's -------------------------------------------------------------------

    def wake(self) -> None:
        """Has a `read` in progress (or the next one) return at once. Any thread; cheap."""
        if not self._closed.is_set():
            self._wake_reader()

    def stop(self) -> None:
        """Nothing more is read or repaired: a `read` in progress returns.
        Idempotent; any thread."""
        with self._close_lock:  # after a repair of the channel in progress: none comes after this
            if self._closed.is_set():
                return
            self._closed.set()
        self._wake_reader()

    def remove(self) -> None:
        """`stop`, and removes the channel from disk: writers find nobody
        listening from now on. Idempotent; any thread."""
        self.stop()
        self._once(self._remove)

    def close(self) -> None:
        """`remove`, and closes the channel's descriptors: once nothing reads
        it any more (the reading thread has ended). Idempotent."""
        self.remove()
        self._once(self._close_descriptors)

    def _once(self, action: Callable[[], None]) -> None:
        """Calls `action` (a method) unless it was called already, from any thread."""
        with self._close_lock:
            if action.__name__ in self._done:
                return
            self._done.add(action.__name__)
        action()

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
        """Closes the channel's descriptors; runs once, after the reads."""
