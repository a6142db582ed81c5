"""The checkpoint writer's pacing: slow while nobody waits, full speed once someone does.

What is checked is the pauses the writer makes between two slices of a
write, timed where they are made: the write's own file system calls
(fsync and rename, which take seconds on a busy disk) are no part of it.
"""

from __future__ import annotations

import threading
import time

from jupyter_traincontrol.checkpoint import CheckpointStore, TrainingPosition
from jupyter_traincontrol.checkpoint.writer import CheckpointWriter

SLICES, SLICE_SECONDS = 8, 0.05  # unpaced: 0.4 s of "writing"; paced: several seconds
#: A pause cut short by a waiter ends at once; a paced one lasts 8 slices (0.4 s).
CUT_SHORT_SECONDS = 0.2


class SlicedSource:
    """Writes a file in slices as the model snapshot does, pacing itself with
    the writer between them, and notes when each pause began and ended."""

    def __init__(self):
        self.pace = None
        self.started = threading.Event()
        self.pauses: list[tuple[float, float]] = []

    def save(self, path):
        self.started.set()
        with open(path, "wb") as handle:
            for _ in range(SLICES):
                time.sleep(SLICE_SECONDS)  # the slice's work
                handle.write(b"x" * 1024)
                if self.pace is not None:
                    began = time.monotonic()
                    self.pace(SLICE_SECONDS)
                    self.pauses.append((began, time.monotonic()))

    def longest_pause_after(self, moment: float) -> float:
        """The longest time the write paused after `moment` (0 if it did not)."""
        return max((end - max(began, moment) for began, end in self.pauses if end > moment), default=0.0)


def _submit(tmp_path, name):
    writer = CheckpointWriter(CheckpointStore(tmp_path / name, run=name), name=name)
    done = threading.Event()
    source = SlicedSource()
    writer.submit(source, TrainingPosition(epoch=0, step_in_epoch=1), "save", {}, lambda checkpoint, error: done.set())
    assert source.started.wait(10), "the writer never started the write"
    return writer, source, done


def test_a_write_nobody_waits_for_is_paced(tmp_path):
    writer, source, done = _submit(tmp_path, "paced")
    try:
        assert not done.wait(4 * SLICES * SLICE_SECONDS), "the write went at full speed with nobody waiting"
        assert source.pauses and max(end - began for began, end in source.pauses) > CUT_SHORT_SECONDS
    finally:
        closing = time.monotonic()
        writer.close()
    assert done.is_set()
    assert source.longest_pause_after(closing) < CUT_SHORT_SECONDS, "close waited for the paced write"


def test_closing_the_writer_waits_at_full_speed(tmp_path):
    # Closing it (the end of a fit) used to wait for the write at its paced speed: 9x its time.
    writer, source, done = _submit(tmp_path, "closing")
    closing = time.monotonic()
    writer.close()
    assert done.is_set()
    assert len(source.pauses) == SLICES
    assert source.longest_pause_after(closing) < CUT_SHORT_SECONDS, "close waited for the paced write"


def test_a_waiter_speeds_up_the_write_in_flight(tmp_path):
    writer, source, done = _submit(tmp_path, "waited")
    try:
        waiting = time.monotonic()
        assert writer.wait(timeout=60)
        assert done.is_set()
        assert source.longest_pause_after(waiting) < CUT_SHORT_SECONDS, "wait() did not make the write go at full speed"
    finally:
        writer.close()


def test_a_write_waited_for_from_its_start_is_never_paused(tmp_path):
    # `write` (a stop's checkpoint, its training thread waiting): nothing to yield to, so no pace is handed over.
    writer = CheckpointWriter(CheckpointStore(tmp_path / "stopping", run="stopping"), name="stopping")
    source = SlicedSource()
    try:
        checkpoint = writer.write(source, TrainingPosition(epoch=0, step_in_epoch=1), "stop", {})
    finally:
        writer.close()
    assert checkpoint.path.exists()
    assert source.pace is None and source.pauses == []
