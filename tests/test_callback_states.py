"""The state of the user's own callbacks across a stop and a resume.

A run with `EarlyStopping(restore_best_weights=True)`,
`ModelCheckpoint(save_best_only=True)` and `ReduceLROnPlateau`, stopped in
the middle of an epoch and resumed in a fresh process with fresh
callbacks, ends exactly as the uninterrupted run: the same stopping epoch,
the same final weights, the same best-model file, the same learning rate
(tests/programs/callback_states.py), on Keras 3 (the backend this suite
runs with) and on Keras 2 (tf_keras, in the TensorFlow pass). Beside it: the protocol a callback
of the user's offers (``state_dict``/``load_state_dict``), the callbacks
a resume names because their state is not kept, and the attachments that
carry the states inside the model part.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import zipfile

import keras
import numpy as np
import pytest

from driving import inject
from helpers import PROGRAMS, build_model, child_env, run_program
from jupyter_traincontrol import ControlCallback
from jupyter_traincontrol.checkpoint import Attached, read_attachment
from jupyter_traincontrol.fit.callback_states import CALLBACKS_ATTACHMENT, CallbackStates, capture

PROGRAM = PROGRAMS / "callback_states.py"


def _leg(out, checkpoints, *legs, keras2=False):
    out.mkdir(exist_ok=True)
    env = {**child_env(), "TF_USE_LEGACY_KERAS": "1"} if keras2 else None
    done = run_program(str(PROGRAM), str(out), str(checkpoints), *legs, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = np.load(out / "result.npz")
    return result, json.loads(str(result["summary"])), done.stdout + done.stderr


@pytest.mark.parametrize("keras2", [False, True], ids=["keras3", "keras2"])
def test_stateful_callbacks_stopped_and_resumed_in_a_fresh_process_end_as_the_uninterrupted_run(tmp_path, keras2):
    if keras2 and (keras.backend.backend() != "tensorflow" or importlib.util.find_spec("tf_keras") is None):
        pytest.skip("Keras 2 runs on TensorFlow, with tf_keras installed")
    leg = functools.partial(_leg, keras2=keras2)
    whole, whole_summary, _ = leg(tmp_path / "whole", tmp_path / "ck-whole", "whole")
    # The scenario holds what it is meant to: EarlyStopping ends the run
    # after the stop's epoch, its best is before it, ReduceLROnPlateau cut
    # the rate before it.
    # The numbers differ by backend: the stop is in the epoch after the best one.
    assert whole_summary["end_reason"] == "callback"
    stop = whole_summary["best_epoch"] + 1
    assert stop < whole_summary["stopped_epoch"] < 29 and whole_summary["learning_rate"] < 0.02

    legs = tmp_path / "legs"
    _, stopped, _ = leg(legs, tmp_path / "ck", f"stop:{stop}:0")
    assert stopped["state"] == "stopped" and stopped["epochs"] == list(range(stop + 1))  # the last one ends early
    resumed_result, resumed, output = leg(legs, tmp_path / "ck", "resume")
    assert "Resume: the state of EarlyStopping, ModelCheckpoint, ReduceLROnPlateau restored." in output
    assert "not restored" not in output

    assert resumed["epochs"] == list(range(stop, whole_summary["stopped_epoch"] + 1))
    for key in ("stopped_epoch", "best", "best_epoch", "plateau", "learning_rate", "end_reason"):
        assert resumed[key] == whole_summary[key], key
    assert resumed["val_loss"] == whole_summary["val_loss"][stop:]
    arrays = [name for name in whole.files if name != "summary"]
    for name in arrays:  # the final weights (restored best), and the best-model file ModelCheckpoint kept
        np.testing.assert_array_equal(resumed_result[name], whole[name], err_msg=name)


class Tally(keras.callbacks.Callback):
    """A callback of the user's that keeps state through the protocol: a count and an array."""

    def __init__(self):
        super().__init__()
        self.epochs_seen, self.trace = 0, np.zeros(3)

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_seen += 1
        self.trace = self.trace + epoch

    def state_dict(self):
        return {"epochs_seen": self.epochs_seen, "trace": self.trace}

    def load_state_dict(self, state):
        self.epochs_seen, self.trace = state["epochs_seen"], state["trace"]


class Forgetful(keras.callbacks.Callback):
    """A callback of the user's with state and no protocol: a resume names it."""


def _fit(model, data, control, *callbacks, epochs=4):
    x, y = data
    return model.fit(x, y, epochs=epochs, batch_size=16, callbacks=[control, *callbacks], verbose=0)


