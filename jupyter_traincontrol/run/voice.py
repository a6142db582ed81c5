"""What a run says to its user: one line, ``[traincontrol] ...``, unless its driver is quiet."""

from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["say"]


def say(message: str, *, verbose: bool, stream: TextIO | None = None) -> None:
    """Prints ``[traincontrol] MESSAGE`` to `stream` (stdout by default), flushed.

    Args:
        message: The line, without the prefix.
        verbose: The driver's ``verbose`` setting: False prints nothing.
        stream: Where to print; stdout (as it is at the call) by default.
    """
    if verbose:
        stream = stream or sys.stdout
        stream.write(f"[traincontrol] {message}\n")  # one write: processes sharing a pipe do not cut it
        stream.flush()
