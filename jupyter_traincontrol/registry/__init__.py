"""Where runs are listed: one private folder per run under the Jupyter runtime dir.

- `paths`: the registry's folder, run names, the record's file.
- `liveness`: a run is alive while its process holds its lock; sweeping the dead.
- `folder`: `RunFolder`, a run's claimed folder, its record writes and release.
- `tombstones`: the history: the last record of each ended run whose folder went.
- `listing`: `list_runs`, `find_run`, `unique_name`.
"""

from .folder import RunFolder, release_all
from .listing import find_run, list_runs, unique_name
from .liveness import LOCK_NAME, folder_is_live, sweep_dead_runs
from .paths import RECORD_NAME, NameTakenError, RunNotFoundError, registry_root, validate_name
from .tombstones import ended_runs, read_tombstone

__all__ = ["LOCK_NAME", "NameTakenError", "RECORD_NAME", "RunFolder", "RunNotFoundError", "ended_runs", "find_run",
           "folder_is_live", "list_runs", "read_tombstone", "registry_root", "release_all", "sweep_dead_runs",
           "unique_name", "validate_name"]
