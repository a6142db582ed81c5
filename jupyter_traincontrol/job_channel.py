"""What `CommandActions` reads in a job: the commands every process agreed on.

`AgreedChannel` stands where a run's own channel (its FIFO) would: requests
that arrive locally (FIFO, Ctrl+C, SIGTERM) are proposed to the whole job
(`distributed.Job.propose`), and a request comes out only at the batch
boundary the job agreed on.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .commands import Request

if TYPE_CHECKING:
    from .distributed import Job

__all__ = ["AgreedChannel"]

_HOLD_POLL_SECONDS = 0.05


class AgreedChannel:
    """What `CommandActions` reads in a job: the requests every process
    agreed on, each once its step has come. Requests that arrive locally
    (FIFO, Ctrl+C) are proposed first. Cheap per batch: two checks."""

    def __init__(self, job: Job, local, progress):
        self.job = job
        self.local = local
        self.progress = progress
        self._holding = False

    @property
    def kind(self) -> str:
        return self.local.kind

    @property
    def address(self) -> str:
        return self.local.address

    @property
    def pending(self) -> bool:
        if self.local.pending:
            self._propose_local()
        return self.job.due(self.progress.boundary)

    def _propose_local(self) -> None:
        # Held, every process waits at this very boundary: apply it here.
        step = self.progress.boundary + (0 if self._holding else 1)
        while (request := self.local.pop()) is not None:
            self.job.propose(request, step)

    def pop(self) -> Request | None:
        return self.job.pop_due(self.progress.boundary)

    def get(self, timeout: float | None) -> Request | None:
        """While paused: proposes what arrives, returns what is due."""
        self._holding = True
        try:
            deadline = time.monotonic() + (timeout or 0)
            while True:
                if self.local.pending:
                    self._propose_local()
                request = self.pop()
                if request is not None or self.job.lost or time.monotonic() >= deadline:
                    return request
                time.sleep(_HOLD_POLL_SECONDS)
        finally:
            self._holding = False
