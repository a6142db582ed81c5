"""The background checkpoint writer: one write in flight, off the training thread.

`CheckpointWriter.submit` hands a source (a host copy of the state,
`state.ModelSnapshot`, or while the training thread waits, views of it) to
a new named daemon thread that writes
it with `CheckpointStore.save`: the same staging folder, renames, intent
record, flushes and pruning as a save on the training thread, so a process
killed at any moment of a background write leaves what a killed save
leaves. Pruning and flushing happen on that thread too. The store's
``on_phase`` hook also hears ``writer-started`` (on the writer thread,
before the save) and ``writer-done`` (after ``on_done``).

At most one write is in flight: `submit` refuses a second (the caller
merges saves asked for meanwhile into the next one). `wait` blocks until the
write in flight, if any, is done. The source is released (``release()``,
if it has one) as soon as its file is written.

Example:

>>> writer = CheckpointWriter(store)                                          # doctest: +SKIP
>>> writer.submit(ModelSnapshot.take(model), position, "save", {}, on_done)  # doctest: +SKIP
>>> writer.wait()                                                             # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Mapping

from .records import Checkpoint, CheckpointError, TrainingPosition
from .store import CheckpointStore

__all__ = ["CheckpointWriter", "WriterBusyError"]

logger = logging.getLogger("jupyter_traincontrol")

#: Called on the writer thread with the checkpoint written, or the error.
OnDone = Callable[[Checkpoint | None, BaseException | None], None]


class WriterBusyError(RuntimeError):
    """A write is already in flight."""


class CheckpointWriter:
    """Writes checkpoints of one store, one at a time, on a background thread.

    Args:
        store: The run's store (held by the run while writes go on).
        name: For the thread's name, ``traincontrol-writer-NAME``.
    """

    def __init__(self, store: CheckpointStore, name: str = "run"):
        self.store = store
        self.name = name
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()

    @property
    def busy(self) -> bool:
        """True while a write is in flight."""
        return not self._idle.is_set()

    def submit(
        self,
        source: Any,
        position: TrainingPosition,
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
            position: Where training stood when `source` was taken.
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
        self._thread = threading.Thread(
            target=self._write, args=(source, position, reason, dict(metrics or {}), on_done, resume_state, tunables),
            name=f"traincontrol-writer-{self.name}", daemon=True,
        )
        self._thread.start()

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
        """Waits until no write is in flight; returns False on timeout."""
        if not self._idle.wait(timeout):
            return False
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        return True

    def _write(self, source, position, reason, metrics, on_done: OnDone, resume_state=None, tunables=None) -> None:
        checkpoint, failure = None, None
        try:
            self.store.phase("writer-started")
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
