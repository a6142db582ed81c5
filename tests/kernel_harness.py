"""A real IPython kernel driven through jupyter_client, for the notebook tests."""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path

from helpers import child_env

BASE_SETUP = """
import time, numpy as np, keras
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).random((64, 3), dtype="float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
class Slow(keras.callbacks.Callback):
    def __init__(self, seconds): super().__init__(); self.seconds = seconds
    def on_train_batch_end(self, batch, logs=None): time.sleep(self.seconds)
class SlowValidation(keras.callbacks.Callback):
    def __init__(self, seconds): super().__init__(); self.seconds = seconds
    def on_test_batch_begin(self, batch, logs=None): time.sleep(self.seconds)
import jupyter_traincontrol
"""
MODEL_SETUP = BASE_SETUP + "%load_ext jupyter_traincontrol\n"


class ExecuteResult:
    """What one execute request produced."""

    def __init__(self, reply: dict | None, messages: list[dict]):
        self.reply = reply
        self.messages = messages

    @property
    def status(self) -> str | None:
        return self.reply["content"]["status"] if self.reply else None

    @property
    def stdout(self) -> str:
        return "".join(m["content"]["text"] for m in self.messages if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")

    @property
    def stderr(self) -> str:
        return "".join(m["content"]["text"] for m in self.messages if m["msg_type"] == "stream" and m["content"]["name"] == "stderr")

    @property
    def ename(self) -> str | None:
        """The exception name of a failed cell, from its reply (UsageErrors
        have no error message on iopub, only the reply and stderr)."""
        return self.reply["content"].get("ename") if self.reply else None

    @property
    def evalue(self) -> str | None:
        return self.reply["content"].get("evalue") if self.reply else None

    @property
    def error(self) -> dict | None:
        for m in self.messages:
            if m["msg_type"] == "error":
                return m["content"]
        return None

    @property
    def results(self) -> list[dict]:
        return [m["content"]["data"] for m in self.messages if m["msg_type"] in ("execute_result", "display_data")]


class Kernel:
    """A kernel process with its client; `execute` runs a cell and collects its output."""

    def __init__(self, cwd: Path, runtime_dir: Path, setup: str | None = MODEL_SETUP):
        from jupyter_client.manager import start_new_kernel

        env = child_env(runtime_dir)
        self.km, self.kc = start_new_kernel(kernel_name="python3", cwd=str(cwd), env=env, startup_timeout=90)
        self.cwd = cwd
        if setup:
            result = self.execute(setup, timeout=120)
            assert result.status == "ok", result.error

    def execute(self, code: str, timeout: float = 60, wait: bool = True):
        """Runs a cell. With wait=False returns its msg_id at once."""
        msg_id = self.kc.execute(code)
        if not wait:
            return msg_id
        return self.collect(msg_id, timeout)

    def start_busy_cell(self, seconds: float = 30, timeout: float = 60) -> str:
        """Starts a cell that sleeps, and returns once it is surely running
        (it has printed), so an interrupt now finds the kernel busy."""
        msg_id = self.kc.execute(f"import time; print('busy', flush=True); time.sleep({seconds})")
        deadline = time.monotonic() + timeout
        self._early: list[dict] = []
        while time.monotonic() < deadline:
            msg = self.kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            self._early.append(msg)
            if msg["msg_type"] == "stream" and "busy" in msg["content"]["text"]:
                return msg_id
        raise TimeoutError("the busy cell did not start")

    def collect(self, msg_id: str, timeout: float = 60) -> ExecuteResult:
        """Collects the iopub messages and the reply of an execute request."""
        deadline = time.monotonic() + timeout
        messages = list(getattr(self, "_early", []))
        self._early = []
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            messages.append(msg)
        else:
            raise TimeoutError(f"cell did not finish within {timeout} s")
        reply = None
        while time.monotonic() < deadline:
            try:
                candidate = self.kc.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if candidate["parent_header"].get("msg_id") == msg_id:
                reply = candidate
                break
        return ExecuteResult(reply, messages)

    def value(self, expression: str, timeout: float = 30):
        """Evaluates `expression` in the kernel and returns it (JSON-able)."""
        result = self.execute(f"import json as _json; print(_json.dumps({expression}))", timeout=timeout)
        assert result.status == "ok", result.error
        return json.loads(result.stdout.strip().splitlines()[-1])

    def wait_for(self, expression: str, timeout: float = 30, interval: float = 0.2):
        """Polls `expression` in the kernel until it is truthy; returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.value(expression)
            if value:
                return value
            time.sleep(interval)
        raise AssertionError(f"Timed out after {timeout} s waiting for kernel expression {expression!r}")

    def click(self, model_id: str) -> None:
        """Clicks a widget Button exactly as a browser does: a comm message."""
        content = {"comm_id": model_id, "data": {"method": "custom", "content": {"event": "click"}}}
        msg = self.kc.session.msg("comm_msg", content)
        self.kc.shell_channel.send(msg)

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def alive(self) -> bool:
        return self.km.is_alive()

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)
