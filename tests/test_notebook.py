"""%%interruptible_fit in a real kernel: interrupts, widget clicks, resume, failures, leaks.

Each kernel is a real ipykernel process driven through jupyter_client, with
the real SIGINT of `KernelManager.interrupt_kernel()` and the same comm
messages a browser sends for a button click.
"""

from __future__ import annotations

import json
import time

import pytest

from helpers import cli, read_sidecar, run_python, wait_until
from jupyter_traincontrol.registry import list_runs
from kernel_harness import FIT_CELL, RUN, Kernel, start_fit

pytestmark = pytest.mark.timeout(240)

def test_the_cell_returns_at_once_with_the_panel_and_the_kernel_stays_free(kernel):
    started = time.monotonic()
    result = start_fit(kernel, "free")
    assert time.monotonic() - started < 30
    (bundle,) = result.results
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "Run 'free': " in bundle["text/plain"]
    assert kernel.value("1 + 1") == 2  # another cell runs while training goes on
    kernel.execute(f"{RUN}.stop()")
    kernel.wait_for(f"{RUN}.state == 'stopped'")
    assert kernel.value("len(history.epoch) > 0")


def test_interrupting_an_idle_kernel_stops_the_run_with_an_exact_checkpoint(kernel, tmp_path):
    start_fit(kernel, "idle")
    kernel.interrupt()
    kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=30)
    checkpoint = kernel.value(f"str({RUN}.checkpoints[-1])")
    assert read_sidecar(checkpoint)["reason"] == "interrupt"
    # The checkpoint holds exactly the model in memory: weights and optimizer step.
    kernel.execute(f"np.save({str(tmp_path / 'w.npy')!r}, model.get_weights()[0])")
    in_memory_step = kernel.value("int(model.optimizer.iterations.numpy())")
    check = run_python(
        "import keras, numpy as np;"
        f"m = keras.models.load_model({checkpoint!r});"
        f"assert np.array_equal(m.get_weights()[0], np.load({str(tmp_path / 'w.npy')!r}));"
        "print(int(m.optimizer.iterations.numpy()))"
    )
    assert check.returncode == 0, check.stderr
    assert int(check.stdout.split()[-1]) == in_memory_step
    assert kernel.value("type(history).__name__") == "History"
    assert kernel.value("'ok'") == "ok"


BETWEEN_FITS_CELL = """%%interruptible_fit --name {name} {options}
model.fit(x, y, batch_size=8, epochs=1, verbose=0)
time.sleep(4)  # between the two fits
history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
after = "the cell went on"
"""


@pytest.mark.parametrize("options, state, fits", [("", "stopped", 1), ("--on-interrupt save", "finished", 2)])
def test_an_interrupt_between_two_fits_acts_on_the_cells_run(kernel, options, state, fits):
    """The cell's first fit has ended, its second not begun: an interrupt
    stops the run (the cell goes on, its later fit trains nothing) or, with
    --on-interrupt save, saves as the next fit begins; never a
    KeyboardInterrupt that fails the run."""
    kernel.execute("import time")
    assert kernel.execute(BETWEEN_FITS_CELL.format(name="between", options=options)).status == "ok"
    kernel.wait_for(f"{RUN}.fit_calls == 1 and not {RUN}.drivers.driving", timeout=60)
    kernel.interrupt()
    kernel.wait_for(f"{RUN}.state in ('stopped', 'finished', 'failed')", timeout=60)
    assert kernel.value(f"({RUN}.state, {RUN}.lifecycle.end_reason)") == [state, "interrupt" if fits == 1 else "finished"]
    assert kernel.value(f"{RUN}.fit_calls") == fits
    assert kernel.value("after") == "the cell went on"
    reasons = [read_sidecar(path)["reason"] for path in kernel.value(f"[str(p) for p in {RUN}.checkpoints]")]
    assert reasons == (["end"] if fits == 1 else ["end", "save", "end"]), reasons


def test_interrupt_during_a_busy_cell_interrupts_that_cell_and_stops_the_run(kernel):
    start_fit(kernel, "busy")
    msg_id = kernel.start_busy_cell()
    kernel.interrupt()
    result = kernel.collect(msg_id, timeout=20)  # if the interrupt failed, this times out
    assert result.error and result.error["ename"] == "KeyboardInterrupt"
    kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=30)
    assert kernel.value(f"len({RUN}.checkpoints)") == 1


