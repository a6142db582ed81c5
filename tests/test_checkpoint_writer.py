"""The checkpoint writer's pacing: slow while nobody waits, full speed once someone does."""

from __future__ import annotations

import threading
import time

from jupyter_traincontrol.checkpoint import CheckpointStore, TrainingPosition
from jupyter_traincontrol.checkpoint.writer import CheckpointWriter

SLICES, SLICE_SECONDS = 8, 0.05  # unpaced: 0.4 s of "writing"; paced: several seconds


class SlicedSource:
    """Writes a file in slices as the model snapshot does, pacing itself with the writer between them."""

    def __init__(self):
        self.pace = None
        self.started = threading.Event()

    def save(self, path):
        self.started.set()
        with open(path, "wb") as handle:
            for _ in range(SLICES):
                time.sleep(SLICE_SECONDS)  # the slice's work
                handle.write(b"x" * 1024)
                if self.pace is not None:
                    self.pace(SLICE_SECONDS)


def _submit(tmp_path, name):
    writer = CheckpointWriter(CheckpointStore(tmp_path / name, run=name), name=name)
    done = threading.Event()
    source = SlicedSource()
    writer.submit(source, TrainingPosition(epoch=0, step_in_epoch=1), "save", {}, lambda checkpoint, error: done.set())
    assert source.started.wait(10), "the writer never started the write"
    return writer, done


def test_a_write_nobody_waits_for_is_paced(tmp_path):
    writer, done = _submit(tmp_path, "paced")
    begin = time.monotonic()
    try:
        assert not done.wait(4 * SLICES * SLICE_SECONDS), "the write went at full speed with nobody waiting"
    finally:
        writer.close()
    assert done.is_set()
    assert time.monotonic() - begin < 4 * SLICES * SLICE_SECONDS + 5


def test_closing_the_writer_waits_at_full_speed(tmp_path):
    # Closing it (the end of a fit) used to wait for the write at its paced speed: 9x its time.
    writer, done = _submit(tmp_path, "closing")
    begin = time.monotonic()
    writer.close()
    assert done.is_set()
    assert time.monotonic() - begin < 3 * SLICES * SLICE_SECONDS, "close waited for the paced write"


def test_a_waiter_speeds_up_the_write_in_flight(tmp_path):
    writer, done = _submit(tmp_path, "waited")
    try:
        begin = time.monotonic()
        assert writer.wait(timeout=60)
        assert time.monotonic() - begin < 3 * SLICES * SLICE_SECONDS, "wait() did not make the write go at full speed"
    finally:
        writer.close()
