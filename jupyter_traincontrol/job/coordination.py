"""A job's key-value store: the keys of one `fit`, and waits that a lost process ends.

The processes of a job meet in a key-value store: the JAX coordination
service's (``key_value_set``, ``blocking_key_value_get``,
``key_value_increment``, ``key_value_try_get``, and ``key_value_dir_get``
where it lists a folder), or a torch process group's, through
`torch_store.TorchStoreClient`.
`Coordination` keeps the keys of one `fit` under one prefix, and
`wait_for` waits in slices, so a peer found lost (`lost`) ends every wait
at once. The other parts of the job (agreement, liveness, checkpoints,
receipts) work through it; it knows none of them. Any client with those
methods will do (the tests use a dict-backed one).
"""

from __future__ import annotations

import time
from typing import Any, Callable

__all__ = ["Coordination", "JobLostError", "timed_out", "first_line", "KEY_ROOT"]

KEY_ROOT = "traincontrol"


class JobLostError(RuntimeError):
    """A process of the job was lost while this one waited for it."""


def timed_out(error: BaseException) -> bool:
    """True if `error` is the key-value store's "not set in time"."""
    text = str(error)
    return "DEADLINE_EXCEEDED" in text or "imed out" in text


def first_line(error: BaseException) -> str:
    """The first line of an error's message (the store's are long)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class Coordination:
    """The key-value store of a job, under the keys of one `fit`.

    Args:
        client: The coordination service's client.
        slice_seconds: How long one blocking read waits at most (a lost
            peer ends a longer wait within this time).

    Attributes:
        lost: Why a peer counts as lost (set by the job's liveness), or None.
    """

    def __init__(self, client, slice_seconds: float = 1.0):
        self.client = client
        self.slice_seconds = slice_seconds
        self.prefix: str | None = None
        self.lost: str | None = None
        #: True if the client reads a folder's keys in one call (``key_value_dir_get``).
        self.lists_folders = callable(getattr(client, "key_value_dir_get", None))

    def begin(self, prefix: str) -> None:
        """Keys from now on live under `prefix` (one `fit`); nothing is lost."""
        self.prefix = prefix
        self.lost = None

    def key(self, *parts: Any) -> str:
        """The key of `parts` under this fit's prefix."""
        return "/".join([self.prefix, *map(str, parts)])

    def get(self, key: str, timeout: float) -> str:
        """The value of `key`, waiting up to `timeout` seconds (raises on timeout)."""
        return self.client.blocking_key_value_get(key, int(timeout * 1000))

    def try_get(self, key: str) -> str | None:
        """The value of `key` now, or None if it is not set."""
        try:
            return self.client.key_value_try_get(key)
        except Exception:  # NOT_FOUND
            return None

    def set(self, key: str, value: str, overwrite: bool = False) -> None:
        """Sets `key` (once, unless `overwrite`)."""
        if overwrite:
            self.client.key_value_set(key, value, allow_overwrite=True)
        else:
            self.client.key_value_set(key, value)

    def increment(self, key: str, by: int = 1) -> int:
        """Adds `by` to the counter `key`; returns its new value."""
        return self.client.key_value_increment(key, by)

    def entries(self, key: str) -> list[tuple[str, str]]:
        """Every ``(key, value)`` under the folder `key` (ending in ``/``)."""
        return self.client.key_value_dir_get(key)

    def wait_for(self, key: str, timeout: float, what: str, give_up: Callable[[], bool] | None = None) -> str | None:
        """The value of `key` once set, waiting up to `timeout` seconds, in
        slices: a lost process ends the wait at once.

        Args:
            key: The key.
            timeout: Seconds to wait at most.
            what: What is awaited, for messages.
            give_up: Asked before each slice: True ends the wait (None returned).

        Raises:
            JobLostError: A process was lost meanwhile.
            TimeoutError: `key` was not set in time.
        """
        deadline = time.monotonic() + timeout
        while True:
            if self.lost:
                raise JobLostError(f"Gave up waiting for {what}: {self.lost}")
            if give_up is not None and give_up():
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"Waited {timeout:g} s for {what}.")
            try:
                return self.get(key, min(left, self.slice_seconds))
            except Exception as error:
                if not timed_out(error):
                    raise