def test_the_panel_says_when_clicks_must_wait_for_a_busy_kernel(kernel):
    start_fit(kernel, "waiting")
    # A cell that keeps the kernel busy until the panel says so (or 20 s pass).
    result = kernel.execute(
        "import time\n"
        "deadline = time.monotonic() + 20\n"
        f"while 'kernel is busy' not in {RUN}.panel.note.value and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n"
        f"print('busy note:', 'kernel is busy' in {RUN}.panel.note.value)\n",
        timeout=30,
    )
    assert "busy note: True" in result.stdout, "the panel never said the kernel was busy"
    updates = [m["content"]["data"].get("state", {}) for m in result.messages if m["msg_type"] == "comm_msg"]
    notes = [state.get("value", "") for state in updates if "kernel is busy" in str(state.get("value", ""))]
    assert notes and "jupyter-traincontrol send waiting stop" in notes[0]
    assert 'class="traincontrol-busy-note"' in notes[0]  # what the JupyterLab extension hides
    # A click made now says at once, without the kernel, that it waits: CSS shows this line while a button has focus.
    assert '<span class="traincontrol-click-waits">This click waits for the kernel' in notes[0]
    assert ".traincontrol-panel:has(button.traincontrol-button:focus) .traincontrol-click-waits" in notes[0]
    kernel.wait_for(f"'kernel is busy' not in {RUN}.panel.note.value", timeout=10)
    kernel.execute(f"{RUN}.abort()")
    kernel.wait_for(f"{RUN}.state == 'aborted'")


def test_the_busy_notice_follows_cells_not_widget_clicks(kernel):
    """Clicking Resume on an idle kernel once left the notice saying the
    kernel was busy: a comm message is not a cell."""
    start_fit(kernel, "notice")
    note_id, pause_id, stats_id = kernel.value(
        f"[{RUN}.panel.note.model_id, {RUN}.panel.buttons['pause'].model_id, {RUN}.panel.stats.model_id]"
    )
    kernel.click(pause_id)
    kernel.wait_for(f"{RUN}.state == 'paused'", timeout=30)
    # A click acts on the label the panel shows: until the monitor has redrawn
    # the button as Resume, a second click would send pause again.
    kernel.wait_for(f"{RUN}.panel.buttons['pause'].description == 'Resume'", timeout=10)
    kernel.click(pause_id)  # now labelled Resume
    # No cell runs from here: watch the panel's updates on IOPub until the
    # button says Pause again and the panel has redrawn three more times.
    notes, resumed, redraws = [], False, 0
    deadline = time.monotonic() + 30
    while redraws < 3:
        msg = kernel.kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))  # raises once the deadline passes
        if msg["msg_type"] != "comm_msg":
            continue
        comm_id, state = msg["content"]["comm_id"], msg["content"]["data"].get("state", {})
        if comm_id == pause_id and state.get("description") == "Pause":
            resumed = True
        elif resumed and comm_id == note_id and "value" in state:
            notes.append(state["value"])
        elif resumed and comm_id == stats_id:
            redraws += 1
    assert not [note for note in notes if "kernel is busy" in note], notes
    assert kernel.value(f"{RUN}.state") == "running"
    kernel.execute(f"{RUN}.abort()")
    kernel.wait_for(f"{RUN}.state == 'aborted'")


def test_interrupt_with_no_run_is_a_plain_keyboard_interrupt(kernel):
    msg_id = kernel.start_busy_cell()
    kernel.interrupt()
    result = kernel.collect(msg_id, timeout=20)  # if the interrupt was lost, this times out
    assert result.error["ename"] == "KeyboardInterrupt"
    kernel.interrupt()  # idle, no run: nothing happens
    time.sleep(0.5)  # not a wait for an event: time for the signal to (not) act before the next cell
    assert kernel.value("jupyter_traincontrol.runs()") == []
    # While idle the kernel's own SIG_IGN stands (seen as the handler saved around this cell).
    assert kernel.value("get_ipython().kernel.saved_sigint_handler is __import__('signal').SIG_IGN") is True


