"""Who sent a request, in words, and how a run ended: pure, for the run and every reader.

A request id starts with the word of its sender (``cli-3f2a...``, see
`transport.send.with_id`). `sender_words` turns it into what a person
reads in a run's log ("by cli", "by the side panel"); the id itself stays
in the record's ``acks``, where ``send --wait`` looks for it.

`END_REASONS` are the values of a record's ``end_reason``: how a run that
has ended came to end. `end_reason` says it from the final state and the
request that ended the run, if one did. `resume_hint` says how to go on
from a run whose process died (the CLI, and the side panel's
``resumeHint``, word for word).

Example:

>>> sender_words("rest-0a1b2c3d4e5f")
'the side panel'
>>> end_reason("stopped", "interrupt-0a1b2c3d4e5f")
'interrupt'
"""

from __future__ import annotations

__all__ = ["END_REASONS", "SENDERS", "sender_of", "sender_words", "end_reason", "is_interrupt", "resume_hint"]

#: How a run ended, as a record's ``end_reason`` says it.
END_REASONS = {
    "finished": "fit (or a TrainLoop) ran to its end",
    "callback": "a callback of the user's ended fit early (EarlyStopping, TerminateOnNaN: its stop_training)",
    "command": "a stop or abort command (which one: the state)",
    "interrupt": "a kernel interrupt, Ctrl+C, or SIGTERM (a script's or a job process's)",
    "kernel-restart": "a kernel shutdown or restart stopped it",
    "error": "it failed (the record's error says why)",
    "nan": "a loss that was not finite stopped it (on_nan)",
    "process-gone": "its process died without ending the run",
}

#: The words of the senders this package gives request ids to.
SENDERS = {
    "cli": "cli",
    "client": "a client",
    "rest": "the side panel",  # the REST API: the side panel, unless a body says otherwise
    "nbpanel": "the notebook panel",
    "panel": "the notebook panel",
    "notebook": "the notebook",
    "loop": "the loop's code",
    "interrupt": "a kernel interrupt",
    "sigint": "Ctrl+C",
    "shutdown": "the kernel's shutdown",
    "unload": "%unload_ext",
    "sigterm": "SIGTERM",
    "preemption": "a preemption notice",
}

_INTERRUPTS = frozenset({"interrupt", "sigint", "sigterm", "preemption"})


def sender_of(request_id: str | None) -> str | None:
    """The sender's word of a request id (``cli`` of ``cli-3f2a...``), or
    None for an id no sender of this package gave (``echo 'stop #k3'``)."""
    if not request_id or "-" not in request_id:
        return None
    word = request_id.rsplit("-", 1)[0]
    return word if word in SENDERS else None


def is_interrupt(request_id: str | None) -> bool:
    """True for a request an interrupt sent (a kernel interrupt, Ctrl+C,
    SIGTERM, a preemption notice): its stop's checkpoint has reason
    ``interrupt``, and the run ends ``interrupt``."""
    return sender_of(request_id) in _INTERRUPTS


def sender_words(request_id: str | None) -> str | None:
    """Who sent a request, for a person: ``cli``, ``the side panel``, ...;
    an id of no known sender as ``#ID``; None without an id."""
    if not request_id:
        return None
    word = sender_of(request_id)
    return SENDERS[word] if word is not None else f"#{request_id}"


def end_reason(state: str, request_id: str | None = None, *, nan: bool = False) -> str | None:
    """How a run in final `state` ended (one of `END_REASONS`), or None for
    a state that is not final.

    Args:
        state: The run's final state.
        request_id: The id of the request that ended it (a ``stop`` or
            ``abort``), if any.
        nan: True if the NaN policy stopped it.
    """
    if state == "finished":
        return "finished"
    if state == "failed":
        return "error"
    if state not in ("stopped", "aborted"):
        return None
    if nan:
        return "nan"
    if is_interrupt(request_id):
        return "interrupt"
    word = sender_of(request_id)
    if word == "shutdown":
        return "kernel-restart"
    return "command"


def resume_hint(record: dict) -> str:
    """How to continue a run whose process died (``end_reason``
    ``process-gone``: killed for memory, a crash) from its newest
    checkpoint; '' for any other run, or one that left no checkpoint.

    Args:
        record: The run's record (``name``, ``origin``, ``end_reason``,
            ``checkpoints``).
    """
    checkpoints = record.get("checkpoints") or []
    if record.get("end_reason") != "process-gone" or not checkpoints:
        return ""
    newest = str(checkpoints[-1]).replace("\\", "/").rsplit("/", 1)[-1]
    name = record.get("name")
    how = (f"%%interruptible_fit --name {name} --resume" if record.get("origin") == "notebook"
           else f"resume=True (run {name})")
    return f"Its newest checkpoint is {newest}: continue from it with {how}."
