"""Whether a process still lives, from its pid alone (no lock, no handle)."""

from __future__ import annotations

import os

__all__ = ["pid_gone"]


def pid_gone(pid: int) -> bool:
    """True if no process has `pid`, or only a zombie does (killed, and not
    reaped yet: it still answers ``kill(pid, 0)``). A process of another
    user counts as alive."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: no pid is that large
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False