def test_a_second_interrupt_while_stopping_aborts(kernel):
    # Slow validation data keeps the run in "stopping" after the first
    # interrupt's stop (Keras still validates the partial epoch; the user's
    # callbacks no longer see it, so a slow callback would not); the second
    # interrupt (more than a second later) aborts it there.
    cell = (
        "%%interruptible_fit --name twice\n"
        "history = model.fit(x, y, batch_size=8, epochs=200, validation_data=SlowBatches(x, y, 0.6),"
        " callbacks=[Slow(0.01)], verbose=0)\n"
    )
    assert kernel.execute(cell).status == "ok"
    kernel.wait_for(f"{RUN}.state == 'running' and {RUN}.lifecycle.progress.step > 0", timeout=60)
    kernel.interrupt()
    kernel.wait_for(f"{RUN}.state == 'stopping'", timeout=30)
    time.sleep(1.2)  # the scenario: interrupts less than 1 s apart are one burst
    kernel.interrupt()
    kernel.wait_for(f"{RUN}.state in ('stopped', 'aborted')", timeout=30)
    assert kernel.value(f"{RUN}.state") == "aborted"
    assert kernel.value(f"len({RUN}.checkpoints)") == 1  # the stop's checkpoint stays


def test_interrupt_storm_gives_exactly_one_graceful_stop(kernel):
    start_fit(kernel, "storm")
    for _ in range(20):
        kernel.interrupt()
        time.sleep(0.04)  # the scenario: a storm of 20 interrupts in 0.8 s
    kernel.wait_for(f"{RUN}.state in ('stopped', 'aborted')", timeout=30)
    assert kernel.value(f"{RUN}.state") == "stopped"
    assert kernel.value(f"len({RUN}.checkpoints)") == 1
    assert kernel.value("'alive'") == "alive"


def button(kernel, key):
    return kernel.value(f"{RUN}.panel.buttons[{key!r}].model_id")


def test_button_clicks_as_comm_messages(kernel):
    start_fit(kernel, "clicks")
    kernel.click(button(kernel, "save"))
    kernel.wait_for(f"len({RUN}.checkpoints) == 1", timeout=30)
    assert kernel.value(f"{RUN}.state") == "running"  # save keeps training
    kernel.click(button(kernel, "pause"))
    kernel.wait_for(f"{RUN}.state == 'paused'", timeout=30)
    kernel.wait_for(f"{RUN}.panel.buttons['pause'].description == 'Resume'", timeout=10)
    step = kernel.value(f"{RUN}.lifecycle.progress.global_step")
    held = kernel.value(f"{RUN}.lifecycle.progress.step")
    time.sleep(0.5)  # not a wait for an event: training must not move meanwhile
    assert kernel.value(f"{RUN}.lifecycle.progress.step") == held
    kernel.click(button(kernel, "pause"))  # now labelled Resume
    kernel.wait_for(f"{RUN}.state == 'running' and {RUN}.lifecycle.progress.step != {held}", timeout=30)
    kernel.click(button(kernel, "abort"))  # asks first: the button reads "Confirm abort"
    kernel.wait_for(f"{RUN}.panel.buttons['abort'].description == 'Confirm abort'", timeout=10)
    kernel.click(button(kernel, "abort"))
    kernel.wait_for(f"{RUN}.state == 'aborted'", timeout=30)
    assert kernel.value(f"len({RUN}.checkpoints)") == 1  # abort wrote none
    assert kernel.value(f"all(b.disabled for b in {RUN}.panel.buttons.values())")
    saved = kernel.value(f"__import__('json').loads(__import__('pathlib').Path(str({RUN}.checkpoints[0])).with_suffix('.json').read_text())['global_step']")
    assert step == saved > 0  # the record's optimizer step is the save's


def test_resume_in_a_fresh_kernel_continues_the_optimizer_and_the_epoch(tmp_path, runtime_dir):
    runtime_dir.parent.mkdir(exist_ok=True)
    first = Kernel(tmp_path, runtime_dir.parent)
    try:
        start_fit(first, "part", epochs=6, sleep=0.1)  # 0.8 s an epoch: the interrupt comes seconds before the end
        first.wait_for(f"{RUN}.lifecycle.progress.epoch >= 1", timeout=60)
        first.interrupt()
        first.wait_for(f"{RUN}.state == 'stopped'", timeout=30)
        info = read_sidecar(first.value(f"str({RUN}.checkpoints[-1])"))
    finally:
        first.shutdown()
    second = Kernel(tmp_path, runtime_dir.parent)
    try:
        result = second.execute(FIT_CELL.format(name="part", options="--resume", epochs=6, sleep=0))
        assert result.status == "ok", result.error
        second.wait_for(f"{RUN}.state == 'finished'", timeout=60)
        assert second.value("history.epoch[0]") == info["resume_epoch"]
        assert second.value("int(model.optimizer.iterations.numpy())") == 6 * 8
    finally:
        second.shutdown()


