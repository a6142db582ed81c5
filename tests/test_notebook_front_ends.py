"""Where the panel's clicks travel through the kernel (VS Code, Colab, classic Notebook, no server extension).

A click is a comm message that the kernel reads only between cells: one
made while another cell runs waits for it. These tests click as such a
front end does (comm messages, no JupyterLab extension) in a real kernel:
a click the run never took is said in the ended panel and its log, never
dropped; the panel says once per kernel what the server extension would
add, inside the class the JupyterLab extension hides where it serves.
"""

from __future__ import annotations

import re

import pytest

from helpers import wait_until
from kernel_harness import RUN, busy_sleep, start_fit

pytestmark = pytest.mark.timeout(240)

PANEL = f"{RUN}.panel"
ENDED = "('stopped', 'aborted', 'finished', 'failed')"


def button(kernel, key: str) -> str:
    return kernel.value(f"{PANEL}.buttons[{key!r}].model_id")


def words(html: str) -> str:
    """The text of an HTML fragment, as it reads (tags and <wbr> left out)."""
    return re.sub(r"<[^>]+>", "", html).replace("&#x27;", "'")


def busy_cell_until_the_run_ends(kernel) -> str:
    """Starts a cell that keeps the kernel busy; interrupted, it waits for
    the run to end before it ends (the clicks queued meanwhile come after)."""
    return kernel.start_cell(
        "import time\n"
        "print('busy', flush=True)\n"
        "try:\n"
        f"{busy_sleep(60, indent='    ')}"
        "except KeyboardInterrupt:\n"
        f"    while {RUN}.state not in {ENDED}:\n"
        "        time.sleep(0.05)\n"
        "    raise\n"
    )


def test_clicks_queued_behind_a_busy_cell_that_the_interrupt_outran_are_said_not_applied(kernel):
    """The issue's case: Save and Pause clicked while another cell runs wait
    for it; the toolbar interrupt ends that cell and stops the run with a
    checkpoint first. The clicks then reach a run that has ended: the
    ended panel and its log say they were not applied, and why."""
    start_fit(kernel, "queued")
    save, pause = button(kernel, "save"), button(kernel, "pause")
    msg_id = busy_cell_until_the_run_ends(kernel)
    kernel.click(save)
    kernel.click(pause)
    kernel.interrupt()
    result = kernel.collect(msg_id, timeout=60)
    assert result.error and result.error["ename"] == "KeyboardInterrupt"
    # ipykernel 6 (Colab's) aborts the cells that come while it still handles what waited behind a failed one.
    wait_until(lambda: kernel.execute("pass").status == "ok", timeout=30, message="the kernel to take cells again")
    kernel.wait_for(f"{PANEL}.outcome.value.count('not applied') == 2", timeout=30)
    outcome = words(kernel.value(f"{PANEL}.outcome.value"))
    # Whether the kernel took the clicks before the interrupt's stop acted (then the run ended before taking
    # them) or after (the run had ended when the kernel took them) depends on the kernel's timing: either way,
    # each click is said not applied, and why.
    taken_after = ("Save: 'save' not applied: the run had ended (Stopped by a kernel interrupt) when the kernel took "
                   "the click (a click made while another cell runs waits until that cell ends).")
    taken_before = "Save: 'save' not applied: the run ended (Stopped by a kernel interrupt) before it took the command."
    assert taken_after in outcome or taken_before in outcome, outcome
    assert re.search(r"Pause: 'pause' not applied: the run (had )?ended \(Stopped by a kernel interrupt\)", outcome)
    log = kernel.value(f"[e['message'] for e in {RUN}.lifecycle.journal.events if e['kind'] == 'warning']")
    assert [line.split(":")[0] for line in log if "not applied" in line] == ["Save", "Pause"]
    assert "not applied" in kernel.value(f"{PANEL}.log.value")
    assert kernel.value(f"({RUN}.state, len({RUN}.checkpoints))") == ["stopped", 1]  # the stop's checkpoint only


