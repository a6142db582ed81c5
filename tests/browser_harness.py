"""What the browser tests share: a Jupyter server in a subprocess, Chromium, a training notebook.

A real JupyterLab (or Notebook 7, or classic Notebook) server runs in a
subprocess with private Jupyter folders; Debian's chromium is driven by
Playwright (no downloaded browser). Screenshots go under
``test-artifacts/browser/`` (ignored by git); their paths are printed.

The fixtures (`browser`, `page`, `jupyter`) are imported by the test modules.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import REPO, free_port, wait_until

CHROMIUM = "/usr/bin/chromium"
TOKEN = "traincontrol-browser-test"
ARTIFACTS = REPO / "test-artifacts" / "browser"
PANEL = "#jp-traincontrol-panel"
PANEL_TAB = '.jp-SideBar li[data-id="jp-traincontrol-panel"]'
STATUS_ITEM = ".jp-TrainControl-status"

#: Skips a browser test module where Debian's chromium is missing.
NEEDS_CHROMIUM = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium) to run the browser tests",
)

class JupyterServer:
    """`jupyter lab` or `jupyter notebook` in a subprocess, with private Jupyter folders.

    The runtime dir is the test's, so the server sees the runs the test starts.

    Args:
        app: ``"lab"``, ``"notebook"`` (Notebook 7), ``"nbclassic"`` (classic
            Notebook on jupyter_server) or ``"notebook6"`` (classic Notebook 6's
            own server, as the Colab pass has it: `notebook6_argv`).
        home: A private folder for the server's config, data, settings and notebooks.
        server_extension: Enable the jupyter_traincontrol server extension.
    """

    def __init__(self, app: str, home: Path, *, server_extension: bool = True):
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config, data, settings, workspaces, root = (home / name for name in ("config", "data", "settings", "workspaces", "root"))
        self.root = root
        for folder in (config, data, settings, workspaces, root):
            folder.mkdir(parents=True, exist_ok=True)
        # No first-run "news / updates" toast over the page.
        notification = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
        notification.parent.mkdir(parents=True)
        notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        env = {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(config),
            "JUPYTER_DATA_DIR": str(data),
            "JUPYTERLAB_SETTINGS_DIR": str(settings),
            "JUPYTERLAB_WORKSPACES_DIR": str(workspaces),
        }
        argv = [
            sys.executable, "-m", "jupyter", app, "--no-browser", "--allow-root",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
        ]
        if app == "notebook6":
            argv = notebook6_argv(self.port, root)
        elif app != "nbclassic":  # classic Notebook is `Jupyter` in the page anyway
            app_class = "LabApp" if app == "lab" else "JupyterNotebookApp"
            argv.append(f"--{app_class}.expose_app_in_browser=True")
        if not server_extension:  # the command line wins over the config files that enable it
            argv += ["--ServerApp.jpserver_extensions", "jupyter_traincontrol=False"]
        self.log_path = home / f"jupyter-{app}.log"
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        wait_until(self._answers, timeout=60, interval=0.2, message=f"jupyter {app} to answer on {self.url} (log: {self.log_path})")

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"jupyter exited with {self.process.returncode}: {self.log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/api/status?token={TOKEN}", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def notebook6_argv(port: int, root: Path) -> list[str]:
    """The command line of classic Notebook 6's server (``NotebookApp``, not
    jupyter_server's ``ServerApp``), of this test's Python."""
    return [
        sys.executable, "-m", "notebook", "--no-browser", "--allow-root", "--NotebookApp.ip=127.0.0.1",
        f"--NotebookApp.port={port}", "--NotebookApp.port_retries=0", f"--NotebookApp.token={TOKEN}",
        f"--NotebookApp.notebook_dir={root}",
    ]


@pytest.fixture
def browser():
    """Chromium, started per test: Playwright's sync API runs an event loop of
    its own, which must be gone before pytest-jupyter closes the test's loop."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
            ],
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    yield page
    context.close()


@pytest.fixture
def jupyter(tmp_path):
    """Starts a Jupyter server for this test; stops it at teardown."""
    servers = []

    def start(app: str = "lab", **kwargs) -> JupyterServer:
        server = JupyterServer(app, tmp_path / f"jupyter-{app}-{len(servers)}", **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()




def screenshot(target, name: str) -> Path:
    """Saves a screenshot of a page or element under test-artifacts/browser/ and prints its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    target.screenshot(path=str(path))
    print(f"screenshot: {path}")
    return path


def words(locator) -> str:
    """The text of an element, non-breaking spaces read as spaces."""
    return locator.inner_text().replace("\u00a0", " ")


def open_lab(page, server: JupyterServer) -> None:
    page.goto(f"{server.url}/lab?token={TOKEN}")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell")
    page.wait_for_selector(PANEL_TAB)


def notebook_json(cells: list[str]) -> str:
    """A notebook of code `cells`, with a kernelspec (no kernel dialog), as JSON text."""
    return json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source} for source in cells],
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    })


TRAIN_CELLS = [
    # 0: the extension, data and a model that trains at a watchable pace
    """%load_ext jupyter_traincontrol
import time
import numpy as np
import keras

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")

def build_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model

class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.05)""",
    # 1: a run in the background
    """%%interruptible_fit --name nb-busy --checkpoint-dir {ck}/nb-busy