def test_a_failing_cell_fails_the_run_and_the_kernel_stays_healthy(kernel):
    result = kernel.execute("%%interruptible_fit --name broken\nmodel.fit(x[:, :2], y, epochs=2, verbose=0)\n")
    assert result.status == "ok"
    kernel.wait_for(f"{RUN}.state == 'failed'", timeout=30)
    error = kernel.value(f"{RUN}.error")
    assert "Traceback" in error and "ValueError" in error
    assert "interruptible_fit cell" in error
    assert kernel.value(f"'ValueError' in {RUN}.panel.note.value")
    assert kernel.value("2 * 21") == 42


def test_a_cell_without_fit_ends_with_a_note(kernel):
    kernel.execute("%%interruptible_fit --name nofit\nanswer = 6 * 7\n")
    kernel.wait_for(f"{RUN}.state == 'finished'", timeout=30)
    assert kernel.value("answer") == 42
    assert kernel.value(f"'ran no fit and no TrainLoop' in {RUN}.panel.log.value")
    kernel.wait_for(f"'Ended: nothing trained' in {RUN}.panel.outcome.value", timeout=10)  # not "Finished: ..."
    assert kernel.value(f"'no batch trained' in {RUN}.panel.epoch_label.value")  # not "Epoch -/? · batch 0/?"


def test_what_the_training_thread_prints_shows_in_the_panel(kernel):
    kernel.execute("%%interruptible_fit --name printer\nprint('hello from training')\nmodel.fit(x, y, epochs=1, verbose=0)\n")
    kernel.wait_for(f"{RUN}.state == 'finished'", timeout=30)
    later = kernel.execute("print('later cell')")
    assert "hello from training" not in later.stdout
    kernel.wait_for(f"'hello from training' in {RUN}.panel.output.value", timeout=10)


@pytest.mark.parametrize(
    "line, message",
    [
        ("--keep 0", "--keep must be at least 1"),
        ("--on-interrupt explode", "invalid choice"),
        ("--name ../etc", "Invalid run name"),
        ("--bogus", "unrecognized arguments"),
        ('--name "unbalanced', "No closing quotation"),
        ("--keep many", "invalid int value"),
        ("--autosave -1", "--autosave takes seconds, 0 to turn it off; got -1.0"),
    ],
)
def test_wrong_options_are_usage_errors(kernel, line, message):
    result = kernel.execute(f"%%interruptible_fit {line}\nmodel.fit(x, y, epochs=1)\n")
    assert result.ename == "UsageError"
    assert message in result.evalue
    assert kernel.value("jupyter_traincontrol.runs()") == []


def test_wait_keeps_the_cell_busy_and_an_interrupt_ends_it_without_a_traceback(kernel):
    msg_id = kernel.execute(FIT_CELL.format(name="waiter", options="--wait", epochs=200, sleep=0.01), wait=False)
    try:  # the cell is busy: ask the registry
        wait_until(lambda: any(r["name"] == "waiter" and (r.get("step") or r.get("epoch", 0) > 1) for r in list_runs()),
                   timeout=60, message="the --wait run to train")
    except AssertionError as error:  # say what the run and the cell did
        kernel.interrupt()
        cell = kernel.collect(msg_id, timeout=60)
        records = [{key: r.get(key) for key in ("name", "state", "epoch", "step", "error")} for r in list_runs()]
        raise AssertionError(f"{error}\nruns: {records}\ncell: {cell.status} {cell.error}\n{cell.text()}") from None
    kernel.interrupt()
    result = kernel.collect(msg_id, timeout=60)
    assert result.status == "ok", result.error
    assert result.error is None
    assert kernel.value(f"{RUN}.state") == "stopped"


