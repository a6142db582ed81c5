"""Is a process still alive? (The same process, not a reused pid.)"""

from __future__ import annotations

import os

__all__ = ["process_alive", "process_start_ticks"]


def process_start_ticks(pid: int) -> int | None:
    """Returns when `pid` started, in clock ticks since boot (Linux), or None.

    Together with the pid this names one process for good, even after the
    pid is reused.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat_line = handle.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after it.
    fields = stat_line[stat_line.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_alive(pid: int, start_ticks: int | None = None) -> bool:
    """Tells whether process `pid` lives (and, if given, started at `start_ticks`)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, but someone else's
    except OSError:
        return False
    if start_ticks is not None:
        now = process_start_ticks(pid)
        if now is not None and now != start_ticks:
            return False
    return True
