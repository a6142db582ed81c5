"""The background checkpoint writer: one write in flight, off the training thread.

`CheckpointWriter.submit` hands a source (a snapshot of the state,
`state.ModelSnapshot`, or while the training thread waits, views of it) to
the writer's named daemon thread, started at the first write and kept
until `close` (starting a thread per write held the submitting thread
1-2 ms, waiting for the new one to run), which writes it with
`CheckpointStore.save`: the same staging folder, renames, intent
record, flushes and pruning as a save on the training thread, so a process
killed at any moment of a background write leaves what a killed save
leaves. Pruning and flushing happen on that thread too. The store's
``on_phase`` hook also hears ``writer-started`` (on the writer thread,
before the save) and ``writer-done`` (after ``on_done``).

At most one write is in flight: `submit` refuses a second (the caller
merges saves asked for meanwhile into the next one). `wait` blocks until the
write in flight, if any, is done. The source is released (``release()``,
if it has one) as soon as its file is written.

While nobody waits for it, the writer paces itself: a source that writes
in slices calls its ``pace`` between them, and the writer sleeps eight
times as long as the slice took, so it takes about a ninth of one core and
a training that keeps every core busy is slowed little while a checkpoint
is written (the write takes about nine times as long; sixteen times was
tried: no gain the benchmark could tell from its noise, and a 500 MB
write took a minute). Once a thread waits for the
write (`wait`: a ``stop``, the end of `fit`, a rollback), it goes at full
speed. (A lower thread priority was tried: under load from other
processes it starved the writer, and a ``stop`` waited a minute for it.)

Example:

>>> writer = CheckpointWriter(store)                                          # doctest: +SKIP
>>> writer.submit(ModelSnapshot.take(model), position, "save", {}, on_done)  # doctest: +SKIP
>>> writer.wait()                                                             # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Mapping

from .records import Checkpoint, CheckpointError, TrainingPosition
from .store import CheckpointStore

__all__ = ["CheckpointWriter", "WriterBusyError"]

logger = logging.getLogger("jupyter_traincontrol")

#: Seconds the writer sleeps per second of writing, while nobody waits for it.
_PACE = 8.0
#: Seconds a write waits before it starts, unless waited for: woken at once,
#: the writer took the interpreter lock from the training thread still in
#: its batch hook (holding it there 2-6 ms more, in slices of the switch interval).
_START_DELAY = 0.005

#: Called on the writer thread with the checkpoint written, or the error.
OnDone = Callable[[Checkpoint | None, BaseException | None], None]


class WriterBusyError(RuntimeError):
    """A write is already in flight."""


class CheckpointWriter:
    """Writes checkpoints of one store, one at a time, on a background thread.

    Args:
        store: The run's store (held by the run while writes go on).
        name: For the thread's name, ``traincontrol-writer-NAME``.
        on_idle: Called on the writer thread once a write has ended and the
            writer counts as idle (another may be submitted).
    """

    def __init__(self, store: CheckpointStore, name: str = "run", on_idle: Callable[[], None] | None = None):
        self.store = store
        self.name = name
        self._on_idle = on_idle or (lambda: None)
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._wake = threading.Event()
        self._job: tuple | None = None
        self._closing = False
        self._waiters = 0  # threads in `wait`: the write goes at full speed
        self._hurry = threading.Event()  # set while the write in flight was waited for: no more pauses

    @property
    def busy(self) -> bool:
        """True while a write is in flight."""
        return not self._idle.is_set()

    def submit(
        self,
        source: Any,
        position: TrainingPosition | Callable[[], TrainingPosition],
        reason: str,
        metrics: Mapping[str, Any] | None,
        on_done: OnDone,
        resume_state: Mapping[str, Any] | None = None,
        tunables: Mapping[str, float] | None = None,
    ) -> None:
        """Starts writing `source` (anything with ``save(path)``) as a checkpoint.

        Args:
            source: Anything with ``save(path)`` (a `state.ModelSnapshot`, or
                the model while its training thread waits for the write).
            position: Where training stood when `source` was taken, or a
                call that gives it (made on the writer thread, whose host
                reads then do not hold the training thread).
            reason: ``save``, ``stop``, ``interrupt``, ...
            metrics: The metrics for the sidecar.
            on_done: Called on the writer thread when the write ends,
                before the writer counts as idle.
            resume_state: For the sidecar (see `CheckpointStore.save`).
            tunables: For the sidecar (see `CheckpointStore.save`).

        Raises:
            WriterBusyError: If a write is in flight.
        """
        if self.busy:
            raise WriterBusyError(f"A checkpoint of run {self.name!r} is being written; expected an idle writer.")
        self._idle.clear()
        self._job = (source, position, reason, dict(metrics or {}), on_done, resume_state, tunables)
        self._closing = False
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=f"traincontrol-writer-{self.name}", daemon=True)
            self._thread.start()
        self._wake.set()

    def write(self, source: Any, position: TrainingPosition, reason: str, metrics, resume_state=None,
              tunables=None) -> Checkpoint:
        """Writes on the writer thread and waits for it (after any write in flight).

        Returns:
            The checkpoint.

        Raises:
            CheckpointError: As `CheckpointStore.save`.
        """
        self.wait()
        result: dict[str, Any] = {}
        self.submit(source, position, reason, metrics, lambda checkpoint, error: result.update(c=checkpoint, e=error),
                    resume_state, tunables)
        self.wait()
        if result.get("e") is not None:
            raise result["e"]
        return result["c"]

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until no write is in flight (which then goes at full
        speed); returns False on timeout."""
        if self._idle.is_set():
            return True
        self._waiters += 1
        self._hurry.set()
        try:
            return self._idle.wait(timeout)
        finally:
            self._waiters -= 1

    def _pace(self, seconds: float) -> None:
        """Between two slices of a write that took `seconds`: sleeps `_PACE`
        times as long, in one wait that a thread waiting for the write ends
        (no polling: each wake-up would take the interpreter lock from the
        training thread)."""
        if not self._hurry.is_set():
            self._hurry.wait(_PACE * seconds)

    def close(self) -> None:
        """Waits for the write in flight (at full speed: it is waited for),
        then ends the writer's thread. Idempotent; a later `submit` starts
        a new one."""
        self.wait()
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._closing = True
        self._wake.set()
        if thread is not threading.current_thread():
            thread.join()

    def _serve(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            job, self._job = self._job, None
            if job is not None:
                self._hurry.clear()  # a new write: paced until someone waits for it
                if self._waiters:
                    self._hurry.set()
                else:  # let the training thread finish its boundary before taking the interpreter
                    time.sleep(_START_DELAY)
                self._write(*job)
            elif self._closing:
                return

    def _write(self, source, position, reason, metrics, on_done: OnDone, resume_state=None, tunables=None) -> None:
        checkpoint, failure = None, None
        if hasattr(source, "pace") and not self._hurry.is_set():
            source.pace = self._pace  # a source that writes in slices paces itself, until someone waits for it
        try:
            self.store.phase("writer-started")
            if callable(position):
                position = position()
            checkpoint = self.store.save(source, position, reason=reason, metrics=metrics, resume_state=resume_state,
                                         tunables=tunables)
        except Exception as error:  # reported through on_done, never lost on this thread
            failure = error if isinstance(error, CheckpointError) else CheckpointError(
                f"Could not write a checkpoint in {self.store.directory}: {type(error).__name__}: {error}"
            )
        finally:
            release = getattr(source, "release", None)
            if callable(release):
                release()
        try:
            on_done(checkpoint, failure)
            self.store.phase("writer-done")
        except Exception:  # a failing callback must not leave the writer busy forever
            logger.exception("A checkpoint writer callback failed")
        finally:
            self._idle.set()
        try:
            self._on_idle()
        except Exception:
            logger.exception("A checkpoint writer callback failed")