def test_kernel_restart_during_a_run_checkpoints_first(kernel, tmp_path):
    start_fit(kernel, "restart")
    kernel.km.restart_kernel(now=False)
    checkpoints = list((tmp_path / "checkpoints" / "restart").glob("*.keras"))
    assert len(checkpoints) == 1
    assert read_sidecar(checkpoints[0])["reason"] in ("stop", "interrupt")


def test_a_restart_waits_past_jupyter_clients_sigterm_for_the_stop_checkpoint(kernel, tmp_path):
    # jupyter_client sends SIGTERM 2.5 s after the shutdown request; the batch
    # in flight ends about 3 s after the restart, so its checkpoint is written
    # only because SIGTERM is held while the run stops (SIGKILL comes at 5 s).
    kernel.execute("class LongBatch(keras.callbacks.Callback):\n"
                   "    def on_train_batch_begin(self, batch, logs=None): time.sleep(3.2 if batch else 0)\n")
    result = kernel.execute("%%interruptible_fit --name long-batch\n"
                            "model.fit(x, y, batch_size=8, epochs=200, callbacks=[LongBatch()], verbose=0)\n")
    assert result.status == "ok", result.error
    kernel.wait_for(f"{RUN}.lifecycle.progress.step > 0", timeout=60, interval=0.02)  # batch 1 (3.2 s) has begun
    kernel.km.restart_kernel(now=False)
    checkpoints = list((tmp_path / "checkpoints" / "long-batch").glob("*.keras"))
    assert len(checkpoints) == 1
    assert read_sidecar(checkpoints[0])["reason"] in ("stop", "interrupt")


def test_sigterm_outside_a_shutdown_still_ends_an_idle_kernel(kernel):
    import signal

    kernel.km.signal_kernel(signal.SIGTERM)  # the extension's handler only holds it during a shutdown
    wait_until(lambda: not kernel.alive(), timeout=10, message="the kernel to end on SIGTERM")


HOOK_STATE = (
    "[str(__import__('signal').getsignal(2)), str(__import__('signal').getsignal(15)),"
    " sorted(k for k in ('pre_handler_hook', 'post_handler_hook', 'do_shutdown') if k in get_ipython().kernel.__dict__),"
    " 'interruptible_fit' in get_ipython().magics_manager.magics['cell'],"
    " (lambda s: (s.set_wakeup_fd(s.set_wakeup_fd(-1)), s.set_wakeup_fd(-1))[0])(__import__('signal'))]"
)


def test_unload_restores_what_load_changed(tmp_path, runtime_dir):
    from kernel_harness import BASE_SETUP

    runtime_dir.parent.mkdir(exist_ok=True)
    kernel = Kernel(tmp_path, runtime_dir.parent, setup=BASE_SETUP)
    try:
        baseline = kernel.value(HOOK_STATE)
        assert kernel.execute("%load_ext jupyter_traincontrol").status == "ok"
        assert kernel.value(HOOK_STATE) != baseline
        start_fit(kernel, "unload")
        result = kernel.execute("%unload_ext jupyter_traincontrol", timeout=60)
        assert result.status == "ok", result.error
        assert kernel.value(f"{RUN}.state") == "stopped"  # active runs stop gracefully first
        assert kernel.value(HOOK_STATE) == baseline
        assert kernel.execute("%%interruptible_fit\npass\n").ename == "UsageError"
        kernel.execute("%load_ext jupyter_traincontrol")
        start_fit(kernel, "reloaded")
        kernel.interrupt()
        kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=30)
    finally:
        kernel.shutdown()


def test_twenty_runs_leave_nothing_behind(kernel):
    for index in range(20):
        kernel.execute(f"%%interruptible_fit --name many-{index}\nmodel.fit(x, y, epochs=1, verbose=0)\n")
        kernel.wait_for(f"{RUN}.state == 'finished' and not {RUN}.active", timeout=60)
    kernel.execute(f"{RUN}.panel.join(5); {RUN}.join(5)")
    leftovers = kernel.value(
        "[sorted(t.name for t in __import__('threading').enumerate() if t.name.startswith('traincontrol-') and t.name != 'traincontrol-interrupts'),"
        " len(__import__('jupyter_traincontrol.notebook.run').notebook.run.active_runs()),"
        " type(__import__('sys').stdout).__name__,"
        " 'fit' in vars(__import__('keras').Model)]"
    )
    assert leftovers == [[], 0, "OutStream", False]
    records = list_runs()
    assert len(records) == 20
    assert all(record["state"] == "finished" and record["fifo"] is None for record in records)


