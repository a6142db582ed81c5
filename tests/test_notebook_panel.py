"""The notebook panel as a person sees it: Abort asks first, an ended run shows how it ended, notices go.

Real kernels through jupyter_client; clicks are the comm messages a
browser sends (as in classic Notebook, where no JupyterLab extension
carries them), and what is checked is the widgets' state in the kernel.
"""

from __future__ import annotations

import re

import pytest

from kernel_harness import RUN, start_fit

pytestmark = pytest.mark.timeout(240)

PANEL = f"{RUN}.panel"


def button(kernel, key: str) -> str:
    return kernel.value(f"{PANEL}.buttons[{key!r}].model_id")


def words(html: str) -> str:
    """The text of an HTML fragment, as it reads (tags and <wbr> left out)."""
    return re.sub(r"<[^>]+>", "", html).replace("&#x27;", "'")


def test_abort_asks_first_and_the_question_lapses(kernel):
    kernel.execute("import jupyter_traincontrol.notebook.panel as panel_module; panel_module.CONFIRM_SECONDS = 2.0")
    start_fit(kernel, "asked")
    kernel.click(button(kernel, "abort"))
    kernel.wait_for(f"{PANEL}.buttons['abort'].description == 'Confirm abort'", timeout=10)
    kernel.wait_for(f"'Confirm abort' in {PANEL}.note.value", timeout=10)  # the panel says what the click does
    assert kernel.value(f"{RUN}.state") == "running"  # the first click only asks
    # Unconfirmed, the question lapses: the button reads Abort again, and a click asks again.
    kernel.wait_for(f"{PANEL}.buttons['abort'].description == 'Abort'", timeout=10)
    kernel.click(button(kernel, "abort"))
    kernel.wait_for(f"{PANEL}.buttons['abort'].description == 'Confirm abort'", timeout=10)
    kernel.click(button(kernel, "abort"))
    kernel.wait_for(f"{RUN}.state == 'aborted'", timeout=30)
    assert kernel.value(f"len({RUN}.checkpoints)") == 0


def test_a_finished_run_shows_its_outcome_and_checkpoints_instead_of_buttons(kernel):
    result = kernel.execute(
        "%%interruptible_fit --name done\n"
        "history = model.fit(x, y, batch_size=8, epochs=3, callbacks=[Slow(0.05)], verbose=0)\n"
    )
    assert result.status == "ok", result.error
    kernel.wait_for(f"{RUN}.lifecycle.progress.step > 0", timeout=60)
    kernel.click(button(kernel, "save"))  # a checkpoint of its own, whether or not a finished fit writes one
    kernel.wait_for(f"{RUN}.state == 'finished'", timeout=60)
    kernel.wait_for(f"'traincontrol-outcome' in {PANEL}.outcome.value", timeout=10)
    outcome = words(kernel.value(f"{PANEL}.outcome.value"))
    assert "Finished: training ran to its end at epoch 3/3 · batch 8/8" in outcome
    paths = kernel.value(f"[str(path) for path in {RUN}.checkpoints]")
    assert paths and all(path in outcome for path in paths), outcome  # each checkpoint with its whole path
    assert "(save, epoch " in outcome
    assert "%%interruptible_fit --name done --resume" in outcome
    # Not a row of faded, disabled buttons: they are gone, the learning rate with them.
    assert kernel.value(f"{PANEL}.controls.layout.display") == "none"
    assert kernel.value(f"{PANEL}.outcome.layout.display") is None
    assert kernel.value(f"all(b.disabled for b in {PANEL}.buttons.values())")


def test_a_stopped_run_says_so_and_an_aborted_one_says_it_has_no_checkpoint(kernel):
    start_fit(kernel, "stopped-one")
    kernel.execute(f"{RUN}.stop()")
    kernel.wait_for(f"'traincontrol-outcome' in {PANEL}.outcome.value", timeout=30)
    outcome = words(kernel.value(f"{PANEL}.outcome.value"))
    assert "Stopped" in outcome and "(stop, epoch " in outcome and "1 checkpoint" in outcome
    start_fit(kernel, "aborted-one")
    kernel.execute(f"{RUN}.abort()")
    kernel.wait_for(f"'traincontrol-outcome' in {PANEL}.outcome.value", timeout=30)
    assert "No checkpoint: an abort writes none." in words(kernel.value(f"{PANEL}.outcome.value"))


