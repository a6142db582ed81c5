"""What a run's charts are drawn from: the loss of every batch, and each epoch's logs.

`RunHistory` lasts the whole run (a notebook cell may call `fit` several
times): the driver adds each batch's loss (`add_loss`, O(1), on the
training thread) and each epoch's final logs (`record_epoch`); the run's
record carries both (``loss_curve``, ``history``).
"""

from __future__ import annotations

from typing import Any

from ..protocol.values import finite_metrics
from .loss_curve import LossCurve

__all__ = ["RunHistory", "HISTORY_KEPT"]

#: Epochs the record keeps (the newest).
HISTORY_KEPT = 200


class RunHistory:
    """The loss per batch (bounded, `LossCurve`) and the logs of each epoch."""

    def __init__(self):
        self.loss_curve = LossCurve()
        self.epochs: list[dict[str, Any]] = []
        self.version = 0

    def add_loss(self, loss) -> None:
        """The loss of the next batch (None or NaN make a gap)."""
        self.loss_curve.add(loss)

    def record_epoch(self, epoch: int, logs: dict[str, Any] | None) -> None:
        """Keeps the final logs of `epoch` (zero-based), with the batch index
        of its end, counted across epochs."""
        entry: dict[str, Any] = {"epoch": epoch + 1}
        if self.loss_curve.batches:
            entry["batch"] = self.loss_curve.batches
        for key, value in (logs or {}).items():
            try:
                entry[key] = float(value)
            except (TypeError, ValueError):
                continue
        self.epochs.append(entry)
        self.version += 1

    def as_record(self) -> dict[str, Any]:
        """The history's fields of the run's record (NaN as null)."""
        return {
            "history": [finite_metrics(entry) for entry in self.epochs[-HISTORY_KEPT:]],
            "loss_curve": self.loss_curve.points(),
        }
