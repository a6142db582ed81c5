"""A real IPython kernel driven through jupyter_client, for the notebook tests.

`Kernel` is the examples' `KernelSession` (also used by ``make demo``) with
what the tests add: a prepared tiny model, widget clicks sent as comm
messages, and a cell that is surely busy when an interrupt arrives.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from helpers import REPO, child_env

sys.path.insert(0, str(REPO / "examples"))
from notebook_runner import KernelSession  # noqa: E402

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


class Kernel(KernelSession):
    """A kernel with the tiny model of `MODEL_SETUP` (or `setup`) ready."""

    def __init__(self, cwd: Path, runtime_dir: Path, setup: str | None = MODEL_SETUP, env: dict | None = None):
        super().__init__(cwd, env={**child_env(runtime_dir), **(env or {})})
        if setup:
            result = self.execute(setup, timeout=120)
            assert result.status == "ok", (result.ename, result.evalue)

    def start_busy_cell(self, seconds: float = 30, timeout: float = 60) -> str:
        """Starts a cell that sleeps, and returns once it is surely running
        (it has printed), so an interrupt now finds the kernel busy."""
        return self.start_cell(f"import time; print('busy', flush=True); time.sleep({seconds})", timeout=timeout)

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

