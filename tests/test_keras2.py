"""Keras 2 (tf_keras): ControlCallback in its real `fit`, a script, and %%interruptible_fit in a real kernel.

The model is Keras 2's own: ``tf.keras`` when ``TF_USE_LEGACY_KERAS=1``
(the Keras 2 pass of ``make test``; TensorFlow then routes ``tf.keras`` to
tf_keras), else ``import tf_keras``. Tiny models, 8 batches an epoch.
"""

from __future__ import annotations

import html
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from helpers import PROGRAMS, child_env, cli, read_sidecar, wait_until
from jupyter_traincontrol import ControlCallback
from jupyter_traincontrol.fit.keras2 import NOTICE
from jupyter_traincontrol.notebook.fit_hook import FitInterceptor, intercept_fit
from jupyter_traincontrol.protocol import parse_request
from jupyter_traincontrol.registry import find_run
from jupyter_traincontrol.transport.channels import deliver, with_id
from kernel_harness import RUN

if os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True"):
    import tensorflow as tf

    k2 = tf.keras  # Keras 2 as TensorFlow routes it
    assert k2.Model.__module__.startswith("tf_keras."), k2.Model.__module__
else:
    import tf_keras as k2

pytestmark = pytest.mark.timeout(240)

BATCH = 8  # 64 samples: 8 batches an epoch
KERAS2_SCRIPT = str(PROGRAMS / "keras2_train.py")


def build_model(seed: int = 0, optimizer=None):
    """A one-layer Keras 2 regression model on 3 features, compiled with Adam."""
    k2.utils.set_random_seed(seed)
    model = k2.Sequential([k2.layers.Dense(4, activation="relu", input_shape=(3,)), k2.layers.Dense(1)])
    model.compile(optimizer=optimizer or k2.optimizers.Adam(0.01), loss="mse")
    return model


def fit(model, data, *callbacks, epochs=4, **kwargs):
    x, y = data
    return model.fit(x, y, batch_size=BATCH, epochs=epochs, callbacks=list(callbacks), verbose=0, shuffle=False,
                     **kwargs)


class At(k2.callbacks.Callback):
    """A Keras 2 callback that runs `action(callback)` once at the end of (epoch, batch)."""

    def __init__(self, epoch, batch, action):
        super().__init__()
        self.at, self.action = (epoch, batch), action
        self.epoch, self.fired, self.train_end_called = -1, False, False
        self.batches = []  # (epoch, batch) of every batch end, the skipped ones of a resume included

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append((self.epoch, batch))
        if not self.fired and (self.epoch, batch) == self.at:
            self.fired = True
            self.action(self)

    def on_train_end(self, logs=None):
        self.train_end_called = True


def queued(control, command):
    """Sends `command` as the CLI does (`deliver`, with a request id), waits
    until the run's reader queued it, and returns the request sent."""
    request = with_id(command, "cli")
    deliver(control.fifo, request)
    wait_until(lambda: control.lifecycle.channel is None or control.lifecycle.channel.pending,
               message=f"{command} queued")
    return request


def iterations(model) -> int:
    return int(model.optimizer.iterations.numpy())


# Commands in a real tf_keras fit ---------------------------------------------------


