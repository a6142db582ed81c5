"""Exact resume: a seeded run stopped and resumed in a new process ends
bit-identical to an uninterrupted one (weights, optimizer state, and the
History of the epochs after the resumed one).

Each leg runs in a fresh process (tests/programs/exact_resume.py) on the
backend this suite runs with (``KERAS_BACKEND``). A tiny Dense model with
Dropout, 3 epochs of 5 batches.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from helpers import child_env

PROGRAM = __import__("pathlib").Path(__file__).parent / "programs" / "exact_resume.py"


def _leg(data, mode, stop, out, checkpoints):
    done = subprocess.run([sys.executable, str(PROGRAM), data, mode, str(stop), str(out), str(checkpoints)],
                          env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out)


@pytest.mark.parametrize("data", ["numpy-shuffle", "numpy-ordered"])
@pytest.mark.parametrize("stop", [7, 5], ids=["mid-epoch", "epoch-end"])
def test_stopped_and_resumed_run_equals_an_uninterrupted_one(data, stop, tmp_path):
    import keras

    if keras.backend.backend() == "torch" and stop % 5 == 0:
        pytest.xfail("torch: a stop on an epoch's last batch resumes with a different global torch RNG state "
                     "(draws between that boundary and the next epoch's start are not captured yet)")
    full = _leg(data, "full", 0, tmp_path / "full.npz", tmp_path / "ck-full")
    _leg(data, "stop", stop, tmp_path / "stop.npz", tmp_path / "ck")
    resumed = _leg(data, "resume", 0, tmp_path / "resumed.npz", tmp_path / "ck")
    arrays = [name for name in full.files if name != "history"]
    for name in arrays:
        assert np.array_equal(full[name], resumed[name]), f"{name} differs"
    full_history, resumed_history = (json.loads(str(leg["history"])) for leg in (full, resumed))
    first = resumed_history["epoch"][0]
    assert first == stop // 5  # mid-epoch: the epoch of the stop; at its end: the next
    complete = slice(1, None) if stop % 5 else slice(0, None)  # the resumed partial epoch's loss averages fewer batches
    assert resumed_history["loss"][complete] == full_history["loss"][first:][complete]
