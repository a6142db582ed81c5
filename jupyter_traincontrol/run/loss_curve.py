"""The per-batch loss of a run, kept in a bounded number of points.

`LossCurve` is fed on every batch end (and, per epoch, with the
validation loss, at the batch that ended the epoch) by the training thread, so `add` is
O(1) and allocation-free in the common case: it sums into the current
bucket, and once the curve holds `max_points` points it halves them (each
pair becomes its mean) and doubles the bucket width. A run of any length is
thus drawn from at most `max_points` points, each the mean loss of an equal
run of batches. A NaN or infinite loss makes its point None (a gap).

`smooth` is the exponential moving average TensorBoard draws (debiased, so
the first points are not pulled towards zero), and `use_log_scale` is the
one scale policy of both charts (the notebook panel's and the side panel's).
Pure: no I/O, no Keras, no widgets.

Example:

>>> curve = LossCurve(max_points=4)
>>> for loss in [4.0, 3.0, 2.0, 1.5, 1.0, 0.9]:
...     curve.add(loss)
>>> curve.points()
[[2, 3.5], [4, 1.75], [6, 0.95]]
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

__all__ = ["LossCurve", "smooth", "use_log_scale", "MAX_POINTS", "SMOOTHING", "LOG_SPAN"]

#: Points kept per curve.
MAX_POINTS = 300
#: TensorBoard's default smoothing weight.
SMOOTHING = 0.6
#: A log scale is used only when the values span more than this factor.
LOG_SPAN = 10.0


class LossCurve:
    """Loss per batch, counted across epochs, in at most `max_points` points.

    Args:
        max_points: Points kept (an even number, at least 2). Defaults to 300.
    """

    def __init__(self, max_points: int = MAX_POINTS):
        if not isinstance(max_points, int) or max_points < 2 or max_points % 2:
            raise ValueError(f"max_points must be an even whole number of at least 2, got {max_points!r}.")
        self.max_points = max_points
        self.batches = 0  # batches seen, across epochs
        self._width = 1  # batches per point
        self._points: list[list] = []  # [last batch index of the bucket, mean loss or None]
        self._sum = 0.0
        self._count = 0
        self._bad = False
        self._at = 0  # the x of the last value added

    def add(self, loss, at: int | None = None) -> None:
        """Adds the loss of the next batch (anything `float` takes; None, a
        NaN or an infinity make a gap).

        Args:
            loss: The value.
            at: Its x (an epoch's last batch, an epoch number); a point's x
                is that of the last value in it. Defaults to the count of
                values added (the batch index).
        """
        self.batches += 1
        self._at = self.batches if at is None else at
        try:
            value = float(loss)
        except (TypeError, ValueError):
            value = math.nan
        if value - value == 0.0:  # finite (NaN and inf give NaN)
            self._sum += value
        else:
            self._bad = True
        self._count += 1
        if self._count == self._width:
            self._close_bucket()

    def _close_bucket(self) -> None:
        self._points.append([self._at, None if self._bad else self._sum / self._count])
        self._sum, self._count, self._bad = 0.0, 0, False
        if len(self._points) >= self.max_points:
            # Full: each pair of points becomes one. A new list, swapped in
            # whole, so a reader on another thread sees the old or the new.
            points = self._points
            self._points = [[b[0], _mean2(a[1], b[1])] for a, b in zip(points[0::2], points[1::2])]
            self._width *= 2

    def points(self) -> list[list]:
        """``[[batch_index, loss], ...]``, oldest first; the batch index is
        the last batch of the point's bucket (1-based, across epochs). The
        bucket in progress is included."""
        points = [list(point) for point in self._points]
        count = self._count
        if count:
            points.append([self._at, None if self._bad else self._sum / count])
        return points


def _mean2(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else (a + b) / 2


def smooth(values: Sequence[float | None], weight: float = SMOOTHING) -> list[float | None]:
    """The debiased exponential moving average of `values`, as TensorBoard
    draws it; None values stay None and do not move the average.

    Args:
        values: The series, oldest first.
        weight: 0 draws the raw values; closer to 1 smooths more. Defaults to 0.6.
    """
    out: list[float | None] = []
    last, steps = 0.0, 0
    for value in values:
        if value is None or not math.isfinite(value):
            out.append(None)
            continue
        last = last * weight + (1 - weight) * value
        steps += 1
        out.append(last / (1 - weight**steps) if weight < 1 else value)
    return out


def use_log_scale(values: Iterable[float | None]) -> bool:
    """True when all values are > 0 and the largest is more than `LOG_SPAN`
    times the smallest: then a log scale shows the fall."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return bool(finite) and min(finite) > 0 and max(finite) / min(finite) > LOG_SPAN