def test_click_notices_do_not_pile_up(kernel):
    kernel.execute("import jupyter_traincontrol.notebook.panel as panel_module; panel_module.NOTE_SECONDS = 3.0")
    start_fit(kernel, "noticed")
    save = button(kernel, "save")
    for _ in range(3):
        kernel.click(save)
    kernel.wait_for(f"len({RUN}.checkpoints) >= 1 and {PANEL}.note.value.count('Save: sent') == 2", timeout=30)
    assert kernel.value(f"{PANEL}.note.value.count('Save: sent')") == 2  # the last two, not all three
    kernel.wait_for(f"'Save: sent' not in {PANEL}.note.value", timeout=10)  # news for a few seconds
    kernel.execute(f"{RUN}.stop()")
    kernel.wait_for(f"{RUN}.state == 'stopped'", timeout=30)


def test_the_learning_rate_reads_as_the_side_panel_writes_it(kernel):
    start_fit(kernel, "rates")
    kernel.execute(f"{RUN}.send('set lr=3e-4')")
    kernel.wait_for(f"{PANEL}.learning_rate.value == '3e-4'", timeout=30)
    kernel.execute(f"{RUN}.send('set lr=0.001')")
    kernel.wait_for(f"{PANEL}.learning_rate.value == '0.001'", timeout=30)
    kernel.execute(f"{RUN}.abort()")
    kernel.wait_for(f"{RUN}.state == 'aborted'", timeout=30)


def test_the_output_names_its_run_for_when_the_widgets_are_gone(kernel):
    result = start_fit(kernel, "named")
    (bundle,) = result.results
    reference = bundle["application/vnd.jupyter-traincontrol.run+json"]
    record = kernel.value(f"{{'run_id': {RUN}.lifecycle.run_id, 'dir': str({RUN}.lifecycle.store.directory)}}")
    assert reference == {"name": "named", "run_id": record["run_id"], "checkpoint_dir": record["dir"], "version": 1}
    assert "application/vnd.jupyter.widget-view+json" in bundle  # the live panel comes first
    kernel.execute(f"{RUN}.abort()")
    kernel.wait_for(f"{RUN}.state == 'aborted'", timeout=30)


def test_the_ended_panel_names_the_callback_that_ended_fit_early():
    from jupyter_traincontrol.notebook.panel_text import outcome_html, outcome_text

    assert outcome_text("finished", "callback", "EarlyStopping") == "Stopped early by EarlyStopping"
    assert outcome_text("finished", "callback") == "Stopped early by a callback"
    assert "Stopped early by TerminateOnNaN</b> at epoch 4/60" in outcome_html(
        "t", "finished", "callback", "epoch 4/60", [], stopped_by="TerminateOnNaN")


def test_the_ended_panel_names_the_call_that_loads_each_format():
    from jupyter_traincontrol.notebook.panel_text import load_hint, outcome_html

    assert load_hint("ck/ckpt-000001-epoch0001-step000004.keras") == "keras.models.load_model(run.checkpoints[-1])"
    assert load_hint("ck/ckpt-000001-epoch0001-step000004.keras", keras2=True) == (
        "tf_keras.models.load_model(run.checkpoints[-1])")
    assert load_hint("ck/ckpt-000001-epoch0001-step000004.pt") == "torch.load(run.checkpoints[-1], weights_only=True)"
    assert load_hint("ck/ckpt-000001-epoch0001-step000004.ckpt") == "load(run.checkpoints[-1])"  # save=/load= folders
    shown = outcome_html("t", "stopped", "command", "", [("ck/ckpt-000001-epoch0001-step000004.pt", {}, True)])
    assert "torch.load(run.checkpoints[-1], weights_only=True)" in shown and "keras.models" not in shown
