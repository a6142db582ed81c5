"""Route what a training thread prints to its run, not to whatever cell is current.

In ipykernel 7 a background thread's ``print`` lands in the most recent
request the kernel handled: a later cell, even a completion request. While
runs are active, `ThreadRoutedStream` stands in for ``sys.stdout`` and
``sys.stderr``: text written by a registered thread goes to that thread's
sink (the run's panel); everything else passes through unchanged.

`route_thread_output` installs the streams on first use and restores the
originals when the last routed thread is done, so the swap always comes in
pairs. `OutputBuffer` keeps the last lines a run's thread printed, for its panel.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
from typing import Callable, Iterator

__all__ = ["ThreadRoutedStream", "route_thread_output", "OutputBuffer"]

Sink = Callable[[str, str], None]  # (stream name, text)

_lock = threading.Lock()
_sinks: dict[int, Sink] = {}
_installed: dict[str, "ThreadRoutedStream"] = {}


class ThreadRoutedStream:
    """A text stream that sends registered threads' writes to their sinks.

    Args:
        name: ``"stdout"`` or ``"stderr"``.
        original: The stream it stands in for; everything else goes there.
    """

    def __init__(self, name: str, original):
        self.name = name
        self.original = original

    def write(self, text: str) -> int:
        sink = _sinks.get(threading.get_ident())
        if sink is None:
            return self.original.write(text)
        sink(self.name, text)
        return len(text)

    def flush(self) -> None:
        if threading.get_ident() not in _sinks:
            self.original.flush()

    def __getattr__(self, attribute):
        return getattr(self.original, attribute)


def _install_locked() -> None:
    for name in ("stdout", "stderr"):
        current = getattr(sys, name)
        if not isinstance(current, ThreadRoutedStream):
            routed = ThreadRoutedStream(name, current)
            setattr(sys, name, routed)
            _installed[name] = routed


def _uninstall_locked() -> None:
    for name, routed in list(_installed.items()):
        if getattr(sys, name) is routed:
            setattr(sys, name, routed.original)
        # If someone wrapped our stream since, leave theirs in place; our
        # stream passes everything through once no thread is registered.
        del _installed[name]


@contextlib.contextmanager
def route_thread_output(sink: Sink) -> Iterator[None]:
    """Sends what the calling thread prints to `sink` while the block runs.

    Args:
        sink: Called as ``sink(stream_name, text)``; must not raise.
    """
    ident = threading.get_ident()
    with _lock:
        if not _sinks:
            _install_locked()
        _sinks[ident] = sink
    try:
        yield
    finally:
        with _lock:
            _sinks.pop(ident, None)
            if not _sinks:
                _uninstall_locked()


class OutputBuffer:
    """The last lines a run's thread printed, as a terminal would show them.

    A carriage return rewinds the current line (progress bars), so only its
    final state is kept.

    Args:
        max_lines: Lines kept.
    """

    def __init__(self, max_lines: int = 200):
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._current = ""
        self._lock = threading.Lock()
        self.version = 0

    def write(self, stream: str, text: str) -> None:
        """Adds text (from any thread)."""
        with self._lock:
            parts = text.split("\n")
            for index, part in enumerate(parts):
                if "\r" in part:
                    self._current = part.rsplit("\r", 1)[1]
                else:
                    self._current += part
                if index < len(parts) - 1:
                    self._lines.append(self._current)
                    self._current = ""
            self.version += 1

    def text(self) -> str:
        """The kept lines, joined."""
        with self._lock:
            lines = list(self._lines) + ([self._current] if self._current else [])
        return "\n".join(lines)
