"""The run's thread: reads its channel, drives its publisher, keeps the channel on disk.

One daemon thread per run (``traincontrol-reader-NAME``). It reads what
senders write to the run's channel (`transport.receiver.CommandChannel.read`:
the channel only reads, and queues), and between two reads it drives the
run's ticker (`publisher.Publisher`: the record's writes, the tick hooks,
the chores the run leaves it) whenever the ticker says something is due
or wakes it, and checks every half second that the channel is still
there, re-making it if something removed or replaced it. A second thread
per run would cost each short `fit` a start and a join (0.3 ms, and
1-1.5 ms on torch, whose spinning workers delay a new thread's first run).

At a run's end (`end`) the channel is removed at once and the thread ends
by itself: it does what the run left it (freeing what the run's records
replaced), then closes the channel's descriptors; nobody waits for it.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

from ..transport.receiver import CommandChannel

__all__ = ["RunThread", "Ticker", "HEALTH_CHECK_SECONDS"]

#: How often the thread checks that the channel is still there on disk.
HEALTH_CHECK_SECONDS = 0.5


class Ticker(Protocol):
    """What the run's thread drives between reads: the run's publisher
    (`publisher.Publisher`)."""

    def due_in(self) -> float:
        """Seconds until `tick` has something to do (may be infinite)."""

    def tick(self) -> None:
        """Does what is due; must not raise."""


class RunThread:
    """The thread of one run: reads `channel`, ticks `ticker`.

    Args:
        channel: The run's command channel.
        ticker: Driven between reads (``ticker.tick()`` whenever
            ``ticker.due_in()`` says, and after each wake of the channel's
            read: ``channel.wake()``), or None.
        name: The run's name, for the thread's.
        health_check_seconds: How often the channel is checked on disk.
    """

    def __init__(self, channel: CommandChannel, ticker: Ticker | None = None, *, name: str = "run",
                 health_check_seconds: float = HEALTH_CHECK_SECONDS):
        self.channel = channel
        self._ticker = ticker
        self._health_check_seconds = health_check_seconds
        self._stopped = threading.Event()  # set by `stop`: the thread ends
        self._lock = threading.Lock()
        self._last: Callable[[], None] | None = None  # left by `stop` to the thread
        self._close_at_end = False  # set by `end`: the thread closes the channel as it ends
        self._done = False  # set by the thread as it ends
        self._thread = threading.Thread(target=self._run, name=f"traincontrol-reader-{name}", daemon=True)

    def start(self) -> "RunThread":
        """Starts the thread. Returns self."""
        self._thread.start()
        return self

    def stop(self, last: Callable[[], None] | None = None) -> None:
        """Tells the thread to end, without waiting for it: it reads nothing
        more and ends by itself while the caller goes on; `close` then joins
        it. Idempotent; any thread.

        Args:
            last: Work left to the thread, which calls it as it ends (or
                `close`, if the thread never ran).
        """
        with self._lock:
            if not self._ask_to_stop(last):
                return
        self.channel.stop()

    def end(self, last: Callable[[], None] | None = None) -> None:
        """`stop`, and removes the channel from disk now; the thread closes
        the channel's descriptors as it ends, after `last`, and nobody waits
        for it (a run's end: its last record is written meanwhile). The run's
        name is then free for the next run at once. Idempotent; any thread.

        Args:
            last: As for `stop`.
        """
        with self._lock:  # the thread ends under it (`_done`): a thread alive now closes the channel itself
            self._ask_to_stop(last)
            self._close_at_end = True
            done = self._done or self._thread.ident is None
            self.channel.remove()  # stopped first: the thread's read returns
        if done:  # the thread never started, or has ended: nothing else will
            self.close()

    def _ask_to_stop(self, last: Callable[[], None] | None) -> bool:
        """Under `_lock`: tells the thread to end, leaving it `last`; False
        if it was told already."""
        if self._stopped.is_set():
            return False
        self._last = last
        self._stopped.set()
        return True

    def close(self) -> None:
        """Stops the thread, joins it and closes the channel (removed from
        disk). Idempotent; when it returns, the thread has ended."""
        self.stop()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self._do_last()
        self.channel.close()

    def _do_last(self) -> None:
        """Calls what `stop` left to the thread, once."""
        with self._lock:
            last, self._last = self._last, None
        if last is not None:
            try:
                last()
            except Exception as error:
                self.channel.on_notice(f"Command channel problem: {error}")

    def _run(self) -> None:
        channel, ticker, stopped = self.channel, self._ticker, self._stopped
        interval = self._health_check_seconds
        next_check = time.monotonic() + interval
        last_problem = None
        while not stopped.is_set():
            try:
                timeout = max(0.0, next_check - time.monotonic())
                channel.read(timeout if ticker is None else min(timeout, ticker.due_in()))
                if ticker is not None and not stopped.is_set():
                    ticker.tick()
                if time.monotonic() >= next_check and not stopped.is_set():
                    next_check = time.monotonic() + interval
                    channel.check_health()
                last_problem = None
            except Exception as error:  # the thread must outlive any hiccup
                problem = f"Command channel problem: {error}"
                if problem != last_problem:
                    channel.on_notice(problem)
                last_problem = problem
                stopped.wait(interval)
        self._do_last()
        with self._lock:
            self._done = True
            close_now = self._close_at_end
        if close_now:
            channel.close()