def test_a_callback_with_the_protocol_gets_its_state_back_and_one_without_is_named_once(tiny_data, ckpt, capsys):
    model = build_model()
    control = ControlCallback("tally", checkpoint_dir=ckpt)
    tally = Tally()
    _fit(model, tiny_data, control, tally, inject(control, "stop", 2, 1), Forgetful())  # mid-epoch 3
    assert tally.epochs_seen == 2  # the epoch the stop ended early is not an epoch end for it
    capsys.readouterr()

    fresh, forgetful = Tally(), Forgetful()
    resumed = ControlCallback("tally", checkpoint_dir=ckpt, resume=True)
    _fit(build_model(), tiny_data, resumed, fresh, forgetful)
    assert fresh.epochs_seen == 4  # 2 before the stopped epoch, then it and the last
    np.testing.assert_array_equal(fresh.trace, np.full(3, 0.0 + 1 + 2 + 3))
    said = capsys.readouterr()
    assert "Resume: the state of Tally restored." in said.out
    assert said.err.count("Resume: the state of Forgetful is not restored") == 1
    log = [event["message"] for event in resumed.lifecycle.journal.events]
    assert any("Forgetful is not restored" in message for message in log)


def test_a_checkpoint_carrying_callback_states_still_loads_as_a_keras_model(tiny_data, ckpt):
    model = build_model()
    early = keras.callbacks.EarlyStopping(monitor="loss", patience=50, restore_best_weights=True)
    control = ControlCallback("loads", checkpoint_dir=ckpt)
    _fit(model, tiny_data, control, early)
    newest = control.checkpoints[-1]
    assert f"jupyter_traincontrol/{CALLBACKS_ATTACHMENT}" in zipfile.ZipFile(newest).namelist()
    loaded = keras.models.load_model(newest)
    for mine, theirs in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(mine, theirs)
    states = CallbackStates.read(newest).states
    assert states["EarlyStopping#0"]["best"] == pytest.approx(early.best)
    for kept, live in zip(states["EarlyStopping#0"]["best_weights"], early.best_weights):
        np.testing.assert_array_equal(kept, live)


def test_a_state_that_cannot_be_encoded_is_said_and_the_checkpoint_is_written_without_states(tiny_data, ckpt, capsys):
    class Odd(keras.callbacks.Callback):
        def state_dict(self):
            return {"when": object()}

        def load_state_dict(self, state):
            raise AssertionError("never given back")

    control = ControlCallback("odd", checkpoint_dir=ckpt)
    _fit(build_model(), tiny_data, control, Odd(), epochs=2)
    assert control.state == "finished"
    assert read_attachment(control.checkpoints[-1], CALLBACKS_ATTACHMENT) is None
    assert capsys.readouterr().err.count("Checkpoints keep no callback state: A callback's state holds a object") == 1


def test_attachments_go_into_a_zip_part_or_a_folder_part_and_nothing_else(tmp_path):
    class Writes:
        def __init__(self, kind):
            self.kind = kind

        def save(self, path):
            if self.kind == "zip":
                with zipfile.ZipFile(path, "w") as archive:
                    archive.writestr("model.weights.h5", b"weights")
            elif self.kind == "folder":
                path.mkdir()
            else:
                path.write_bytes(b"torch, say")

    Attached(Writes("zip"), {"a.json": b"{}", "b.npz": lambda: b"late"}).save(tmp_path / "m.keras")
    assert read_attachment(tmp_path / "m.keras", "a.json") == b"{}"
    assert read_attachment(tmp_path / "m.keras", "b.npz") == b"late"
    assert read_attachment(tmp_path / "m.keras", "missing.json") is None
    Attached(Writes("folder"), {"a.json": b"{}"}).save(tmp_path / "m.ckpt")
    assert read_attachment(tmp_path / "m.ckpt", "a.json") == b"{}"
    with pytest.raises(ValueError, match="neither a zip archive"):
        Attached(Writes("other"), {"a.json": b"{}"}).save(tmp_path / "m.pt")
    with pytest.raises(ValueError, match="plain file name"):
        Attached(Writes("zip"), {"../a.json": b"{}"})


def test_capture_keys_callbacks_by_class_and_order_and_skips_the_stateless():
    first = keras.callbacks.ReduceLROnPlateau()
    second = keras.callbacks.ReduceLROnPlateau()
    second.wait = 3
    files = capture([keras.callbacks.History(), first, keras.callbacks.TerminateOnNaN(), second])
    states = json.loads(files[CALLBACKS_ATTACHMENT])["callbacks"]
    assert sorted(states) == ["ReduceLROnPlateau#0", "ReduceLROnPlateau#1"]
    assert states["ReduceLROnPlateau#1"]["wait"] == 3
    assert capture([keras.callbacks.History()]) == {}


def test_a_checkpoint_after_an_epochs_last_batch_says_at_resume_that_the_callbacks_miss_its_end(tiny_data, ckpt, capsys):
    control = ControlCallback("tail", checkpoint_dir=ckpt)
    stop_at_last_batch = inject(control, "stop", 1, 3)  # 64 samples, batches of 16: batch 3 ends epoch 2
    _fit(build_model(), tiny_data, control, Tally(), stop_at_last_batch)
    assert json.loads(read_attachment(control.checkpoints[-1], CALLBACKS_ATTACHMENT))["epoch_end_pending"] == 1
    capsys.readouterr()
    _fit(build_model(), tiny_data, ControlCallback("tail", checkpoint_dir=ckpt, resume=True), Tally())
    assert capsys.readouterr().err.count("Resume is not exact for Tally: the checkpoint was taken after epoch 2's "
                                         "last batch, before its end") == 1
