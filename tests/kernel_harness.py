"""A real IPython kernel driven through jupyter_client, for the notebook tests.

`Kernel` is the examples' `KernelSession` (also used by ``make demo``) with
what the tests add: a prepared tiny model, widget clicks sent as comm
messages, and a cell that is surely busy when an interrupt arrives.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from helpers import REPO, child_env

sys.path.insert(0, str(REPO / "examples"))
from notebook_runner import CellOutputs, KernelSession  # noqa: E402

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
class SlowBatches(keras.utils.PyDataset):  # slow data, not a callback: a stop hides a partial epoch's from callbacks
    def __init__(self, x, y, seconds): super().__init__(); self.x, self.y, self.seconds = x, y, seconds
    def __len__(self): return len(self.x) // 8
    def __getitem__(self, i): time.sleep(self.seconds); return self.x[i * 8:(i + 1) * 8], self.y[i * 8:(i + 1) * 8]
import jupyter_traincontrol
"""
MODEL_SETUP = BASE_SETUP + "%load_ext jupyter_traincontrol\n"
_STACKS_MARK = "The kernel's threads when the test stopped waiting:"


class Kernel(KernelSession):
    """A kernel with the tiny model of `MODEL_SETUP` (or `setup`) ready."""

    def __init__(self, cwd: Path, runtime_dir: Path, setup: str | None = MODEL_SETUP, env: dict | None = None):
        super().__init__(cwd, env={**child_env(runtime_dir), **(env or {})})
        self._stacks = Path(cwd) / "kernel-stacks.txt"
        if setup:
            # A test that times out waiting for the kernel shows where each of its threads was (`thread_stacks`),
            # or, if the kernel crashed, the stacks faulthandler wrote as it died.
            dump_stacks = (
                f"__stacks = open({str(self._stacks)!r}, 'w')\n"
                "__import__('faulthandler').register(__import__('signal').SIGUSR1, file=__stacks, all_threads=True)\n"
                "__import__('faulthandler').enable(file=__stacks, all_threads=True)\n"
                "del __stacks\n"
            )
            result = self.execute(dump_stacks + setup, timeout=120)
            assert result.status == "ok", (result.ename, result.evalue)

    def collect(self, msg_id: str, timeout: float = 120) -> CellOutputs:
        """`KernelSession.collect`; a timeout shows the kernel's thread stacks."""
        try:
            return super().collect(msg_id, timeout)
        except TimeoutError as error:
            raise self._with_stacks(error) from None

    def wait_for(self, expression: str, timeout: float = 60, interval: float = 0.2):
        """`KernelSession.wait_for`; a timeout shows the kernel's thread stacks."""
        try:
            return super().wait_for(expression, timeout, interval)
        except TimeoutError as error:
            raise self._with_stacks(error) from None

    def thread_stacks(self) -> str:
        """The Python stacks of the kernel's threads now (faulthandler's dump
        on SIGUSR1, registered with the setup); for a kernel that has died,
        how it ended and what faulthandler wrote as it died."""
        if not self._stacks.exists():
            return "(no stacks: this kernel had no setup cell)"
        process = self.km.provisioner.process
        before = self._stacks.stat().st_size
        if process.poll() is None:
            os.kill(process.pid, signal.SIGUSR1)
            deadline = time.monotonic() + 3
            while self._stacks.stat().st_size == before and time.monotonic() < deadline and process.poll() is None:
                time.sleep(0.05)
        if process.poll() is not None:  # dead: what faulthandler wrote as it died is in the file
            return f"(the kernel process has ended, exit status {process.returncode})\n{self._stacks.read_text()}"
        return self._stacks.read_text()[before:] or "(no stacks: the kernel did not dump them within 3 s)"

    def _with_stacks(self, error: TimeoutError) -> TimeoutError:
        if _STACKS_MARK in str(error):
            return error  # a cell of `wait_for` timed out: its stacks are there already
        return TimeoutError(f"{error}\n{_STACKS_MARK}\n{self.thread_stacks()}")

    def start_busy_cell(self, seconds: float = 30, timeout: float = 60) -> str:
        """Starts a cell that sleeps, and returns once it is surely running
        (it has printed), so an interrupt now finds the kernel busy.

        The cell sleeps in short naps (`busy_sleep`), as a cell that computes
        runs Python code between its calls: Linux may hand a process's SIGINT
        to another of its threads (one that can take it at once), and then
        CPython runs the handler when the main thread next runs Python code;
        one long ``time.sleep`` would hide the interrupt until it returns.
        """
        return self.start_cell(f"import time; print('busy', flush=True)\n{busy_sleep(seconds)}", timeout=timeout)

    def start_cell(self, code: str, timeout: float = 60) -> str:
        """Starts a cell whose code prints 'busy' once it runs, and returns
        its msg_id once it has printed it."""
        msg_id = self.kc.execute(code)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            self._early.append(msg)
            if msg["msg_type"] == "stream" and "busy" in msg["content"]["text"]:
                return msg_id
        raise TimeoutError("the busy cell did not start")

    def click(self, model_id: str) -> None:
        """Clicks a widget Button exactly as a browser does: a comm message."""
        content = {"comm_id": model_id, "data": {"method": "custom", "content": {"event": "click"}}}
        self.kc.shell_channel.send(self.kc.session.msg("comm_msg", content))


