"""Line framing: a byte stream into requests, whatever the writes look like.

Commands travel as text lines, UTF-8, one command a line, so that
``echo stop > FIFO`` works from any shell. `LineDecoder` joins a line split
across several reads, splits several lines of one read, and turns anything
that is not a command (unknown words, invalid UTF-8, binary garbage,
overlong lines) into a `Rejected` without losing the next line. Pure.

Example:

>>> decoder = LineDecoder()
>>> decoder.feed(b"sto")
[]
>>> decoder.feed(b"p\\nbogus\\n")
[Request(command=<Command.STOP: 'stop'>, args=(), request_id=None), Rejected(text='bogus', reason="Unknown command 'bogus'. Expected one of: stop, save, abort, pause, resume, set, rollback.")]
"""

from __future__ import annotations

import dataclasses

from .commands import Request, UnknownCommandError, parse_request, shorten

__all__ = ["LineDecoder", "Rejected", "MAX_LINE_BYTES"]

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
