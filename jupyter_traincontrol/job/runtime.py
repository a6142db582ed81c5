"""Finding the job this process is part of: JAX's distributed runtime, or a torch process group, when it has several processes."""

from __future__ import annotations

import sys

from .job import Job
from .torch_store import TorchStoreClient, default_store, torch_job_size

__all__ = ["current_job", "current_jax_job", "current_torch_job"]


def current_job(**options) -> "Job | None":
    """The job of this process (JAX's, else torch's), or None when it is not one of several.

    Args:
        **options: `Job`'s keyword arguments (``lost_after=5``, ...).
    """
    return current_jax_job(**options) or current_torch_job(**options)


def current_jax_job(**options) -> "Job | None":
    """The JAX job of this process, or None.

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


def current_torch_job(**options) -> "Job | None":
    """The torch job of this process (a default process group of more than
    one rank, as ``torchrun``, ``srun`` or ``init_process_group`` made it),
    or None. Only looks: never imports torch.

    Args:
        **options: `Job`'s keyword arguments (``lost_after=5``, ...).
    """
    size = torch_job_size()
    if size is None:
        return None
    rank, world_size = size
    options.setdefault("unit", "rank")
    return Job(TorchStoreClient(default_store()), rank, world_size, **options)
