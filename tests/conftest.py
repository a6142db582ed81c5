"""Shared fixtures: an isolated registry per test, tiny models, and a leak check.

Every test gets its own ``JUPYTER_RUNTIME_DIR``, so runs never meet runs of
other tests or of the developer. The autouse `no_leaks` fixture fails a test
that leaves behind a reader thread, a FIFO, an active run record, a changed
SIGINT or SIGTERM handler, a profile function or open file descriptors.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

TESTS_DIR = Path(__file__).parent
sys.path.insert(0, str(TESTS_DIR))


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path, monkeypatch):
    """A private Jupyter runtime dir for this test; returns the registry folder."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    return runtime / "traincontrol"


def _open_fds() -> set[int]:
    try:
        return {int(name) for name in os.listdir("/proc/self/fd")}
    except FileNotFoundError:  # not Linux
        return set()


def _our_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("traincontrol-")]


def _fifos_under(folder: Path) -> list[Path]:
    if not folder.exists():
        return []
    return [p for p in folder.rglob("*") if stat.S_ISFIFO(os.lstat(p).st_mode)]


@pytest.fixture(autouse=True)
def no_leaks(runtime_dir, request):
    """Fails the test if it leaves threads, FIFOs, active runs, handlers or fds."""
    if "allow_leaks" in request.keywords:
        yield
        return
    handler_before = signal.getsignal(signal.SIGINT)
    sigterm_before = signal.getsignal(signal.SIGTERM)
    profile_before = sys.getprofile()
    fds_before = _open_fds()
    yield
    deadline = time.monotonic() + 5
    while _our_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    problems = []
    if _our_threads():
        problems.append(f"threads still alive: {[t.name for t in _our_threads()]}")
    if _fifos_under(runtime_dir):
        problems.append(f"FIFOs left: {_fifos_under(runtime_dir)}")
    from jupyter_traincontrol.system.private_fs import UnsafePathError
    from jupyter_traincontrol.protocol import ACTIVE_STATES
    from jupyter_traincontrol.registry import list_runs

    try:
        records = list_runs(runtime_dir)
    except UnsafePathError:  # a test planted something there on purpose
        records = []
    active = [r["name"] for r in records if r.get("state") in ACTIVE_STATES and r.get("pid") == os.getpid()]
    if active:
        problems.append(f"runs of this process still active: {active}")
    if signal.getsignal(signal.SIGINT) != handler_before:
        problems.append(f"SIGINT handler changed: {signal.getsignal(signal.SIGINT)!r}")
    if signal.getsignal(signal.SIGTERM) != sigterm_before:
        problems.append(f"SIGTERM handler changed: {signal.getsignal(signal.SIGTERM)!r}")
    if sys.getprofile() is not profile_before:
        problems.append(f"profile function changed: {sys.getprofile()!r}")
    leaked_fds = _open_fds() - fds_before
    # TensorFlow opens a few descriptors of its own on first use; count only
    # pipes and FIFOs, which are what this package opens.
    leaked_pipes = [fd for fd in leaked_fds if _is_pipe(fd)]
    if leaked_pipes:
        problems.append(f"pipe/FIFO descriptors left open: {leaked_pipes}")
    assert not problems, "; ".join(problems)


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def pytest_configure(config):
    config.addinivalue_line("markers", "allow_leaks: skip the leak check (for tests that check leaks themselves)")
    config.addinivalue_line(
        "markers",
        "backends(*names, reason): run only on these Keras backends (KERAS_BACKEND); "
        "elsewhere the test is skipped with the reason",
    )


def pytest_collection_modifyitems(config, items):
    """The backend matrix: `make test` runs the core files again with
    KERAS_BACKEND=jax and =torch; a test that cannot run on a backend says
    why with the `backends` marker."""
    backend = os.environ["KERAS_BACKEND"]
    for item in items:
        marker = item.get_closest_marker("backends")
        if marker is not None and backend not in marker.args:
            reason = marker.kwargs.get("reason", f"runs on {', '.join(marker.args)} only")
            item.add_marker(pytest.mark.skip(reason=f"not on {backend}: {reason}"))


@pytest.fixture
def tiny_data():
    """64 samples of 3 features; the target is their sum."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.random((64, 3), dtype="float32")
    return x, x.sum(axis=1, keepdims=True)


@pytest.fixture
def ckpt(tmp_path):
    """A checkpoint folder for the test's run (not created)."""
    return tmp_path / "ck"


@pytest.fixture
def make_model():
    """Builds a one-layer regression model, compiled with Adam."""
    from helpers import build_model

    return build_model


@pytest.fixture
def live_run(tmp_path):
    """A listening run in this process, in the middle of epoch 3 of 20 (no
    Keras needed to receive commands); its driver's counters are ``source``."""
    from jupyter_traincontrol.boundary.progress import TrainingProgress
    from jupyter_traincontrol.run import RunLifecycle

    control = RunLifecycle("alpha", tmp_path / "ck").open()
    control._folder.tidy_up()  # its claim's sweep of dead runs, now: not of a folder a test plants later
    control.move_to("running")
    progress = TrainingProgress(epoch=2)
    progress.epoch_begun, progress.epochs, progress.step, progress.steps = True, 20, 7, 50
    progress.metrics = {"loss": 0.213456}
    control.follow(progress)
    control.history.record_epoch(0, {"loss": 0.5, "val_loss": 0.6})
    control.publish(force=True)
    yield control
    control.close("stopped")


@pytest.fixture
def ctrl_c():
    """Ctrl+C as a terminal gives it (Python's handler), whatever this test
    runner inherited: a runner started as a background job has SIGINT ignored."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, inherited)


@pytest.fixture
def kernel(tmp_path, runtime_dir):
    """A real IPython kernel with a tiny model (`kernel_harness.Kernel`), shut down pass or fail."""
    from kernel_harness import kernel_session

    with kernel_session(tmp_path, runtime_dir) as session:
        yield session


@pytest.fixture
def training():
    """Starts the example training script (`helpers.TrainingProcess`); kills
    what still runs at teardown (a failed test)."""
    from helpers import TrainingProcess

    started = []

    def start(*args, **kwargs):
        process = TrainingProcess(*args, **kwargs)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