def test_stop_through_send_checkpoints_and_ends_fit_the_keras_way(tiny_data, ckpt, capsys):
    saved_on = []

    class Recording(k2.Sequential):
        def save(self, *args, **kwargs):  # the real save, noting the thread it runs on
            saved_on.append(threading.current_thread())
            return super().save(*args, **kwargs)

    k2.utils.set_random_seed(0)
    model = Recording([k2.layers.Dense(4, activation="relu", input_shape=(3,)), k2.layers.Dense(1)])
    model.compile(optimizer=k2.optimizers.Adam(0.01), loss="mse")
    control = ControlCallback(name="k2stop", checkpoint_dir=ckpt)
    probe = At(1, 2, lambda cb: queued(control, "stop"))
    history = fit(model, tiny_data, control, probe)
    assert isinstance(history, k2.callbacks.History) and history.epoch == [0, 1]
    assert probe.train_end_called  # the other callbacks' on_train_end ran
    assert control.state == "stopped"
    (checkpoint,) = control.checkpoints
    info = read_sidecar(checkpoint)
    assert (info["epoch"], info["step_in_epoch"], info["reason"]) == (1, 4, "stop")
    assert info["global_step"] == BATCH + 4 == iterations(model)
    assert saved_on == [threading.main_thread()]  # written by the training thread, not a writer thread
    loaded = k2.models.load_model(checkpoint, custom_objects={"Recording": Recording})  # a .keras file of Keras 2's
    assert iterations(loaded) == iterations(model)
    np.testing.assert_array_equal(loaded.get_weights()[0], model.get_weights()[0])
    assert find_run("k2stop")["state"] == "stopped"
    # What Keras 2 cannot do is said once, at the start: a warning in the run's log (on stderr through
    # logging), not a verbose line besides.
    warnings = [e["message"] for e in control.lifecycle.journal.events if e["kind"] == "warning"]
    assert warnings == [NOTICE] and NOTICE.startswith("Keras 2 (tf_keras) cannot ")
    assert NOTICE not in capsys.readouterr().out


def test_a_raw_fifo_write_stops_it(tiny_data, ckpt):
    model = build_model()
    control = ControlCallback(name="k2echo", checkpoint_dir=ckpt, verbose=False)

    def echo_stop(_cb):
        fd = os.open(control.fifo, os.O_WRONLY | os.O_NONBLOCK)  # as `echo stop > FIFO`
        try:
            os.write(fd, b"stop\n")
        finally:
            os.close(fd)
        wait_until(lambda: control.lifecycle.channel.pending, message="stop queued")

    history = fit(model, tiny_data, control, At(0, 5, echo_stop))
    assert history.epoch == [0] and control.state == "stopped"
    assert read_sidecar(control.checkpoints[0])["global_step"] == 7 == iterations(model)


def test_save_writes_a_checkpoint_and_training_goes_on(tiny_data, ckpt):
    model = build_model()
    control = ControlCallback(name="k2save", checkpoint_dir=ckpt, verbose=False)
    history = fit(model, tiny_data, control, At(0, 5, lambda cb: queued(control, "save")))
    assert history.epoch == [0, 1, 2, 3] and control.state == "finished"
    checkpoint, at_end = control.checkpoints  # the save's, and the finished fit's (save_at_end)
    assert (read_sidecar(checkpoint)["reason"], read_sidecar(checkpoint)["global_step"]) == ("save", 7)
    assert iterations(k2.models.load_model(checkpoint)) == 7
    assert (read_sidecar(at_end)["reason"], read_sidecar(at_end)["global_step"]) == ("end", iterations(model))


def test_abort_ends_fit_without_a_checkpoint(tiny_data, ckpt):
    model = build_model()
    control = ControlCallback(name="k2abort", checkpoint_dir=ckpt, verbose=False)
    probe = At(2, 0, lambda cb: queued(control, "abort"))
    history = fit(model, tiny_data, control, probe)
    assert history.epoch == [0, 1, 2] and probe.train_end_called
    assert control.state == "aborted" and control.checkpoints == []
    assert not ckpt.exists()  # the folder it made holds nothing: removed


def test_pause_holds_training_and_resume_lets_it_go_on(tiny_data, ckpt):
    model = build_model()
    control = ControlCallback(name="k2pause", checkpoint_dir=ckpt, verbose=False)
    errors = []

    def remote():
        try:
            wait_until(lambda: control.state == "paused", message="paused")
            held_at = iterations(model)
            time.sleep(0.4)  # a negative observation: no step while paused
            assert iterations(model) == held_at, "training went on while paused"
            deliver(control.fifo, "save")  # acts while paused
            wait_until(lambda: len(control.checkpoints) == 1, message="a checkpoint while paused")
            assert iterations(model) == held_at == 8 + 4
        except BaseException as error:  # reported by the test's thread
            errors.append(error)
        deliver(control.fifo, "resume")

    thread = threading.Thread(target=remote, name="test-remote")
    thread.start()
    history = fit(model, tiny_data, control, At(1, 2, lambda cb: queued(control, "pause")))
    thread.join()
    assert not errors, errors[0]
    assert history.epoch == [0, 1, 2, 3] and control.state == "finished"
    states = [e["message"] for e in control.lifecycle.journal.events if e["kind"] == "state"]
    assert states[:3] == ["running", "paused", "running"]