def test_defaults_are_configurable_with_traitlets(kernel, tmp_path):
    kernel.execute("%config TrainControlMagics.keep = 1")
    kernel.execute("%config TrainControlMagics.checkpoint_dir = 'ckpts/{name}-dir'")
    kernel.execute("%config TrainControlMagics.on_interrupt = 'save'")
    start_fit(kernel, "configured")
    kernel.interrupt()  # save: a checkpoint, and training goes on
    kernel.wait_for(f"len({RUN}.checkpoints) == 1", timeout=30)
    assert kernel.value(f"{RUN}.state") == "running"
    kernel.execute(f"{RUN}.save()")
    kernel.wait_for(f"sum(e['kind'] == 'checkpoint' for e in {RUN}.lifecycle.journal.events) == 2", timeout=30)
    kernel.execute(f"{RUN}.stop()")
    kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=30)
    kept = sorted((tmp_path / "ckpts" / "configured-dir").glob("*.keras"))
    assert len(kept) == 1 and kept[0].name.startswith("ckpt-000003-")  # keep=1


def test_sync_saves_by_option_or_config_saves_on_the_training_thread(kernel):
    background = f"{RUN}.callback.save_in_background"
    cell = "%%interruptible_fit --name {name} {options}\nmodel.fit(x, y, epochs=1, verbose=0)\n"
    for name, options, config in [("bg", "", None), ("sync", "--sync-saves", None), ("cfg", "", "True")]:
        if config is not None:
            kernel.execute(f"%config TrainControlMagics.sync_saves = {config}")
        assert kernel.execute(cell.format(name=name, options=options)).status == "ok"
        kernel.wait_for(f"{RUN}.state == 'finished'", timeout=30)
        assert kernel.value(f"({RUN}.name, {background})") == [name, name == "bg"]
    help_text = " ".join(kernel.value("get_ipython().magics_manager.magics['cell']['interruptible_fit'].__doc__").split())
    assert "--sync-saves" in help_text and "without a host copy of the variables" in help_text


def test_autosave_by_option_or_config(kernel):
    """``--autosave SECONDS`` and the ``autosave`` trait: a checkpoint of
    reason autosave after that much training; 0 turns it off."""
    cell = "%%interruptible_fit --name {name} {options}\nmodel.fit(x, y, epochs=10_000, verbose=0, callbacks=[Slow()])\n"
    kernel.execute("import time\nclass Slow(keras.callbacks.Callback):\n"
                   "    def on_train_batch_end(self, batch, logs=None):\n        time.sleep(0.01)\n")
    for name, options, config in [("opt", "--autosave 1", None), ("cfg", "", "1.5"), ("off", "--autosave 0", None)]:
        if config is not None:
            kernel.execute(f"%config TrainControlMagics.autosave = {config}")
        assert kernel.execute(cell.format(name=name, options=options)).status == "ok"
        kernel.wait_for(f"{RUN}.state == 'running'", timeout=30)
        autosaves = f"sum(e['kind'] == 'checkpoint' and e['message'].startswith('autosave:') for e in {RUN}.lifecycle.journal.events)"
        if name == "off":
            time.sleep(3)  # the scenario: longer than the intervals above
            assert kernel.value(autosaves) == 0
        else:
            kernel.wait_for(f"{autosaves} >= 1", timeout=60)
        kernel.execute(f"{RUN}.stop()")
        kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=30)
    help_text = " ".join(kernel.value("get_ipython().magics_manager.magics['cell']['interruptible_fit'].__doc__").split())
    assert "--autosave SECONDS" in help_text


def test_loads_from_the_kernel_config_too(tmp_path, runtime_dir):
    from kernel_harness import BASE_SETUP

    runtime_dir.parent.mkdir(exist_ok=True)
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text("c.InteractiveShellApp.extensions = ['jupyter_traincontrol']\n")
    kernel = Kernel(tmp_path, runtime_dir.parent, setup=BASE_SETUP, env={"IPYTHONDIR": str(profile.parent)})
    try:
        start_fit(kernel, "from-config")
        kernel.interrupt()  # the kernel was idle since start: the hooks were installed at load
        kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=30)
    finally:
        kernel.shutdown()


