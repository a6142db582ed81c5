"""Where runs are listed, and what a run's name may be.

::

    $(jupyter --runtime-dir)/traincontrol/         0700
        run-1/                                     0700
            lock        held (flock) by the run's process for its lifetime
            run.json    the run's record (written atomically)
            control     its FIFO (while the run listens)
        .ended/run-0.1f0c....json                  the history: last records of ended runs
        .locks/                                    one lock file per live process

Any process of the same user reads the records: the CLI, the Jupyter server,
other kernels. This package knows nothing of Keras or IPython, so the CLI
and the server import it in milliseconds.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..protocol.record import MAX_RECORD_BYTES

__all__ = ["RECORD_NAME", "NameTakenError", "RunNotFoundError", "registry_root", "validate_name", "read_record_text",
           "NAME_PATTERN", "CLAIM_PREFIX", "TOMBSTONES_FOLDER"]

#: A run's record, in its folder.
RECORD_NAME = "run.json"
#: Where the last records of ended runs are kept a while.
TOMBSTONES_FOLDER = ".ended"
#: Staging folders of claims in progress.
CLAIM_PREFIX = ".claim-"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class NameTakenError(ValueError):
    """Another live run already has this name."""


class RunNotFoundError(LookupError):
    """No listed run has this name."""


def registry_root() -> Path:
    """Returns the folder that lists runs (honours ``JUPYTER_RUNTIME_DIR``)."""
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / "traincontrol"


def validate_name(name: str) -> str:
    """Checks a run name: 1-64 letters, digits, ``.``, ``_`` or ``-``.

    Returns:
        `name`.

    Raises:
        ValueError: If `name` could not safely be a folder name.
    """
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ValueError(
            f"Invalid run name {name!r}. Expected 1-64 characters: letters, digits, "
            "'.', '_' or '-', starting with a letter or digit."
        )
    return name



def read_record_text(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_RECORD_BYTES + 1)
    return data.decode("utf-8", "replace")