def test_set_lr_changes_the_keras2_optimizer_learning_rate(tiny_data, ckpt):
    model = build_model()
    control = ControlCallback(name="k2set", checkpoint_dir=ckpt, verbose=False)
    rates = []

    class Rates(k2.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            rates.append(float(self.model.optimizer.learning_rate.numpy()))

    request = {}
    history = fit(model, tiny_data, control, Rates(),
                  At(0, 2, lambda cb: request.update(r=queued(control, "set lr=0.5"))),
                  At(1, 0, lambda cb: queued(control, "stop")), epochs=3)
    assert history.epoch == [0, 1]
    assert rates[:4] == pytest.approx([0.01] * 4)  # the set acts at the end of batch 3 (sent during batch 2)
    assert rates[4:] == pytest.approx([0.5] * (len(rates) - 4))
    assert float(model.optimizer.learning_rate.numpy()) == 0.5
    ack = control.lifecycle.journal.acks_of(request["r"].request_id)
    assert (ack["outcome"], ack["message"]) == ("applied", "learning_rate 0.01 -> 0.5")  # the variable, assigned
    assert read_sidecar(control.checkpoints[-1])["tunables"] == {"learning_rate": 0.5}
    assert float(k2.models.load_model(control.checkpoints[-1]).optimizer.learning_rate.numpy()) == 0.5


def test_set_lr_replaces_a_keras2_schedule_and_the_checkpoint_keeps_it(tiny_data, ckpt):
    schedule = k2.optimizers.schedules.ExponentialDecay(0.01, decay_steps=10, decay_rate=0.5)
    model = build_model(optimizer=k2.optimizers.Adam(schedule))
    control = ControlCallback(name="k2sched", checkpoint_dir=ckpt, verbose=False)
    rates = []

    class Rates(k2.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            rates.append(float(self.model.optimizer.learning_rate.numpy()))

    fit(model, tiny_data, At(0, 2, lambda cb: control.lifecycle.channel.inject(parse_request("set lr=0.5"))), control,
        Rates(), At(1, 0, lambda cb: queued(control, "stop")), epochs=3)
    assert rates[3:] == pytest.approx([0.5] * (len(rates) - 3))  # a constant from the next batch on
    import tensorflow as tf

    assert isinstance(model.optimizer.learning_rate, tf.Variable)  # of the kind Keras 2's step reads
    loaded = k2.models.load_model(control.checkpoints[-1])  # the optimizer as the user built it
    assert isinstance(loaded.optimizer._learning_rate, k2.optimizers.schedules.ExponentialDecay)
    assert read_sidecar(control.checkpoints[-1])["tunables"] == {"learning_rate": 0.5}


def test_rollback_loads_the_newest_checkpoint_into_the_keras2_model(tiny_data, ckpt):
    model = build_model()
    control = ControlCallback(name="k2back", checkpoint_dir=ckpt, verbose=False)
    seen = {}

    def save(_cb):  # before the control callback's hook: taken at this same boundary
        seen["saved"] = [variable.numpy() for variable in model.weights + list(model.optimizer.variables)]
        control.lifecycle.channel.inject(parse_request("save"))

    def check(_cb):  # after it: the rollback was applied at this boundary
        seen["after"] = [variable.numpy() for variable in model.weights + list(model.optimizer.variables)]

    history = fit(model, tiny_data, At(0, 3, save), At(1, 2, lambda cb: control.lifecycle.channel.inject(
        parse_request("rollback #rb"))), control, At(1, 2, check), epochs=3)
    assert control.lifecycle.journal.acks_of("rb")["outcome"] == "applied"
    assert int(seen["after"][len(model.weights)]) == 4  # the checkpoint's optimizer step (iterations comes first)
    for saved, after in zip(seen["saved"], seen["after"]):
        np.testing.assert_array_equal(saved, after)
    assert history.epoch == [0, 1, 2] and history.history["rollbacks"] == [0, 1, 1]
    assert iterations(model) == 4 + (BATCH - 3) + BATCH


def test_resume_continues_at_the_checkpoint_epoch_and_batch_with_the_optimizer_step(tiny_data, ckpt):
    first = build_model()
    stopper = ControlCallback(name="k2res", checkpoint_dir=ckpt, verbose=False)
    fit(first, tiny_data, stopper, At(1, 2, lambda cb: queued(stopper, "stop")))
    info = read_sidecar(stopper.checkpoints[-1])
    assert (info["resume_epoch"], info["resume_step"], info["global_step"]) == (1, 4, 12)

    model = build_model(seed=1)  # other weights: the checkpoint's must be loaded
    resumed = ControlCallback(name="k2res", checkpoint_dir=ckpt, resume=True, verbose=False)
    steps = []

    class Steps(k2.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            steps.append(iterations(self.model))

    probe = At(-1, -1, lambda cb: None)
    train_function = []
    probe.on_train_begin = lambda logs=None: train_function.append(model.train_function)
    history = fit(model, tiny_data, probe, resumed, Steps(), epochs=3)  # probe first: the train function before the resume
    assert history.epoch == [1, 2]  # starts in the checkpoint's epoch
    assert steps[0] == 12  # the optimizer step restored
    # Batches 0-3 of epoch 1 were trained before the stop: drawn, not trained.
    assert probe.batches[:5] == [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4)] and steps[4] == 12 and steps[5] == 13
    assert iterations(model) == 3 * BATCH  # as an uninterrupted fit of 3 epochs
    assert resumed.state == "finished"
    messages = [e["message"] for e in resumed.lifecycle.journal.events]
    assert any(m.startswith(f"Resumed from {stopper.checkpoints[-1]}: epoch 2, skipping its first 4 batches")
               and m.endswith("Not exact: Keras 2 (tf_keras) cannot restore the data order or the random state.")
               for m in messages), messages
    assert model._training_state is None and model.train_function is train_function[0]  # what the resume changed, undone


# Ctrl+C ----------------------------------------------------------------------------


@pytest.fixture
def ctrl_c():
    """Ctrl+C as a terminal gives it (Python's handler), whatever this test runner inherited."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, inherited)


def test_first_ctrl_c_stops_with_a_checkpoint_and_a_second_raises(tiny_data, ckpt, ctrl_c):
    before = signal.getsignal(signal.SIGINT)
    model = build_model()
    control = ControlCallback(name="k2sig", checkpoint_dir=ckpt, verbose=False)

    def interrupt(_cb):
        os.kill(os.getpid(), signal.SIGINT)
        wait_until(lambda: control.lifecycle.channel.pending, message="stop queued")

    history = fit(model, tiny_data, control, At(1, 1, interrupt))
    assert history.epoch == [0, 1] and control.state == "stopped"
    assert read_sidecar(control.checkpoints[0])["reason"] == "interrupt"
    assert signal.getsignal(signal.SIGINT) is before

    again = ControlCallback(name="k2sig2", checkpoint_dir=ckpt.parent / "ck2", verbose=False)
    twice = At(0, 1, lambda cb: (os.kill(os.getpid(), signal.SIGINT), os.kill(os.getpid(), signal.SIGINT)))
    with pytest.raises(KeyboardInterrupt):
        fit(build_model(), tiny_data, again, twice)
    assert signal.getsignal(signal.SIGINT) is before
    # tf_keras calls no on_train_end on the way out: the run's watchdog ends it.
    wait_until(lambda: again.state == "failed", timeout=10, message="the run ended as failed")
    assert "second Ctrl+C" in again.lifecycle.error


def test_a_script_stopped_by_ctrl_c_then_resumed(tmp_path, training):
    checkpoints = str(tmp_path / "ck")
    script = training("--name", "k2script", "--checkpoint-dir", checkpoints, script=KERAS2_SCRIPT)
    saved = cli("send", "k2script", "save", "--wait", "60")
    assert saved.returncode == 0 and "checkpoint written" in saved.stdout, saved.stderr
    script.process.send_signal(signal.SIGINT)
    code, result, err = script.finish()
    assert code == 0, err
    assert result["state"] == "stopped" and result["history"] == "tf_keras.src.callbacks.History"
    assert [read_sidecar(path)["reason"] for path in result["checkpoints"]] == ["save", "interrupt"]
    assert "Ctrl+C: stopping after this batch" in err and NOTICE in err  # the notice: a warning on stderr
    info = read_sidecar(result["checkpoints"][-1])
    assert info["global_step"] == result["optimizer_step"]

    epochs = info["resume_epoch"] + 2
    again = training("--name", "k2script", "--checkpoint-dir", checkpoints, "--epochs", str(epochs), "--resume",
                     "--batch-sleep", "0", "--import-tf-keras", script=KERAS2_SCRIPT)
    code, resumed, err = again.finish()
    assert code == 0, err
    assert resumed["state"] == "finished" and resumed["epochs"][0] == info["resume_epoch"]
    assert resumed["optimizer_step"] == epochs * BATCH


def test_sigterm_stops_a_keras2_script_with_a_checkpoint_then_ends_it(tmp_path, training):
    script = training("--name", "k2term", "--checkpoint-dir", str(tmp_path / "ck"), script=KERAS2_SCRIPT)
    script.process.send_signal(signal.SIGTERM)
    code, result, err = script.finish()
    assert code == -signal.SIGTERM and result is None, err  # ended as SIGTERM asks, after fit returned
    assert "SIGTERM: stopping after this batch, with a checkpoint" in err
    (sidecar,) = sorted((tmp_path / "ck").glob("ckpt-*.json"))
    assert json.loads(sidecar.read_text())["reason"] == "interrupt"


# The magic's wrapper ----------------------------------------------------------------


class Adds(FitInterceptor):
    """Adds a callback to each `fit` on the intercepting thread, and counts them."""

    def __init__(self, callback):
        self.callback, self.calls = callback, 0

    def around_fit(self, fit, model, args, kwargs):
        self.calls += 1
        kwargs["callbacks"] = [self.callback, *(kwargs.get("callbacks") or [])]
        return fit(model, *args, **kwargs)


def test_the_fit_hook_wraps_keras2_fit_and_puts_it_back(tiny_data):
    import keras

    original, keras3_fit = k2.Model.fit, keras.Model.fit
    probe = At(0, 0, lambda cb: None)
    interceptor = Adds(probe)
    with intercept_fit(interceptor):
        assert k2.Model.fit is not original
        fit(build_model(), tiny_data, epochs=1)
        other = threading.Thread(target=lambda: fit(build_model(), tiny_data, epochs=1))  # another thread: untouched
        other.start()
        other.join()
    assert interceptor.calls == 1 and probe.fired
    assert k2.Model.fit is original and keras.Model.fit is keras3_fit and "fit" not in vars(keras.Model)


def test_the_fit_hook_imports_no_tensorflow_and_wraps_tf_keras_imported_later():
    """On Keras 3 with another backend nothing imports TensorFlow; a tf_keras
    imported while a run is active has its fit wrapped, and put back."""
    code = """if True:
        import sys, threading, numpy as np, keras
        from jupyter_traincontrol.notebook.fit_hook import FitInterceptor, intercept_fit
        class Count(FitInterceptor):
            calls = 0
            def around_fit(self, fit, model, args, kwargs):
                Count.calls += 1
                return fit(model, *args, **kwargs)
        finders = list(sys.meta_path)
        with intercept_fit(Count()):
            assert not {"tensorflow", "tf_keras"} & set(sys.modules), sorted({"tensorflow", "tf_keras"} & set(sys.modules))
        assert sys.meta_path == finders and "fit" not in vars(keras.Model)
        with intercept_fit(Count()):
            import tf_keras
            assert "fit_hook" in tf_keras.Model.fit.__code__.co_filename
            model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(3,))])
            model.compile("sgd", "mse")
            model.fit(np.zeros((8, 3)), np.zeros((8, 1)), epochs=1, verbose=0)
        assert Count.calls == 1
        assert "fit_hook" not in tf_keras.Model.fit.__code__.co_filename and "fit" in vars(tf_keras.Model)
        assert not [f for f in sys.meta_path if type(f).__module__.endswith("fit_hook")], sys.meta_path  # TF adds its own
        print("OK", keras.backend.backend())
    """
    env = {**child_env(), "KERAS_BACKEND": "numpy"}  # Keras 3 on a backend that is not TensorFlow
    env.pop("TF_USE_LEGACY_KERAS", None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["OK", "numpy"]


# %%interruptible_fit in a real kernel ---------------------------------------------

KERAS2_CELL = """%%interruptible_fit --name {name}
{imports}
import time
class K2Slow(k2.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None): time.sleep(0.01)
k2.utils.set_random_seed(0)
model = k2.Sequential([k2.layers.Dense(4, activation="relu", input_shape=(3,)), k2.layers.Dense(1)])
model.compile(optimizer=k2.optimizers.Adam(0.01), loss="mse")
history = model.fit(x, y, batch_size=8, epochs=200, callbacks=[K2Slow()], verbose=0)
"""
WRAPPED = "'fit_hook' in sys.modules['tf_keras'].Model.fit.__code__.co_filename"


def test_interruptible_fit_controls_a_keras2_fit_in_a_real_kernel(kernel):
    # tf_keras warns through TensorFlow's logger that the slow callback's hook outlasts a batch; that
    # logger's handler holds the kernel's stdout and writes into whatever cell runs (`kernel.value`'s).
    kernel.execute("import logging, sys; logging.getLogger('tensorflow').setLevel(logging.ERROR)")
    # 1. Keras 2 imported by the cell (TensorFlow imported it already with TF_USE_LEGACY_KERAS=1);
    # the panel's Stop button, clicked as a browser does.
    legacy = os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True")
    assert kernel.value("'tf_keras' in sys.modules") is legacy
    imports = "import tensorflow as tf; k2 = tf.keras" if legacy else "import tf_keras as k2"
    result = kernel.execute(KERAS2_CELL.format(name="k2cell", imports=imports))
    assert result.status == "ok", result.error
    kernel.wait_for(f"{RUN}.state == 'running' and {RUN}.lifecycle.progress.step > 0", timeout=120)
    assert kernel.value(WRAPPED) is True
    assert kernel.value(f"{html.escape(NOTICE)!r} in {RUN}.panel.log.value")  # said once, at the start
    assert kernel.value(f"[e['kind'] for e in {RUN}.lifecycle.journal.events if e['message'] == {NOTICE!r}]") == ["warning"]
    kernel.click(kernel.value(f"{RUN}.panel.buttons['stop'].model_id"))
    kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=60)
    assert kernel.value(f"len({RUN}.checkpoints)") == 1
    assert kernel.value("type(history).__module__") == "tf_keras.src.callbacks"
    kernel.wait_for(f"not ({WRAPPED})", timeout=10)  # the run ended: the wrapper is gone

    # 2. tf_keras imported already; a kernel interrupt stops it with an exact checkpoint.
    result = kernel.execute(KERAS2_CELL.format(name="k2int", imports=""))
    assert result.status == "ok", result.error
    kernel.wait_for(f"{RUN}.state == 'running' and {RUN}.lifecycle.progress.step > 0", timeout=60)
    assert kernel.value(WRAPPED) is True
    kernel.interrupt()
    kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=60)
    checkpoint = kernel.value(f"str({RUN}.checkpoints[-1])")
    assert read_sidecar(checkpoint)["reason"] == "interrupt"
    assert kernel.value(f"int(k2.models.load_model({checkpoint!r}).optimizer.iterations.numpy()) == "
                        "int(model.optimizer.iterations.numpy())", timeout=60)
    assert kernel.value("type(history).__name__") == "History"
    kernel.wait_for(f"not ({WRAPPED}) and 'fit' not in vars(keras.Model)", timeout=10)
    assert kernel.value("[type(f).__name__ for f in sys.meta_path if 'fit_hook' in type(f).__module__]") == []
