"""The command vocabulary: what may be said to a training run.

Commands travel as text lines, UTF-8, one command a line, so that
``echo stop > FIFO`` works from any shell. This module is pure: it parses
and validates, and does no I/O.

Example:

>>> decoder = LineDecoder()
>>> decoder.feed(b"sto")
[]
>>> decoder.feed(b"p\\nbogus\\n")
[<Command.STOP: 'stop'>, Rejected(text='bogus', reason="Unknown command 'bogus'. Expected one of: stop, save, abort, pause, resume.")]
"""

from __future__ import annotations

import dataclasses
import enum

__all__ = [
    "Command",
    "COMMAND_NAMES",
    "UnknownCommandError",
    "Rejected",
    "LineDecoder",
    "parse_command",
    "MAX_LINE_BYTES",
]

#: Longest line the decoder accepts. Longer lines are rejected whole.
MAX_LINE_BYTES = 256


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

    def __str__(self) -> str:
        return self.value

    def encode_line(self) -> bytes:
        """Returns the command as one line of the wire format."""
        return self.value.encode("ascii") + b"\n"


COMMAND_NAMES = tuple(command.value for command in Command)


class UnknownCommandError(ValueError):
    """Raised for a word that is not one of `COMMAND_NAMES`."""


@dataclasses.dataclass(frozen=True)
class Rejected:
    """A line read from a channel that is not a valid command.

    Attributes:
        text: A printable, shortened rendering of what was received.
        reason: Why it was rejected, in words meant for a person.
    """

    text: str
    reason: str


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
            f"Expected a command as text, got {type(text).__name__}: {text!r}."
        )
    word = text.strip().lower()
    try:
        return Command(word)
    except ValueError:
        raise UnknownCommandError(
            f"Unknown command {_shorten(text.strip())!r}. "
            f"Expected one of: {', '.join(COMMAND_NAMES)}."
        ) from None


def _shorten(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


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

    def feed(self, data: bytes) -> list[Command | Rejected]:
        """Decodes a chunk of bytes.

        Args:
            data: Bytes as read from the channel, in any chunking.

        Returns:
            The commands and rejections of the lines completed by `data`, in
            order. An incomplete last line is kept for the next call.
        """
        results: list[Command | Rejected] = []
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

    def flush(self) -> list[Command | Rejected]:
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

    def _finish_line(self) -> list[Command | Rejected]:
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
        if not isinstance(tail, Command):
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
    return _shorten(text.strip().encode("unicode_escape").decode("ascii"))


def _decode_line(raw: bytes) -> Command | Rejected | None:
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
        return parse_command(text)
    except UnknownCommandError as error:
        return Rejected(text=_printable(text), reason=str(error))