def test_a_click_queued_behind_a_busy_cell_acts_if_the_run_still_goes(kernel):
    """The common case: the busy cell ends by itself, the run still trains,
    and the queued click acts then (nothing is said not applied)."""
    start_fit(kernel, "waited")
    save = button(kernel, "save")  # asked first: a cell asked behind the busy one would read its messages
    msg_id = kernel.start_cell("import time; print('busy', flush=True); time.sleep(2)")
    kernel.click(save)
    kernel.collect(msg_id, timeout=30)
    kernel.wait_for(f"len({RUN}.checkpoints) == 1", timeout=30)
    kernel.execute(f"{RUN}.stop()")
    kernel.wait_for(f"'traincontrol-outcome' in {PANEL}.outcome.value", timeout=30)
    assert "not applied" not in kernel.value(f"{PANEL}.outcome.value")


def test_a_click_the_run_ended_before_taking_is_said_not_applied(kernel):
    """Sent while the run still went, never taken: the cell's fit had
    ended (a command then waits for the cell's next fit) and the cell ended
    with no other. The ended panel says so, not a 'sent' that came to nothing."""
    cell = (
        "%%interruptible_fit --name after-fit\n"
        "history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)\n"
        "time.sleep(3)  # after the fit: commands wait for a next one\n"
    )
    assert kernel.execute(cell).status == "ok"
    kernel.wait_for(f"{RUN}.fit_calls == 1 and not {RUN}.drivers.driving", timeout=60)
    kernel.click(button(kernel, "save"))
    kernel.wait_for(f"'Save: sent' in {PANEL}.note.value", timeout=10)
    kernel.wait_for(f"'not applied' in {PANEL}.outcome.value", timeout=30)
    outcome = words(kernel.value(f"{PANEL}.outcome.value"))
    assert ("Save: 'save' not applied: the run ended (Finished: training ran to its end) before it took the "
            "command.") in outcome, outcome
    assert kernel.value(f"[a['command'] for a in {RUN}.lifecycle.journal.acks]") == []  # the run never answered it
    assert "not applied" in kernel.value(f"{PANEL}.log.value")


def test_the_panel_says_once_per_kernel_what_the_server_extension_adds(kernel):
    """In the first panel of the kernel, inside the class the JupyterLab
    extension hides in the panels whose clicks it sends to the server; not
    in the next panels. A run that ends within seconds hands it on."""
    note = f"{PANEL}.front_end_note.value"
    start_fit(kernel, "first")
    first = kernel.value(note)
    assert 'class="traincontrol-busy-note traincontrol-server-note"' in first
    text = words(first)
    assert "Here the panel's clicks go through the kernel" in text and "jupyter server extension list" in text
    assert "jupyter-traincontrol send first stop" in text and "(Said once per kernel.)" in text
    start_fit(kernel, "second")
    assert kernel.value(note) == ""  # said once
    kernel.execute("[run.stop() for run in jupyter_traincontrol.runs()]")
    kernel.wait_for("all(run.state == 'stopped' for run in jupyter_traincontrol.runs())", timeout=30)
    kernel.wait_for("jupyter_traincontrol.runs()[0].panel.front_end_note.value == ''", timeout=10)  # ended: gone
    start_fit(kernel, "third")  # the first ran a few seconds only: it may not have been read
    assert "(Said once per kernel.)" in words(kernel.value(note))
    kernel.execute(f"{RUN}.abort()")
    kernel.wait_for(f"{RUN}.state == 'aborted'", timeout=30)


def test_a_request_the_run_answered_is_never_said_not_applied_however_many_answers_follow():
    """The run keeps its newest answers only: the panel stops following a
    request once answered, so one answered long before the end is not taken
    for one never taken. Said once, in the log and the ended panel."""
    from jupyter_traincontrol.notebook.click_notes import ClickNotes
    from jupyter_traincontrol.protocol import parse_request

    logged = []
    notes = ClickNotes(lambda kind, message: logged.append((kind, message)))
    save, pause = parse_request("save #panel-1"), parse_request("pause #panel-2")
    notes.sent("Save", save)
    notes.sent("Pause", pause)
    answered = {save.request_id}
    notes.forget_answered(lambda request: request.request_id in answered)  # a redraw while the run goes
    answered.clear()  # its answer pushed out by newer ones since
    for _redraw in range(2):  # the ended panel is drawn again on a late click: said once
        notes.check_unanswered(lambda request: request.request_id in answered, "Stopped by a command")
    line = "Pause: 'pause' not applied: the run ended (Stopped by a command) before it took the command."
    assert logged == [("warning", line)]
    assert "Pause: &#x27;pause&#x27; not applied" in notes.not_applied_html()
