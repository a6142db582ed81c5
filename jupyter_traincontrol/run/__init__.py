"""A run without Keras: identity, state, journal, history, progress, record.

- `lifecycle`: `RunLifecycle`, which opens and closes a run, moves its
  state along the transition table and holds its parts.
- `journal`: events, acknowledgements of requests, steered changes; `say`, the one line a run prints for its user.
- `history`: the loss per batch and each epoch's logs (`loss_curve`).
- `progress`: `RunProgress`, what the driver of the training reports.
- `record`: the run's record, built from the parts.
- `publisher`: writing the record, and the run's ticks.
- `run_thread`: `RunThread`, the run's one thread: reads its channel, ticks its publisher.
- `scope`: `RunScope`, a run that spans several trainings (fits, loops), and
  which scope a thread's trainings drive (`current_scope`, `scoped`).
"""

from .journal import Journal, RunEvent
from .lifecycle import RunLifecycle
from .progress import ProgressSource, RunProgress
from .scope import RunScope, current_scope, scoped

__all__ = ["Journal", "ProgressSource", "RunEvent", "RunLifecycle", "RunProgress", "RunScope", "current_scope",
           "scoped"]
