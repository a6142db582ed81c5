"""REST handlers of the server extension: the runs of this user, and commands to them.

Routes, under ``<base_url>/traincontrol/api/``:

- ``GET runs``: a JSON array, one object per listed run: the record that
  ``jupyter-traincontrol list --json`` prints, plus ``kernel_id`` (the kernel
  the run lives in, or null), ``kernel_on_this_server`` and
  ``notebook_path`` (the session path of that kernel on this server, or
  null). ``GET runs?all=true``: also the ended runs of the history, as
  ``list --all --json`` prints them (``live: false``, ``end_reason``).
- ``GET commands``: ``{"commands": [{"name", "help"}], "allowed": {state:
  [command, ...]}}``, the one help table of the vocabulary and which
  commands make sense in which state.
- ``POST runs/<name>/commands`` with ``{"command": "stop"}`` (and, from
  the notebook panel's buttons, ``"sender": "notebook-panel"``: the run's
  log then says who sent it; the default is ``side-panel``): 202 once the
  command is in the run's FIFO; 400 for a bad body or an unknown command,
  404 for an unknown run, 409 for a run that no longer listens, 503 if the
  channel could not take it. Errors are JSON with a ``message``.

Both need an authenticated user (token or cookie, 403 otherwise) allowed to
read (GET) or write (POST) the ``kernels`` resource. Registry reads and FIFO
writes run on a thread pool, never on the server's event loop.
"""

from __future__ import annotations

import asyncio
import functools
import json
from concurrent.futures import Executor
from typing import Any, Callable, TypeVar

import tornado.web
from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler

from ...protocol import COMMAND_HELP, COMMAND_NAMES, RunState, UnknownCommandError, allowed_commands
from ...transport.channels import ChannelError, NotListeningError
from ..client import RunNotFoundError, public_records, send

__all__ = ["RunsHandler", "CommandsHandler", "VocabularyHandler", "EXECUTOR_SETTING", "vocabulary", "command_from_body"]

#: The key of the extension's thread pool in the Tornado settings.
EXECUTOR_SETTING = "traincontrol_executor"
_MAX_BODY_BYTES = 4096
#: The ``sender`` of a POST body, and the word its request id starts with.
SENDERS = {"side-panel": "rest", "notebook-panel": "nbpanel"}
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")

_T = TypeVar("_T")


def vocabulary() -> dict[str, Any]:
    """What ``GET commands`` answers: each command's help, and which commands
    make sense in which state (the side panel enables its buttons by it)."""
    return {
        "commands": [{"name": str(command), "help": text} for command, text in COMMAND_HELP.items()],
        "allowed": {str(state): [str(c) for c in allowed_commands(state)] for state in RunState},
    }


class _TrainControlHandler(APIHandler):
    """What both handlers share: authorization resource and the thread pool."""

    auth_resource = "kernels"

    async def _run_blocking(self, function: Callable[..., _T], *args: Any) -> _T:
        """Runs `function(*args)` on the extension's thread pool."""
        executor: Executor | None = self.settings.get(EXECUTOR_SETTING)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, functools.partial(function, *args))


class RunsHandler(_TrainControlHandler):
    """``GET runs``: the runs of this user, with their kernel's notebook."""

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        shown = self.get_argument("all", "false").strip().lower()
        if shown not in _TRUE + _FALSE:
            raise tornado.web.HTTPError(400, f"Got all={shown[:40]!r}; expected all=true or all=false.")
        try:
            records = await self._run_blocking(public_records, shown in _TRUE)
        except OSError as error:  # an unsafe registry folder (UnsafePathError), an I/O error
            raise tornado.web.HTTPError(500, f"Cannot read the registry of runs: {error}") from error
        kernel_ids = set(self.kernel_manager.list_kernel_ids())
        notebook_paths = await self._notebook_paths()
        for record in records:
            kernel_id = record.get("kernel_id")
            if not isinstance(kernel_id, str):
                kernel_id = None
            here = kernel_id in kernel_ids
            record["kernel_id"] = kernel_id
            record["kernel_on_this_server"] = here
            record["notebook_path"] = notebook_paths.get(kernel_id) if here else None
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(records))

    async def _notebook_paths(self) -> dict[str, str]:
        """Maps kernel ids of this server's sessions to their paths."""
        session_manager = getattr(self, "session_manager", None)
        if session_manager is None:
            return {}
        sessions = await ensure_async(session_manager.list_sessions())
        return {
            session["kernel"]["id"]: session.get("path") or session.get("name")
            for session in sessions
            if session.get("kernel")
        }


