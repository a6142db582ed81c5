"""Helpers shared by the tests (not fixtures)."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

TESTS_DIR = Path(__file__).parent
REPO = TESTS_DIR.parent
#: The programs tests run in child processes.
PROGRAMS = TESTS_DIR / "programs"


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


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, timeout=10.0, interval=0.02, message="condition"):
    """Polls `predicate` until it is truthy; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"Timed out after {timeout} s waiting for {message}.\n{package_thread_stacks()}")


def package_thread_stacks(prefix: str = "traincontrol-") -> str:
    """Where each live thread named `prefix`* is now (a run's reader, a
    checkpoint writer), and the main thread when another thread asks (a
    `fit` the test drives from a thread of its own trains there): what a
    timed-out wait reports, so that a rare hang says where it hung."""
    import traceback

    frames = sys._current_frames()
    main = threading.main_thread()
    shown = [thread for thread in threading.enumerate()
             if thread.name.startswith(prefix) or (thread is main and thread is not threading.current_thread())]
    stacks = [f"Thread {thread.name}:\n{''.join(traceback.format_stack(frames[thread.ident]))}"
              for thread in shown if thread.ident in frames]
    return "\n".join(stacks) or f"No thread named {prefix}* is alive."


def wait_threads_ended(prefix: str = "traincontrol-", timeout: float = 5.0) -> None:
    """Waits until no thread whose name starts with `prefix` is alive: a
    run's thread ends by itself just after its run's end (nobody joins it)."""
    wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith(prefix)], timeout=timeout,
               message=f"threads named {prefix}* to end")


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
    """Every event of a run, kept by a `RunLifecycle` listener (the run's own
    `events` keeps only the last 50).

    Use: ``log = EventLog(); callback.lifecycle.add_listener(log)``.
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
        """Waits until `count(kind, message)` reaches `at_least`; a failure
        lists the events seen (the last 20)."""
        try:
            wait_until(lambda: self.count(kind, message) >= at_least, timeout=timeout, interval=0.005,
                       message=f"{at_least} {kind} event(s) {message or ''}")
        except AssertionError as error:
            with self._lock:
                seen = [f"{event['kind']}: {event['message']}" for event in self.events[-20:]]
            raise AssertionError(f"{error}\nEvents seen ({len(self.events)}), the last 20:\n  " + "\n  ".join(seen)) from None


def assert_finite_weights(keras_path) -> None:
    """Fails unless every array stored in the ``.keras`` file (the model's
    weights and the optimizer's variables) holds finite numbers only."""
    import io
    import zipfile

    import h5py
    import numpy as np

    with zipfile.ZipFile(keras_path) as archive:
        data = archive.read("model.weights.h5")
    arrays = []
    with h5py.File(io.BytesIO(data), "r") as weights:
        weights.visititems(lambda name, item: arrays.append((name, item[()])) if isinstance(item, h5py.Dataset) else None)
    assert arrays, f"{keras_path} stores no arrays"
    for name, value in arrays:
        value = np.asarray(value)
        assert value.dtype.kind not in "fc" or np.isfinite(value).all(), f"{keras_path}: {name} is not finite"


def read_sidecar(keras_path) -> dict:
    return json.loads(Path(keras_path).with_suffix(".json").read_text())


def results_in(output: str) -> list[dict]:
    """The ``RESULT {json}`` objects a program printed, in order, read where
    they start even when another process's text ran onto the same line."""
    decoder = json.JSONDecoder()
    results = []
    for line in output.splitlines():
        start = line.find("RESULT {")
        if start >= 0:
            results.append(decoder.raw_decode(line, start + len("RESULT "))[0])
    return results


def child_env(runtime_dir: Path | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS_DIR), env.get("PYTHONPATH", "")])
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    # Shell commands in kernels (`!jupyter-traincontrol ...`) find this venv's scripts.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if runtime_dir is not None:
        env["JUPYTER_RUNTIME_DIR"] = str(runtime_dir)
    return env


def run_python(code: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh Python process; returns the completed process."""
    return run_program("-c", code, timeout=timeout, **kwargs)


def run_program(*argv: str, timeout: float = 120, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Runs ``python ARGV`` (a program of tests/programs/, say) to its end,
    in `env` (default: `child_env`)."""
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=env or child_env(), **kwargs
    )


def cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Runs ``jupyter-traincontrol ARGS`` as a user would."""
    exe = Path(sys.executable).parent / "jupyter-traincontrol"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout, env=child_env())


TRAIN_SCRIPT = str(REPO / "examples" / "train_with_control.py")

# Runs the example script as __main__, then keeps the process (and so its run
# record, with the final state) alive until stdin closes, as a kernel would.
_LINGER = (
    "import runpy, sys; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__'); sys.stdin.read()"
)


def press_ctrl_c_twice_the_second_in_a_gc_callback() -> None:
    """Ctrl+C twice in this process, on this (the main) thread. The second
    press is handled inside a garbage-collector callback, as inside JAX's:
    the `KeyboardInterrupt` a handler raises there cannot leave it (Python
    prints it and goes on)."""
    signal.raise_signal(signal.SIGINT)  # handled before it returns: not coalesced with the second
    pressed = []

    def press(phase, info):
        if phase == "start" and not pressed:
            pressed.append(phase)
            signal.raise_signal(signal.SIGINT)

    gc.callbacks.append(press)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(press)
    assert pressed, "the garbage collector did not call back"


def default_signals() -> None:
    """SIGINT and SIGTERM as a terminal or a scheduler finds them (a runner
    started as a background job has SIGINT ignored, and a runner may ignore
    SIGTERM too)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class TrainingProcess:
    """The example training script in a subprocess, started and read.

    Args:
        *args: Arguments of ``examples/train_with_control.py``.
        linger: Keep the process alive after training until `finish`, so its
            record stays listed with its final state (as a notebook kernel's
            run does). Defaults to False.
        script: Another training program that prints the same ``READY NAME
            FIFO`` and ``RESULT {json}`` lines. Defaults to the example.
    """

    def __init__(self, *args: str, linger: bool = False, script: str = TRAIN_SCRIPT):
        argv = [sys.executable, "-c", _LINGER, script, *args] if linger else [sys.executable, script, *args]
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if linger else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
            preexec_fn=default_signals,
        )
        self._stderr_lines: list[str] = []
        self._stderr_changed = threading.Condition()
        stderr, self.process.stderr = self.process.stderr, None  # read by our thread, not communicate()
        self._stderr_reader = threading.Thread(target=self._read_stderr, args=(stderr,), daemon=True)
        self._stderr_reader.start()
        self.stdout = ""  # what it printed: up to READY now, all of it after `finish`
        for line in self.process.stdout:
            self.stdout += line
            if line.startswith("READY "):
                self.name, self.fifo = line.split()[1:3]
                break
        else:  # it ended (or closed its stdout) before saying READY: reaped here, its pipes closed
            try:
                self.process.communicate(timeout=30)  # closes its stdin (a lingering one ends then) and stdout
            except subprocess.TimeoutExpired:
                self.kill()
            self._stderr_reader.join(10)
            raise AssertionError(f"training script ended early (exit code {self.process.returncode}), before READY: "
                                 f"{self.stderr}")

    def _read_stderr(self, stream) -> None:
        for line in stream:
            with self._stderr_changed:
                self._stderr_lines.append(line)
                self._stderr_changed.notify_all()
        stream.close()

    @property
    def stderr(self) -> str:
        """What the process wrote to stderr so far."""
        with self._stderr_changed:
            return "".join(self._stderr_lines)

    def wait_for_stderr(self, text: str, timeout: float = 30) -> None:
        """Blocks until the process has written `text` to stderr."""
        with self._stderr_changed:
            if not self._stderr_changed.wait_for(lambda: text in "".join(self._stderr_lines), timeout):
                raise AssertionError(f"no {text!r} on stderr within {timeout} s: {''.join(self._stderr_lines)}")

    def finish(self, timeout: float = 60) -> tuple[int, dict | None, str]:
        """Waits for the end (closing stdin first); returns (exit code, RESULT, stderr)."""
        out, _ = self.process.communicate(timeout=timeout)
        self.stdout += out
        self._stderr_reader.join(timeout)
        results = results_in(out)
        return self.process.returncode, (results[0] if results else None), self.stderr

    def kill(self) -> None:
        """Ends the process if it still runs (for test teardown). Idempotent.

        A killed process leaves its run folder (FIFO included) behind; listing
        the runs removes the folders of dead processes, as it would for a user.
        Returns once every pipe to the process is closed (its stderr by the
        reader thread, at the end of what it reads).
        """
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()
            from jupyter_traincontrol.registry import list_runs

            list_runs()
        else:
            self.process.communicate()
        self._stderr_reader.join(10)


