"""A `torch.distributed` job's key-value store, as the job layer reads one.

The processes (ranks) of a ``torchrun`` or ``srun`` job share the store
their default process group was made with (a ``TCPStore`` that ``torchrun``
hosts, or the one given to ``init_process_group``). `TorchStoreClient`
gives it the five methods the job layer's `coordination.Coordination`
uses, the way JAX's coordination client has them. A blocking read polls
``check`` (a store's own ``wait`` logs a warning at every timeout, and the
watcher's reads time out ten times a second); a read that is not set in
time raises `TimeoutError` saying "timed out".

`default_store` finds the default group's store: torch has no public call
for it, so it reads ``torch.distributed.distributed_c10d._get_default_store``
(checked with torch 2.13, the version the tests run; the tests fail
loudly where it moves).
"""

from __future__ import annotations

import sys
import time

__all__ = ["TorchStoreClient", "default_store", "torch_job_size"]

#: How often a blocking read asks the store whether its key is set.
POLL_SECONDS = 0.005


class TorchStoreClient:
    """A `torch.distributed.Store` with the key-value methods of JAX's client.

    Args:
        store: The store (``TCPStore``, ``FileStore``, a ``PrefixStore`` of one).
        poll_seconds: How often a blocking read asks whether its key is set.
    """

    def __init__(self, store, poll_seconds: float = POLL_SECONDS):
        self.store = store
        self.poll_seconds = poll_seconds

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None:
        """Sets `key` (a torch store always overwrites; the job sets each key once unless it says so)."""
        self.store.set(key, value)

    def key_value_try_get(self, key: str) -> str:
        """The value of `key` now.

        Raises:
            KeyError: `key` is not set.
        """
        if not self.store.check([key]):
            raise KeyError(f"{key!r} is not set (NOT_FOUND)")
        return _text(self.store.get(key))

    def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str:
        """The value of `key` once set, waiting up to `timeout_in_ms`.

        Raises:
            TimeoutError: It was not set in time.
        """
        deadline = time.monotonic() + timeout_in_ms / 1000
        while not self.store.check([key]):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{key!r} was not set: timed out after {timeout_in_ms} ms")
            time.sleep(min(self.poll_seconds, left))
        return _text(self.store.get(key))

    def key_value_increment(self, key: str, increment: int) -> int:
        """Adds `increment` to the counter `key`; returns its new value."""
        return int(self.store.add(key, increment))


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


def torch_job_size() -> tuple[int, int] | None:
    """``(rank, world size)`` of this process's default process group when
    it has more than one process; None otherwise (or without torch loaded:
    this never imports torch)."""
    if "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    size = dist.get_world_size()
    return (dist.get_rank(), size) if size > 1 else None


def default_store():
    """The store of the default process group (see the module's note)."""
    from torch.distributed import distributed_c10d

    finder = getattr(distributed_c10d, "_get_default_store", None)
    if finder is None:
        import torch

        raise RuntimeError(
            f"torch {torch.__version__} has no distributed_c10d._get_default_store: jupyter-traincontrol cannot "
            "reach the process group's store (checked with torch 2.13). Pass TrainLoop(job=False) to run each rank alone."
        )
    return finder()
