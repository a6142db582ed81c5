"""The notebook panel's loss chart: bounded whatever the run's length."""

from __future__ import annotations

import re

from jupyter_traincontrol.notebook.chart_svg import loss_chart_svg
from jupyter_traincontrol.run.history import RunHistory
from jupyter_traincontrol.run.loss_curve import MAX_POINTS


def _points(svg: str) -> list[int]:
    """How many points each polyline of `svg` has."""
    return [len(coords.split()) for coords in re.findall(r'<polyline points="([^"]*)"', svg)]


def _long_run(epochs: int, batches_per_epoch: int = 2) -> RunHistory:
    history = RunHistory()
    for epoch in range(epochs):
        for _ in range(batches_per_epoch):
            history.add_loss(1.0 / (epoch + 1))
        history.record_epoch(epoch, {"loss": 1.0 / (epoch + 1), "val_loss": 1.2 / (epoch + 1)})
    return history


def test_the_chart_of_100000_epochs_is_as_small_as_one_of_300():
    short, long = _long_run(300), _long_run(100_000)
    small, large = loss_chart_svg(**short.chart_series()), loss_chart_svg(**long.chart_series())
    assert len(large) < 1.2 * len(small) < 20_000, (len(small), len(large))  # was 1.16 MB at 100,000 epochs
    raw, smoothed, val = _points(large)
    assert raw == smoothed <= MAX_POINTS and MAX_POINTS // 2 <= val <= MAX_POINTS
    assert f">{100_000 * 2}</text>" in large  # the x axis still spans the whole run


def test_a_long_history_handed_whole_is_drawn_bounded_too():
    long = _long_run(20_000, batches_per_epoch=0)  # a run without batches: per-epoch losses
    svg = loss_chart_svg(long.epochs)
    assert all(count <= MAX_POINTS for count in _points(svg)) and len(svg) < 30_000
    raw, smoothed, val = _points(loss_chart_svg(**long.chart_series()))
    assert raw == smoothed == val and MAX_POINTS // 2 <= val <= MAX_POINTS
