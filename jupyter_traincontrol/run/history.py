"""What a run's charts are drawn from: the loss of every batch, and each epoch's logs.

`RunHistory` lasts the whole run (a notebook cell may call `fit` several
times): the driver adds each batch's loss (`add_loss`, O(1), on the
training thread) and each epoch's final logs (`record_epoch`); the run's
record carries both (``loss_curve``, ``history``). The charts draw from
bounded series only (`chart_series`): the per-epoch losses are kept in
`LossCurve`s too, so a chart of 100,000 epochs has as many points as one
of 300.
"""

from __future__ import annotations

from typing import Any

from ..protocol.values import finite_metrics
from .loss_curve import LossCurve

__all__ = ["RunHistory", "HISTORY_KEPT", "EPOCH_LINES"]

#: Epochs the record keeps (the newest).
HISTORY_KEPT = 200
#: Epochs whose ends a chart marks (the newest).
EPOCH_LINES = 50


class RunHistory:
    """The loss per batch (bounded, `LossCurve`) and the logs of each epoch."""

    def __init__(self):
        self.loss_curve = LossCurve()
        self.val_by_batch = LossCurve()  # val_loss at the batch that ended its epoch
        self.epoch_loss = LossCurve()  # loss and val_loss at their epoch (for runs without batches)
        self.val_by_epoch = LossCurve()
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
        loss, val_loss = entry.get("loss"), entry.get("val_loss")
        if loss is not None:
            self.epoch_loss.add(loss, at=epoch + 1)
        if val_loss is not None:
            self.val_by_epoch.add(val_loss, at=epoch + 1)
            if "batch" in entry:
                self.val_by_batch.add(val_loss, at=entry["batch"])
        self.version += 1

    def chart_series(self) -> dict[str, Any]:
        """What the loss chart draws (`notebook.chart_svg.loss_chart_svg`'s
        arguments), each series bounded whatever the run's length: the loss
        per batch (or per epoch, for a run without batches), the validation
        loss, and the newest epochs (whose ends it marks)."""
        points = self.loss_curve.points()
        if points:
            return {"history": self.epochs[-EPOCH_LINES:], "loss_curve": points, "val_loss": self.val_by_batch.points()}
        return {"history": self.epochs[-EPOCH_LINES:], "loss_curve": None, "epoch_loss": self.epoch_loss.points(),
                "val_loss": self.val_by_epoch.points()}

    def as_record(self) -> dict[str, Any]:
        """The history's fields of the run's record (NaN as null)."""
        return {
            "history": [finite_metrics(entry) for entry in self.epochs[-HISTORY_KEPT:]],
            "loss_curve": self.loss_curve.points(),
        }
