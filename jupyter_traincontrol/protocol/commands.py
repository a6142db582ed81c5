"""The command words: what may be said to a training run, and how a request is written.

This is the one place that knows the command words and what each one does
(the help table the CLI, the notebook panel and the REST API show), and the
grammar of a request line: ``WORD [ARGUMENT ...] [#ID]``, for example
``stop``, ``set lr=1e-4`` or ``save #k3x9``. Pure: it parses and validates,
and does no I/O. `states` says which commands make sense in which run state.

Commands travel as text lines, UTF-8, one command a line, so that
``echo stop > FIFO`` works from any shell. `Request.encode_line` writes one;
`LineDecoder` reads a byte stream back into requests whatever the writes
look like: it joins a line split across several reads, splits several lines
of one read, and turns anything that is not a command (unknown words,
invalid UTF-8, binary garbage, overlong lines) into a `Rejected` without
losing the next line.

A request id starts with the word of its sender (``cli-3f2a...``, see
`transport.channels.with_id`). `sender_words` turns it into what a person
reads in a run's log ("by cli", "by the side panel"); the id itself stays
in the record's ``acks``, where ``send --wait`` looks for it.

Example:

>>> parse_request("set lr=1e-4 #a1")
Request(command=<Command.SET: 'set'>, args=('learning_rate=0.0001',), request_id='a1')
>>> sender_words("rest-0a1b2c3d4e5f")
'the side panel'
>>> decoder = LineDecoder()
>>> decoder.feed(b"sto")
[]
>>> decoder.feed(b"p\\nbogus\\n")
[Request(command=<Command.STOP: 'stop'>, args=(), request_id=None), Rejected(text='bogus', reason="Unknown command 'bogus'. Expected one of: stop, save, abort, pause, resume, set, rollback.")]
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re

__all__ = [
    "Command",
    "COMMAND_NAMES",
    "COMMAND_HELP",
    "UnknownCommandError",
    "Request",
    "parse_command",
    "parse_request",
    "shorten",
    "TUNABLE_ALIASES",
    "MAX_ROLLBACK_DEPTH",
    "assignments",
    "rollback_depth",
    "validate_tunable_name",
    "SENDERS",
    "sender_of",
    "sender_words",
    "is_interrupt",
    "LineDecoder",
    "Rejected",
    "MAX_LINE_BYTES",
]

_REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")

class Command(str, enum.Enum):
    """A command a training run obeys at its next batch boundary."""

    STOP = "stop"
    """Write a checkpoint, then end `fit` gracefully."""
    SAVE = "save"
    """Write a checkpoint; training goes on."""
    ABORT = "abort"
    """End `fit` gracefully without writing a checkpoint."""
    PAUSE = "pause"
    """Hold the training thread until `resume`, `stop` or `abort`."""
    RESUME = "resume"
    """Let a paused run go on."""
    SET = "set"
    """Change optimizer hyperparameters or user tunables (``set lr=1e-4``);
    without arguments, report their values."""
    ROLLBACK = "rollback"
    """Load the run's N-th newest checkpoint (``rollback [N]``) into the live
    model and optimizer, and train on from there."""

    def __str__(self) -> str:
        return self.value

    def encode_line(self) -> bytes:
        """Returns the command as one line of the wire format."""
        return self.value.encode("ascii") + b"\n"


COMMAND_NAMES = tuple(command.value for command in Command)

#: What each command does, in one line: the help of the CLI, the panel's
#: tooltips and the REST API's ``GET commands`` (which the side panel shows).
COMMAND_HELP: dict[Command, str] = {
    Command.STOP: "write a checkpoint, then end fit gracefully",
    Command.SAVE: "write a checkpoint; training goes on",
    Command.ABORT: "end fit gracefully, without a checkpoint",
    Command.PAUSE: "hold the training thread (save, stop and abort still act)",
    Command.RESUME: "let a paused run go on",
    Command.SET: "set KEY=VALUE ...: change the learning rate (lr), other optimizer hyperparameters or "
    "exposed tunables at the next batch; alone: show them",
    Command.ROLLBACK: "rollback [N]: load the N-th newest checkpoint (default 1) into the live model and train on",
}

#: The optimizer hyperparameters `set` knows (where the optimizer has them).
#: Short names `set` accepts for them.
TUNABLE_ALIASES = {"lr": "learning_rate"}
#: The deepest `rollback N` accepted (a run keeps far fewer checkpoints).
MAX_ROLLBACK_DEPTH = 1000
_MAX_ASSIGNMENTS = 16
_TUNABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_NUMBER = re.compile(r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")
_DEPTH = re.compile(r"^[0-9]{1,4}$")

class UnknownCommandError(ValueError):
    """Raised for a word that is not one of `COMMAND_NAMES`."""



def parse_command(text: str | Command) -> Command:
    """Parses one command word.

    Surrounding whitespace is ignored and case does not matter.

    Args:
        text: The word, for example ``"stop"`` or ``" Save\\n"``.

    Returns:
        The matching `Command`.

    Raises:
        UnknownCommandError: If `text` is not a known command.
    """
    if isinstance(text, Command):
        return text
    if not isinstance(text, str):
        raise UnknownCommandError(
            f"Expected a command as text, got {type(text).__name__}: {shorten(repr(text))}."
        )
    word = text.strip().lower()
    try:
        return Command(word)
    except ValueError:
        raise UnknownCommandError(
            f"Unknown command {shorten(text.strip())!r}. "
            f"Expected one of: {', '.join(COMMAND_NAMES)}."
        ) from None


@dataclasses.dataclass(frozen=True)
class Request:
    """One command as sent: the command, its arguments, and an optional id.

    On the wire it is one line, ``WORD [ARGUMENT ...] [#ID]``: ``stop``,
    ``save #k3x9``. A sender that wants to know what became of its command
    gives it an id; the run acknowledges that id in its record (see
    `run.journal.Journal.acknowledge`).

    Attributes:
        command: The command.
        args: Its arguments: ``KEY=VALUE`` words for ``set`` (canonical:
            aliases resolved, values as Python writes the number), the depth
            for ``rollback``; none for the other commands.
        request_id: 1-32 letters, digits, ``_`` or ``-``; or None.
    """

    command: Command
    args: tuple[str, ...] = ()
    request_id: str | None = None

    def __str__(self) -> str:
        return " ".join([self.command.value, *self.args])

    def encode_line(self) -> bytes:
        """The request as one line of the wire format."""
        tail = f" #{self.request_id}" if self.request_id else ""
        return f"{self}{tail}\n".encode("utf-8")


#: What marks the id of a request whose sender waits for its acknowledgement
#: (``send --wait``): ``SENDER-w<hex>``. A run's record keeps every such id
#: it answered, and only the newest of the others (`run.journal`).
WAITED_ID_MARK = "-w"


def is_waited_id(request_id: str | None) -> bool:
    """True for the id of a request whose sender waits for its answer."""
    return request_id is not None and WAITED_ID_MARK in request_id


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


def parse_request(text: str | Command | Request) -> Request:
    """Parses one line of the wire format (without its newline).

    Args:
        text: For example ``"stop"``, ``"save #a1"``, or a `Command`.

    Returns:
        The `Request`.

    Raises:
        UnknownCommandError: If the line is not a valid request; the message
            says what was received and what is expected.
    """
    if isinstance(text, Request):
        return text
    if isinstance(text, Command):
        return Request(text)
    if not isinstance(text, str):
        parse_command(text)  # raises the error for a non-text command
    words = text.split()
    if not words:
        raise UnknownCommandError(f"Empty command. Expected one of: {', '.join(COMMAND_NAMES)}.")
    request_id = None
    if words[-1].startswith("#"):
        request_id = words.pop()[1:]
        if not _REQUEST_ID.match(request_id):
            raise UnknownCommandError(
                f"Invalid request id {shorten(request_id)!r}: expected 1-32 letters, digits, '_' or '-' after '#'."
            )
        if not words:
            raise UnknownCommandError(f"A request id without a command. Expected one of: {', '.join(COMMAND_NAMES)}.")
    command = parse_command(words[0])
    parse_args = _ARGUMENTS.get(command)
    if parse_args is not None:
        return Request(command, parse_args(words[1:]), request_id)
    if len(words) > 1:
        raise UnknownCommandError(
            f"'{command}' takes no arguments, got {shorten(' '.join(words[1:]))!r}."
        )
    return Request(command, (), request_id)


def validate_tunable_name(name: str) -> str:
    """Checks the name of a value `set` may change; returns it (aliases resolved).

    Raises:
        UnknownCommandError: If `name` is not 1-64 letters, digits or ``_``
            (not starting with a digit).
    """
    if not isinstance(name, str) or not _TUNABLE_NAME.match(name):
        raise UnknownCommandError(
            f"Invalid name {shorten(str(name))!r}: expected 1-64 letters, digits or '_', not starting with a digit."
        )
    return TUNABLE_ALIASES.get(name, name)


def _set_args(words: list[str]) -> tuple[str, ...]:
    """``KEY=VALUE`` words, checked and made canonical (``lr=1e-4`` -> ``learning_rate=0.0001``)."""
    if len(words) > _MAX_ASSIGNMENTS:
        raise UnknownCommandError(f"'set' takes at most {_MAX_ASSIGNMENTS} KEY=VALUE pairs, got {len(words)}.")
    canonical: dict[str, float] = {}
    for word in words:
        key, equals, text = word.partition("=")
        if not equals or not key:
            raise UnknownCommandError(f"'set' takes KEY=VALUE pairs (set lr=1e-4), got {shorten(word)!r}.")
        key = validate_tunable_name(key)
        if key in canonical:
            raise UnknownCommandError(f"'set' got {key!r} twice; give each name once.")
        canonical[key] = _finite_number(key, text)
    return tuple(f"{key}={value!r}" for key, value in canonical.items())


def _finite_number(key: str, text: str) -> float:
    value = float(text) if _NUMBER.match(text) else None
    if value is None or not math.isfinite(value):
        raise UnknownCommandError(f"'set {key}=' takes a finite number (like 0.001 or 1e-4), got {shorten(text)!r}.")
    return value


def _rollback_args(words: list[str]) -> tuple[str, ...]:
    if not words:
        return ()
    if len(words) > 1 or not _DEPTH.match(words[0]) or not 1 <= int(words[0]) <= MAX_ROLLBACK_DEPTH:
        raise UnknownCommandError(
            f"'rollback' takes one optional number N from 1 (the newest checkpoint) to {MAX_ROLLBACK_DEPTH}, "
            f"got {shorten(' '.join(words))!r}."
        )
    return (str(int(words[0])),)


_ARGUMENTS = {Command.SET: _set_args, Command.ROLLBACK: _rollback_args}


def assignments(request: Request) -> dict[str, float]:
    """The ``name -> value`` pairs of a parsed ``set`` request, in order."""
    pairs = (arg.partition("=") for arg in request.args)
    return {key: float(value) for key, _, value in pairs}


def rollback_depth(request: Request) -> int:
    """N of a parsed ``rollback [N]`` request: 1 is the newest checkpoint."""
    return int(request.args[0]) if request.args else 1


def shorten(text: str, limit: int = 40) -> str:
    """Outside text as quoted in messages: at most `limit` characters."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Lines on the wire ----------------------------------------------------------------------------------------

#: Longest line the decoder accepts. Longer lines are rejected whole.
MAX_LINE_BYTES = 256


@dataclasses.dataclass(frozen=True)
class Rejected:
    """A line read from a channel that is not a valid command.

    Attributes:
        text: A printable, shortened rendering of what was received.
        reason: Why it was rejected, in words meant for a person.
    """

    text: str
    reason: str



class LineDecoder:
    """Splits a byte stream into commands, whatever the writes look like.

    A line split across several writes is joined; several lines in one write
    are split. Blank lines are ignored. Everything else that is not a command
    (unknown words, invalid UTF-8, binary garbage, lines longer than
    `MAX_LINE_BYTES`) comes out as `Rejected`, and decoding goes on with the
    next line.
    """

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES):
        self._max_line_bytes = max_line_bytes
        self._pending = bytearray()
        self._earlier = 0  # bytes of the pending line that came in earlier feeds
        self._discarding = False
        self._discarded = 0

    def feed(self, data: bytes) -> list[Request | Rejected]:
        """Decodes a chunk of bytes.

        Args:
            data: Bytes as read from the channel, in any chunking.

        Returns:
            The commands and rejections of the lines completed by `data`, in
            order. An incomplete last line is kept for the next call.
        """
        results: list[Request | Rejected] = []
        self._earlier = len(self._pending)
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self._keep(data[start:])
                return results
            self._keep(data[start:end])
            results.extend(self._finish_line())
            self._earlier = 0
            start = end + 1

    def flush(self) -> list[Request | Rejected]:
        """Decodes what is left when the writer is gone, without a newline."""
        results = self._finish_line()
        self._earlier = 0
        return results

    def _keep(self, chunk: bytes) -> None:
        if self._discarding:
            self._discarded += len(chunk)
            return
        self._pending += chunk
        if len(self._pending) > self._max_line_bytes:
            self._discarding = True
            self._discarded = len(self._pending)
            self._pending.clear()

    def _finish_line(self) -> list[Request | Rejected]:
        if self._discarding:
            size, self._discarding, self._discarded = self._discarded, False, 0
            return [
                Rejected(
                    text=f"<{size} bytes>",
                    reason=(
                        f"Line of {size} bytes is too long "
                        f"(at most {self._max_line_bytes}); ignored."
                    ),
                )
            ]
        raw = bytes(self._pending)
        self._pending.clear()
        result = _decode_line(raw)
        if not isinstance(result, Rejected) or not 0 < self._earlier < len(raw):
            return [] if result is None else [result]
        # The line began in an earlier read and is not a command as a whole.
        # Writers send whole lines in one atomic write, so the likely story is
        # a writer that died mid-line followed by a healthy one: keep the
        # healthy command rather than losing it with the remnant.
        tail = _decode_line(raw[self._earlier :])
        if not isinstance(tail, Request):
            return [result]
        remnant = raw[: self._earlier].decode("utf-8", "backslashreplace")
        return [
            Rejected(
                text=_printable(remnant),
                reason="Incomplete line (its writer stopped mid-line); ignored.",
            ),
            tail,
        ]


def _printable(text: str) -> str:
    return shorten(text.strip().encode("unicode_escape").decode("ascii"))


def _decode_line(raw: bytes) -> Request | Rejected | None:
    """Decodes one line without its newline; None for a blank line."""
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Rejected(
            text=_printable(raw.decode("utf-8", "backslashreplace")),
            reason="Line is not valid UTF-8; ignored.",
        )
    try:
        return parse_request(text)
    except UnknownCommandError as error:
        return Rejected(text=_printable(text), reason=str(error))
