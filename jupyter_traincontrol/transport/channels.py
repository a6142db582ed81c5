"""Opening a run's channel: a FIFO where the platform has them, else a spool folder.

`CHANNEL_KINDS` names the channel each kind has in a run folder, so a
sender finds it from a record (`control.client`).
"""

from __future__ import annotations

import os
from pathlib import Path

from .fifo import FIFO_NAME, FifoChannel
from .receiver import CommandChannel
from .spool import INBOX_NAME, SpoolChannel

__all__ = ["open_channel", "CHANNEL_KINDS"]

_CLASSES = {"fifo": FifoChannel, "spool": SpoolChannel}
#: The kinds of channel, and the name each has in a run folder.
CHANNEL_KINDS = {"fifo": FIFO_NAME, "spool": INBOX_NAME}


def open_channel(folder: Path, kind: str | None = None, **kwargs) -> CommandChannel:
    """Creates the channel of a run; what senders write waits in it until
    a thread reads it (`CommandChannel.read`: the run's thread).

    Args:
        folder: The run's private folder.
        kind: ``"fifo"`` or ``"spool"``. Defaults to ``"fifo"`` where
            `os.mkfifo` exists, else ``"spool"``.
        **kwargs: Passed to the channel class.

    Returns:
        The channel.
    """
    kind = kind or ("fifo" if hasattr(os, "mkfifo") else "spool")
    if kind not in _CLASSES:
        raise ValueError(f"Unknown channel kind {kind!r}. Expected one of: fifo, spool.")
    return _CLASSES[kind](folder, **kwargs)
