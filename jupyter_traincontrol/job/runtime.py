"""Finding the job this process is part of: JAX's distributed runtime, when it has several processes."""

from __future__ import annotations

import sys

from .job import Job

__all__ = ["current_job"]


def current_job(**options) -> "Job | None":
    """The job of this process, or None when it is not one of several.

    Only looks (never imports JAX): a job exists once
    ``jax.distributed.initialize`` ran with more than one process.

    Args:
        **options: `Job`'s keyword arguments (``lost_after=5``, ...).
    """
    if "jax" not in sys.modules:
        return None
    try:
        from jax._src import distributed
    except ImportError:
        return None
    state = distributed.global_state
    if state.client is None or (state.num_processes or 1) <= 1:
        return None
    options.setdefault("preemption_service", state.preemption_sync_manager is not None)
    return Job(state.client, state.process_id, state.num_processes, **options)
