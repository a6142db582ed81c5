"""What the panel says where its clicks travel through the kernel: they wait while another cell runs.

A click on the panel is a comm message, which a kernel reads only between
two cells. In JupyterLab 4 and Notebook 7 with this package's server
extension, the JupyterLab extension sends the clicks to the server instead
(the run's FIFO, at once) and marks those panels with the class
``traincontrol-direct``; its stylesheet hides what is inside the class
`WAITS_CLASS` there. Everywhere else (VS Code, Colab, classic Notebook,
JupyterLab without the server extension) the clicks wait, and the panel
says so:

- `busy_note_html`: while the kernel runs a cell, that clicks wait until it
  ends, and how to act at once (the terminal); a click made then adds, at
  once and without the kernel (CSS: a panel button that has the focus),
  that this very click waits.
- `server_extension_note_html`: once per kernel (`take_server_note`), what
  going through the kernel costs (busy-time clicks, the side panel) and how
  to get both.

Why the page decides, not the kernel: a kernel cannot know which front end
shows its output. A notebook may be open in two; VS Code may use a remote
Jupyter server that has the server extension without its page; a
JupyterLab may have the server extension but not the JupyterLab one. Only
the page knows whether its clicks go to the server, and it says so with
``traincontrol-direct``: the notes are written into every panel that needs
them, inside `WAITS_CLASS`, and shown exactly where clicks wait. The
server-extension note appears after a few seconds (CSS), by when the
JupyterLab extension has marked a panel it serves (its first poll, within
a second).
"""

from __future__ import annotations

import html
import threading

__all__ = ["WAITS_CLASS", "busy_note_html", "server_extension_note_html", "take_server_note", "give_back_server_note"]

#: The class of what holds only where clicks wait for the kernel: the
#: JupyterLab extension's stylesheet hides it in the panels whose clicks it
#: sends to the server (``.traincontrol-panel.traincontrol-direct``).
WAITS_CLASS = "traincontrol-busy-note"
#: Seconds before the server-extension note shows: time for the JupyterLab
#: extension to mark a panel it serves (it polls every second at most).
SERVER_NOTE_DELAY_SECONDS = 3

# `:has` and `:focus`: a click on a panel button focuses it (Chromium, Firefox
# on Linux and Windows); where it does not (Safari), the note says it anyway.
_STYLE = (
    "<style>"
    ".traincontrol-click-waits{display:none;font-weight:bold}"
    ".traincontrol-panel:has(button.traincontrol-button:focus) .traincontrol-click-waits{display:inline}"
    "@keyframes traincontrol-after-a-while{from{visibility:hidden;max-height:0}to{visibility:visible}}"
    f".traincontrol-server-note{{animation:traincontrol-after-a-while {SERVER_NOTE_DELAY_SECONDS}s step-end;"
    "overflow:hidden}"
    "</style>"
)

_lock = threading.Lock()
_server_note_taken = False  # by the panel that says it, until given back


def busy_note_html(name: str, fifo: str | None) -> str:
    """What the panel says while the kernel runs a cell.

    Args:
        name: The run's name.
        fifo: Its FIFO, or None.
    """
    return (
        f'<span class="{WAITS_CLASS}">'
        "The kernel is busy with a cell: clicks here wait until it finishes. "
        '<span class="traincontrol-click-waits">This click waits for the kernel: it acts when that cell ends, '
        "if the run is still going then (if not, the panel says it was not applied). </span>"
        "To act at once, in a terminal: "
        f"<code>jupyter-traincontrol send {html.escape(name)} stop</code> "
        "(or save, abort, pause, resume, <code>set lr=1e-4</code>, rollback), "
        f"or <code>echo stop &gt; {html.escape(str(fifo))}</code>."
        f"</span>{_STYLE}"
    )


def server_extension_note_html(name: str) -> str:
    """What going through the kernel costs, and how to get the rest: said once per kernel.

    Args:
        name: The run's name.
    """
    return (
        f'<div class="{WAITS_CLASS} traincontrol-server-note" '
        'style="font-size:12px;line-height:1.4;margin:2px 0;padding:4px 6px;'
        'border-left:3px solid var(--jp-warn-color1, #e37400)">'
        "<b>Here the panel's clicks go through the kernel</b>, so a click made while another cell runs waits "
        "until that cell ends, and there is no Training runs side panel. JupyterLab 4 and Notebook 7 with "
        "jupyter-traincontrol's server extension send the clicks at once and list every run in a side panel: "
        "install the package where the Jupyter server runs, check "
        "<code>jupyter server extension list</code> (else <code>jupyter server extension enable "
        "jupyter_traincontrol</code>), and restart the server. Meanwhile, from a terminal: "
        f"<code>jupyter-traincontrol send {html.escape(name)} stop</code>. (Said once per kernel.)"
        f"</div>{_STYLE}"
    )


def take_server_note() -> bool:
    """True for the first panel of this kernel that asks: it says the
    server-extension note. None other does, unless it is given back."""
    global _server_note_taken
    with _lock:
        taken, _server_note_taken = _server_note_taken, True
    return not taken


def give_back_server_note() -> None:
    """The panel that said it ended too soon to be read: the next one says it."""
    global _server_note_taken
    with _lock:
        _server_note_taken = False