TERMINAL_SESSION = (
    "import numpy as np, keras\n"
    "x = np.random.rand(64, 3).astype('float32'); y = x.sum(1, keepdims=True)\n"
    "model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]); model.compile('adam', 'mse')\n"
    "%load_ext jupyter_traincontrol\n"
    "run = get_ipython().run_cell_magic('interruptible_fit', '--name term', 'model.fit(x, y, epochs=2, verbose=0)')\n"
    "run.wait()\n"
)


def run_terminal_session(tmp_path: Path, runtime_dir: Path, then: str):
    """Runs a plain IPython terminal session (no kernel, no widgets) that
    trains `model` under ``%%interruptible_fit --name term`` and waits for
    `run`, then runs the lines `then`. Returns the completed process."""
    import subprocess

    runtime_dir.parent.mkdir(exist_ok=True)
    script = tmp_path / "session.ipy"
    script.write_text(TERMINAL_SESSION + then)
    ipython = str(Path(sys.executable).parent / "ipython")
    return subprocess.run([ipython, "--no-banner", "--quick", str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env=child_env(runtime_dir.parent), timeout=120)


def busy_sleep(seconds: float, indent: str = "") -> str:
    """Cell code that sleeps `seconds` in 50 ms naps (see `Kernel.start_busy_cell`)."""
    return f"{indent}for _ in range({round(seconds * 20)}):\n{indent}    time.sleep(0.05)\n"


#: The newest run of the kernel, as the kernel names it.
RUN = "jupyter_traincontrol.runs()[-1]"
#: A cell that trains the harness's model under ``%%interruptible_fit``.
FIT_CELL = """%%interruptible_fit --name {name} {options}
history = model.fit(x, y, batch_size=8, epochs={epochs}, callbacks=[Slow({sleep})], verbose=0)
"""


def start_fit(kernel: Kernel, name: str, epochs: int = 200, sleep: float = 0.01, options: str = ""):
    """Runs `FIT_CELL` in `kernel` and returns its result once the run trains."""
    result = kernel.execute(FIT_CELL.format(name=name, options=options, epochs=epochs, sleep=sleep))
    assert result.status == "ok", result.error
    kernel.wait_for(f"{RUN}.state == 'running' and {RUN}.lifecycle.progress.step > 0", timeout=60)
    return result


@contextlib.contextmanager
def kernel_session(tmp_path: Path, runtime_dir: Path):
    """A test's `Kernel`, shut down on leaving (pass or fail)."""
    runtime_dir.parent.mkdir(exist_ok=True)
    kernel = Kernel(tmp_path, runtime_dir.parent)
    try:
        yield kernel
    finally:
        if kernel.alive():
            kernel.shutdown()