def test_top_level_await_and_subprocesses_still_work(kernel):
    start_fit(kernel, "await")
    assert "hello" in kernel.execute("!echo hello").stdout
    assert kernel.value("__import__('subprocess').run(['true']).returncode") == 0
    msg_id = kernel.start_cell("import asyncio\nprint('busy', flush=True)\nawait asyncio.sleep(30)")
    started = time.monotonic()
    kernel.interrupt()
    result = kernel.collect(msg_id, timeout=20)
    assert time.monotonic() - started < 10  # cancelled promptly, not after 30 s
    assert result.ename in ("KeyboardInterrupt", "CancelledError")
    kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=30)


def test_plain_ipython_terminal_gets_a_text_summary(tmp_path, runtime_dir):
    from kernel_harness import run_terminal_session

    result = run_terminal_session(tmp_path, runtime_dir, then=(
        "print(repr(run.state))\n"
        "get_ipython().run_line_magic('pprint', '')\n"
        "print(run._repr_mimebundle_().keys())\n"
    ))
    assert result.returncode == 0, result.stderr
    assert "[traincontrol] term: running" in result.stdout
    assert "[traincontrol] term: finished" in result.stdout
    assert "'finished'" in result.stdout
    # Text and the run's own mime type (the view after a restart); no widget view in a terminal.
    assert "dict_keys(['text/plain', 'application/vnd.jupyter-traincontrol.run+json'])" in result.stdout


def test_loading_the_extension_does_not_import_keras():
    """``%load_ext`` is instant: Keras (and TensorFlow) load with the first run."""
    code = (
        "import sys; from IPython.testing.globalipapp import start_ipython; shell = start_ipython();"
        "shell.run_line_magic('load_ext', 'jupyter_traincontrol');"
        "assert 'interruptible_fit' in shell.magics_manager.magics['cell'];"
        "print(sorted(m for m in ('keras', 'tensorflow', 'jax', 'torch') if m in sys.modules))"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def type_into(kernel, model_id: str, text: str) -> None:
    """Types `text` into a widget Text and presses Enter, as a browser does
    (with continuous_update off, the value syncs on Enter)."""
    content = {"comm_id": model_id, "data": {"method": "update", "state": {"value": text}, "buffer_paths": []}}
    kernel.kc.shell_channel.send(kernel.kc.session.msg("comm_msg", content))


def test_the_panel_sets_the_learning_rate_and_rolls_back_after_confirming(kernel):
    kernel.execute("scale = keras.Variable(1.0, trainable=False); steer = {'scale': scale}")
    start_fit(kernel, "steered", options="--tunables steer --on-nan rollback")
    kernel.wait_for(f"{RUN}.panel.learning_rate.value == '0.01'", timeout=10)
    type_into(kernel, kernel.value(f"{RUN}.panel.learning_rate.model_id"), "0.002")
    kernel.wait_for("abs(float(model.optimizer.learning_rate.numpy()) - 0.002) < 1e-9", timeout=30)
    kernel.wait_for(f"{RUN}.panel.learning_rate.value == '0.002'", timeout=10)
    assert kernel.value(f"[c['by'][:33] for c in {RUN}.lifecycle.journal.changes]") == ["'set learning_rate=0.002' #panel-"]
    type_into(kernel, kernel.value(f"{RUN}.panel.learning_rate.model_id"), "fast")
    kernel.wait_for(f"'takes a finite number' in {RUN}.panel.note.value", timeout=10)
    kernel.execute(f"{RUN}.send('set scale=0.5')")
    kernel.wait_for("float(scale.numpy()) == 0.5", timeout=30)
    assert kernel.value(f"{RUN}.panel.buttons['rollback'].disabled")  # no checkpoint yet
    kernel.click(button(kernel, "save"))
    kernel.wait_for(f"len({RUN}.checkpoints) == 1 and not {RUN}.panel.buttons['rollback'].disabled", timeout=30)
    kernel.click(button(kernel, "rollback"))
    kernel.wait_for(f"{RUN}.panel.buttons['rollback'].description == 'Confirm rollback'", timeout=10)
    assert kernel.value(f"{RUN}.callback.session.steering.rollbacks") == 0  # the first click only asks
    kernel.click(button(kernel, "rollback"))
    kernel.wait_for(f"{RUN}.callback.session.steering.rollbacks == 1", timeout=30)
    assert kernel.value(f"{RUN}.panel.buttons['rollback'].description") == "Rollback"
    kernel.execute(f"{RUN}.stop()")
    kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=30)
    assert kernel.value("history.history['rollbacks'][-1]") == 1
    assert kernel.value("history.history['scale'][-1]") == 0.5


