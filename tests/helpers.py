"""Helpers shared by the tests (not fixtures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

TESTS_DIR = Path(__file__).parent
REPO = TESTS_DIR.parent


def build_model(seed: int = 0):
    """A one-layer regression model on 3 features, compiled with Adam."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


class At:
    """A callback that runs `action(callback)` once at (epoch, batch)."""

    def __new__(cls, epoch, batch, action, *, hook="on_train_batch_end"):
        import keras

        class _At(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.epoch = -1
                self.fired = False
                self.train_end_called = False

            def on_epoch_begin(self, e, logs=None):
                self.epoch = e

            def on_train_end(self, logs=None):
                self.train_end_called = True

        def handler(self, batch_index, logs=None):
            if not self.fired and self.epoch == epoch and batch_index == batch:
                self.fired = True
                action(self)

        setattr(_At, hook, handler)
        return _At()


def wait_until(predicate, timeout=10.0, interval=0.02, message="condition"):
    """Polls `predicate` until it is truthy; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"Timed out after {timeout} s waiting for {message}")


def unread_bytes(fifo) -> int:
    """Bytes written to a FIFO that its reader has not read yet.

    Opens a write end without blocking (the FIFO must have a reader) and asks
    the kernel (FIONREAD), so a test can wait until the reader has consumed
    a partial line before writing the rest.
    """
    import fcntl
    import struct
    import termios

    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    finally:
        os.close(fd)


def wait_drained(fifo, timeout=10.0) -> None:
    """Waits until the reader has read everything written to `fifo`."""
    wait_until(lambda: unread_bytes(fifo) == 0, timeout=timeout, interval=0.005, message=f"{fifo} to be read")


class EventLog:
    """Every event of a run, kept by a `RunControl` listener (the run's own
    `events` keeps only the last 50).

    Use: ``log = EventLog(); callback.control.add_listener(log)``.
    """

    def __init__(self):
        import threading

        self.events: list[dict] = []
        self._lock = threading.Lock()

    def __call__(self, control, event) -> None:
        if event is not None:
            with self._lock:
                self.events.append(dict(event))

    def count(self, kind: str, message: str | None = None) -> int:
        """Events of `kind` (whose message starts with `message`, if given)."""
        with self._lock:
            return sum(
                1 for e in self.events if e["kind"] == kind and (message is None or e["message"].startswith(message))
            )

    def messages(self, kind: str) -> list[str]:
        """Messages of the events of `kind`, in order."""
        with self._lock:
            return [e["message"] for e in self.events if e["kind"] == kind]

    def wait_count(self, kind: str, message: str | None, at_least: int, timeout: float = 10.0) -> None:
        """Waits until `count(kind, message)` reaches `at_least`."""
        wait_until(lambda: self.count(kind, message) >= at_least, timeout=timeout, interval=0.005,
                   message=f"{at_least} {kind} event(s) {message or ''}")


def read_sidecar(keras_path) -> dict:
    return json.loads(Path(keras_path).with_suffix(".json").read_text())


def child_env(runtime_dir: Path | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS_DIR), env.get("PYTHONPATH", "")])
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if runtime_dir is not None:
        env["JUPYTER_RUNTIME_DIR"] = str(runtime_dir)
    return env


def run_python(code: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh Python process; returns the completed process."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=child_env(), **kwargs
    )


def cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Runs ``jupyter-traincontrol ARGS`` as a user would."""
    exe = Path(sys.executable).parent / "jupyter-traincontrol"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout, env=child_env())