history = build_model().fit(x, y, epochs=200, validation_split=0.125, callbacks=[Slow()], verbose=0)""",
    # 2: a long foreground cell: the kernel is busy, widget buttons cannot reach it
    """for _ in range(1200):
    time.sleep(0.1)
print("foreground cell done")""",
    # 3: another run, to be stopped from its own panel while the kernel is idle
    """%%interruptible_fit --name nb-idle --checkpoint-dir {ck}/nb-idle
history = build_model().fit(x, y, epochs=200, validation_split=0.125, callbacks=[Slow()], verbose=0)""",
    # 4: a run that keeps its own cell busy until it ends
    """%%interruptible_fit --wait --name nb-wait --checkpoint-dir {ck}/nb-wait
history = build_model().fit(x, y, epochs=200, validation_split=0.125, callbacks=[Slow()], verbose=0)
print("wait cell done")""",
]

_KERNEL_STATE = """() => {
    const widget = window.jupyterapp.shell.currentWidget;
    const kernel = widget && widget.sessionContext && widget.sessionContext.session
        && widget.sessionContext.session.kernel;
    return kernel ? `${kernel.connectionStatus}/${kernel.status}` : null;
}"""


def kernel_state(page) -> str | None:
    return page.evaluate(_KERNEL_STATE)


def run_cell(page, index: int) -> None:
    """Runs cell `index` with Shift+Enter, as a user would."""
    page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")


def wait_idle(page, timeout: float = 90) -> None:
    # The execution indicator says idle before the kernel exists; ask the kernel itself.
    wait_until(lambda: kernel_state(page) == "connected/idle", timeout=timeout, interval=0.2,
               message=f"an idle kernel (got {kernel_state(page)})")


def open_notebook(page, server: JupyterServer, name: str = "train.ipynb") -> None:
    """Opens the notebook `name` of the server's root, in JupyterLab or Notebook 7, and waits for its kernel."""
    where = "lab/tree" if server.app == "lab" else "notebooks"
    page.goto(f"{server.url}/{where}/{name}?token={TOKEN}")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell")
    page.locator(".jp-Notebook .jp-Cell").first.wait_for()
    wait_idle(page)


def open_classic_notebook(page, server: JupyterServer, cells: list[str], tmp_path, timeout_ms: float = 90_000) -> None:
    """Writes a notebook of `cells` (``{ck}``: the test's checkpoint folder)
    as ``train.ipynb``, opens it in classic Notebook (Notebook 6, or
    nbclassic's), and waits for its kernel to connect."""
    (server.root / "train.ipynb").write_text(notebook_json([source.replace("{ck}", str(tmp_path / "ck"))
                                                            for source in cells]))
    where = "nbclassic/notebooks" if server.app == "nbclassic" else "notebooks"
    page.goto(f"{server.url}/{where}/train.ipynb?token={TOKEN}")
    page.wait_for_function("() => window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel"
                           " && Jupyter.notebook.kernel.is_connected()", timeout=timeout_ms)


def start_training_notebook(jupyter, page, tmp_path, app: str = "lab", cells: list[str] = TRAIN_CELLS) -> JupyterServer:
    """Opens a notebook of `cells` (`TRAIN_CELLS` by default) in JupyterLab
    (or Notebook 7, with ``app="notebook"``) and runs its first cell (the
    setup) and its second (by default the ``%%interruptible_fit`` run
    ``nb-busy``). ``{ck}`` in a cell is the test's checkpoint folder."""
    server = jupyter(app)
    cells = [cell.replace("{ck}", str(tmp_path / "ck")) for cell in cells]
    (server.root / "train.ipynb").write_text(notebook_json(cells))
    open_notebook(page, server)
    run_cell(page, 0)
    wait_idle(page)
    run_cell(page, 1)
    return server


def restart_kernel(page) -> None:
    """Restarts the notebook's kernel as Kernel > Restart Kernel does (and confirms it)."""
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:restart-kernel'); }")  # not awaited: a dialog
    page.locator(".jp-Dialog .jp-mod-accept").click()
    wait_idle(page, timeout=60)


def record_of(name: str) -> dict:
    """The run's record in the registry (this test's runtime dir), or {}."""
    from jupyter_traincontrol.registry import list_runs

    return next((record for record in list_runs(clean=False) if record.get("name") == name), {})


def timed(predicate, timeout: float, message: str) -> float:
    """Seconds until `predicate` holds (polled every 20 ms)."""
    import time

    started = time.monotonic()
    wait_until(predicate, timeout=timeout, interval=0.02, message=message)
    return time.monotonic() - started


def assert_kernel_still_busy(page) -> None:
    """Checks that the busy cell still runs once a click has acted.

    The busy cell (`time.sleep` in a loop) runs two minutes and a run trains
    for longer, so a click that acts while that cell still runs did not wait
    for the kernel. How soon it acts is printed, not asserted (this machine
    is shared; the latency figures are in benchmarks/).
    """
    assert kernel_state(page) == "connected/busy", "the busy cell should still run: the click waited for the kernel"
