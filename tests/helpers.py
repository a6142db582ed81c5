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


def read_sidecar(keras_path) -> dict:
    return json.loads(Path(keras_path).with_suffix(".json").read_text())


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
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=child_env(), **kwargs
    )


def cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Runs ``jupyter-traincontrol ARGS`` as a user would."""
    exe = Path(sys.executable).parent / "jupyter-traincontrol"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout, env=child_env())
