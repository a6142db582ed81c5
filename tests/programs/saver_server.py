"""A checkpoint saver to kill: driven line by line by tests/test_faults.py.

It never imports TensorFlow (it starts in milliseconds), so 100 kill points
cost seconds, not minutes. It forks one child per kill point. The child
saves in a loop with a stand-in model whose `save` writes the bytes of a
real ``.keras`` file in 8 chunks (the store does not care what writes the
staged file, only that it is written through the path it gives). The
store's ``on_phase`` hook names every phase a save completes (two saves in
three run on a `CheckpointWriter` thread, as in a run); for a targeted
kill the child SIGKILLs itself when it completes the k-th time the chosen
phase (``model-write``: the k-th chunk written). A timed kill comes from the
server after a given delay. The phase last completed and the last sequence
saved are shared through an anonymous mmap, so they survive the kill.
Each child, and a clean save, resumes first (it loads nothing), as the next
process of a killed run does: it continues the line of the newest
checkpoint, so its saves prune that line to ``keep``.

Commands (one line each; the reply is one line):

    TIME DIR SOURCE SCRATCH        -> seconds one save takes (saved in SCRATCH)
    CLEAN DIR SOURCE               -> the sequence of one undisturbed save
    KILL DIR SOURCE op PHASE K     -> KILLED LAST-PHASE LAST-SEQUENCE
    KILL DIR SOURCE timer - SECS   -> the same

Usage: python saver_server.py PHASE,PHASE,...
"""

from __future__ import annotations

import mmap
import os
import signal
import struct
import sys
import time
import traceback

from jupyter_traincontrol.checkpoint import CheckpointStore, CheckpointWriter, TrainingPosition

assert "tensorflow" not in sys.modules and "keras" not in sys.modules

PHASES = sys.argv[1].split(",")
MAX_SAVES = 12  # a kill point not reached by then is a bug of the test: exit 4
shared = mmap.mmap(-1, 8)


class StandInModel:
    """Writes `data` to the path `save` is given, in 8 chunks."""

    def __init__(self, data: bytes, on_chunk=None):
        self.data = data
        self.on_chunk = on_chunk

    def save(self, path):
        step = -(-len(self.data) // 8)
        with open(path, "wb") as handle:
            for start in range(0, len(self.data), step):
                handle.write(self.data[start:start + step])
                handle.flush()
                if self.on_chunk is not None:
                    self.on_chunk()


def life(directory: str, data: bytes, kill_phase: str | None, kill_at: int) -> None:
    """Saves until killed (or MAX_SAVES, then exit 4)."""
    seen: dict[str, int] = {}

    def reached(phase: str) -> None:
        shared[0:4] = struct.pack("i", PHASES.index(phase) if phase in PHASES else -1)
        seen[phase] = seen.get(phase, 0) + 1
        if phase == kill_phase and seen[phase] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    store = CheckpointStore(directory, keep=2, on_phase=reached)
    store.restore_latest(lambda checkpoint: None)  # the killed run's next process resumes: one line, pruned
    writer = CheckpointWriter(store, "saver")
    model = StandInModel(data, on_chunk=lambda: reached("model-write"))
    for step in range(1, MAX_SAVES + 1):
        reason = "stop" if step % 3 == 0 else "save"  # both flush paths
        position = TrainingPosition(epoch=0, step_in_epoch=step)
        if step % 3 == 1:  # on the training thread, as with save_in_background=False
            checkpoint = store.save(model, position, reason=reason)
        else:  # on the background writer's thread, as a save or a stop does by default
            checkpoint = writer.write(model, position, reason, {})
        shared[4:8] = struct.pack("i", checkpoint.sequence)
    os._exit(4)


def killed_life(directory: str, data: bytes, kill_phase: str | None, kill_at: int, delay: float | None):
    """Runs `life` in a child; returns (killed, last phase, last sequence)."""
    shared[0:8] = struct.pack("ii", -1, 0)
    pid = os.fork()
    if pid == 0:
        try:
            life(directory, data, kill_phase, kill_at)
        except BaseException:
            traceback.print_exc()
        os._exit(3)
    if delay is not None:
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    phase, completed = struct.unpack("ii", shared[0:8])
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    return int(killed), PHASES[phase] if phase >= 0 else "none", completed


def answer(*words) -> None:
    print(*words, flush=True)


def serve() -> None:
    for line in sys.stdin:
        command, directory, source, *rest = line.split()
        with open(source, "rb") as handle:
            data = handle.read()
        if command == "TIME":  # how long one save takes here (in a scratch folder)
            begin = time.perf_counter()
            for step in range(3):
                CheckpointStore(rest[0], keep=2).save(StandInModel(data), TrainingPosition(0, step), reason="save")
            answer((time.perf_counter() - begin) / 3)
        elif command == "CLEAN":  # one undisturbed save
            store = CheckpointStore(directory, keep=2)
            store.restore_latest(lambda checkpoint: None)  # continues the killed runs' line
            checkpoint = store.save(StandInModel(data), TrainingPosition(1, 0), reason="save")
            answer(checkpoint.sequence)
        else:
            mode, target, number = rest
            if mode == "timer":
                answer(*killed_life(directory, data, None, 0, float(number)))
                continue
            completed = 0
            if target == "recovered":  # needs a killed save's intent to recover: leave one first
                completed = killed_life(directory, data, "staged-model", 1, None)[2]
            killed, phase, last = killed_life(directory, data, target, int(number), None)
            answer(killed, phase, max(last, completed))


if __name__ == "__main__":
    serve()