class VocabularyHandler(_TrainControlHandler):
    """``GET commands``: the commands, their help, and which apply in which state."""

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(vocabulary()))


class CommandsHandler(_TrainControlHandler):
    """``POST runs/<name>/commands``: delivers one command to a run's FIFO."""

    @tornado.web.authenticated
    @authorized
    async def post(self, name: str) -> None:
        try:
            command, sender = command_from_body(self.request.body, with_sender=True)
        except BadBodyError as error:
            raise tornado.web.HTTPError(400, str(error)) from None
        try:
            sent = await self._run_blocking(send, name, command, SENDERS[sender])
        except UnknownCommandError as error:
            raise tornado.web.HTTPError(400, str(error)) from error
        except RunNotFoundError as error:
            raise tornado.web.HTTPError(404, str(error)) from error
        except NotListeningError as error:
            raise tornado.web.HTTPError(409, str(error)) from error
        except ChannelError as error:
            raise tornado.web.HTTPError(503, f"Could not deliver {command[:80]!r} to run {name[:80]!r}: {error}") from error
        except OSError as error:  # UnsafePathError: the run's channel is not a private FIFO of ours
            raise tornado.web.HTTPError(409, f"Refused to write to run {name[:80]!r}: {error}") from error
        self.set_status(202)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"name": name, "command": str(sent), "id": sent.request_id, "message": f"Sent {sent} to {name}."}))


class BadBodyError(ValueError):
    """A POST body that is not ``{"command": "..."}``; the message says why."""


def command_from_body(raw: bytes, with_sender: bool = False) -> str | tuple[str, str]:
    """The ``command`` of a POST body (and its ``sender``).

    Args:
        raw: The request body, as received.
        with_sender: Also return the body's ``sender`` (one of `SENDERS`;
            ``side-panel`` if it has none).

    Returns:
        The command text (not yet parsed), or ``(command, sender)``.

    Raises:
        BadBodyError: For anything but a JSON object with a text
            ``command`` and, if any, a known ``sender`` (never another
            exception, whatever the bytes).
    """
    expected = f'Expected a JSON object like {{"command": "stop"}} with a command among: {", ".join(COMMAND_NAMES)}.'
    if len(raw) > _MAX_BODY_BYTES:
        raise BadBodyError(f"The body has {len(raw)} bytes; at most {_MAX_BODY_BYTES} expected. {expected}")
    try:
        body = json.loads(raw or b"")
    except (ValueError, RecursionError):  # RecursionError: JSON nested too deep
        shown = raw[:60].decode("utf-8", "backslashreplace")
        raise BadBodyError(f"The body is not JSON: {shown!r}. {expected}") from None
    if not isinstance(body, dict) or "command" not in body:
        raise BadBodyError(f"Got {_short_json(body)}. {expected}")
    command = body["command"]
    if not isinstance(command, str):
        raise BadBodyError(f"Got command {_short_json(command)}, not a string. {expected}")
    sender = body.get("sender", "side-panel")
    if not isinstance(sender, str) or sender not in SENDERS:
        raise BadBodyError(f"Got sender {_short_json(sender)}; expected one of: {', '.join(SENDERS)}, or none.")
    return (command, sender) if with_sender else command


def _short_json(value: Any) -> str:
    """At most 60 characters of `value` as JSON, for an error message."""
    try:
        text = json.dumps(value)
    except (ValueError, RecursionError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."
