"""Holds a checkpoint folder until killed (or stdin closes).

Usage: python hold_folder.py FOLDER RUN_NAME

Prints ``READY PID`` once the folder is held.
"""

from __future__ import annotations

import os
import sys

from jupyter_traincontrol.checkpoint import CheckpointStore

assert "tensorflow" not in sys.modules and "keras" not in sys.modules

if __name__ == "__main__":
    folder, run = sys.argv[1], sys.argv[2]
    store = CheckpointStore(folder, run=run).acquire()
    print("READY", os.getpid(), flush=True)
    sys.stdin.read()
    store.release()