def test_tunables_must_name_a_dict(kernel):
    result = kernel.execute("%%interruptible_fit --tunables nowhere\nmodel.fit(x, y)")
    assert result.status == "error"
    assert "--tunables nowhere: found nothing; expected a dict of names to Keras variables" in result.evalue


def test_a_finished_run_leaves_a_checkpoint_that_another_run_resumes_from(kernel, tmp_path):
    cell = "%%interruptible_fit --name {name} {options}\nhistory = model.fit(x, y, batch_size=8, epochs={epochs}, verbose=0)\n"

    def run(name, options="", epochs=2):
        result = kernel.execute(cell.format(name=name, options=options, epochs=epochs))
        assert result.status == "ok", result.error
        kernel.wait_for(f"{RUN}.state == 'finished'", timeout=60)
        return [read_sidecar(path) for path in kernel.value(f"[str(p) for p in {RUN}.checkpoints]")]

    (end,) = run("ends")
    assert (end["reason"], end["resume_epoch"], end["global_step"]) == ("end", 2, 16)
    assert kernel.value(f"{RUN}.lifecycle.record()['end_reason']") == "finished"
    assert run("no-end", "--no-save-at-end") == []
    kernel.execute("%config TrainControlMagics.save_at_end = False")
    assert run("by-config") == []
    kernel.execute("%config TrainControlMagics.save_at_end = True")

    (own,) = run("next", "--resume-from ends", epochs=3)  # ends's last checkpoint, in checkpoints/ends
    assert kernel.value("history.epoch") == [2] and kernel.value("int(model.optimizer.iterations.numpy())") == 24
    assert (own["run"], own["reason"]) == ("next", "end")
    assert (tmp_path / "checkpoints" / "next" / own["file"]).is_file()

    wrong = kernel.execute(cell.format(name="wrong", options="--resume-from nobody", epochs=1))
    assert wrong.ename == "UsageError"
    assert "Cannot resume from run 'nobody'" in wrong.evalue and "no run 'nobody' is listed" in wrong.evalue


def test_a_kernel_restart_leaves_the_run_listed_with_how_it_ended(kernel, tmp_path):
    start_fit(kernel, "restarted", sleep=0.05)
    kernel.km.restart_kernel(now=False)  # the kernel interrupts first, then asks for the shutdown
    listed = {run["name"]: run for run in json.loads(cli("list", "--all", "--json").stdout)}
    run = listed["restarted"]
    assert (run["state"], run["end_reason"], run["live"]) == ("stopped", "kernel-restart", False)
    (checkpoint,) = run["checkpoints"]
    assert read_sidecar(checkpoint)["reason"] in ("stop", "interrupt")


_TF_LOG_LEVEL = (
    "import os\n"
    "from traitlets.config import Config\n"
    "from IPython.core.interactiveshell import InteractiveShell\n"
    "config = Config()\n"
    "config.TrainControlMagics.hide_tensorflow_logs = {hide}\n"
    "shell = InteractiveShell.instance(config=config)\n"
    "shell.run_line_magic('load_ext', 'jupyter_traincontrol')\n"
    "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'), flush=True)\n"
    "import tensorflow as tf; tf.constant(1.0) + 1\n"
)


@pytest.mark.parametrize("hide, user_value, seen", [(True, None, "2"), (True, "1", "1"), (False, None, "None")])
def test_loading_before_tensorflow_keeps_its_native_info_lines_out(hide, user_value, seen):
    import subprocess
    import sys

    from helpers import child_env

    env = {key: value for key, value in child_env().items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    if user_value is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = user_value  # the user's own setting is kept
    result = subprocess.run([sys.executable, "-c", _TF_LOG_LEVEL.format(hide=hide)], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [seen]
    if seen == "2":
        assert "cpu_feature_guard" not in result.stderr  # TensorFlow's INFO line about CPU instructions
