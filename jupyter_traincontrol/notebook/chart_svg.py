"""The loss chart of the notebook panel: an inline SVG, no plotting library.

Pure: it draws from the run's history (each epoch's logs) and its loss
curve (the loss per batch, in at most a few hundred points); the scale and
smoothing policies are the side panel's too (`run.loss_curve`). Every
series is drawn from at most `MAX_POINTS` points (longer ones are averaged
in equal runs, as `LossCurve` does), so the SVG is bounded whatever the
run's length; the panel hands it series kept bounded already
(`RunHistory.chart_series`), so a rebuild costs the same at any length.
"""

from __future__ import annotations

import math

from ..run.loss_curve import MAX_POINTS, smooth, use_log_scale
from .panel_text import number_text

__all__ = ["loss_chart_svg"]

_LOSS_COLOR = "var(--jp-brand-color1, #1a73e8)"
_VAL_COLOR = "var(--jp-warn-color1, #e37400)"
_TEXT = "var(--jp-ui-font-color1, #333)"
_MUTED = "var(--jp-ui-font-color2, #777)"
_FRAME = "var(--jp-border-color1, #ccc)"


def _fmt(value: float) -> str:
    return number_text(value)  # the axis reads as the side panel's does


def _bounded(points: list, most: int = MAX_POINTS) -> list:
    """`points` (``(x, value)``, in order) in at most `most` points: the mean
    of each equal run, at the x of its last."""
    if len(points) <= most:
        return points
    width = -(-len(points) // most)  # ceil
    out = []
    for start in range(0, len(points), width):
        run = points[start:start + width]
        out.append((run[-1][0], sum(v for _, v in run) / len(run)))
    return out


def loss_chart_svg(history: list[dict], loss_curve: list | None = None, width: int = 380, height: int = 150, *,
                   val_loss: list | None = None, epoch_loss: list | None = None) -> str:
    """An inline SVG chart of the loss per batch, smoothed, with the
    per-epoch validation loss on top (no plotting library).

    The loss is drawn per batch (faint) and smoothed with TensorBoard's
    debiased moving average, so even a long first epoch shows its fall. The
    legend sits above the plot, never on the lines. The y axis is
    logarithmic only when all values are > 0 and span more than 10x
    (`loss_curve.use_log_scale`, the side panel's policy too).

    Args:
        history: Per-epoch entries such as ``{"epoch": 1, "batch": 100,
            "loss": 0.5, "val_loss": 0.6}`` (``batch``: batches done at the
            epoch's end, counted across epochs).
        loss_curve: ``[[batch, loss], ...]`` (loss None for a NaN). Without
            it, the per-epoch losses are drawn.
        val_loss: ``[[x, val_loss], ...]``, x the batch (with `loss_curve`)
            or the epoch: the validation loss, bounded already. Defaults to
            the one of each entry of `history`.
        epoch_loss: ``[[epoch, loss], ...]``, for the per-epoch losses
            (bounded already). Defaults to `history`'s.

    Returns:
        SVG markup, or a short note while there is nothing to draw.
    """
    by_batch = bool(loss_curve)
    if by_batch:
        loss = [(b, v) for b, v in loss_curve if v is not None]
        if val_loss is None:
            val_loss = [(h["batch"], h["val_loss"]) for h in history
                        if isinstance(h.get("val_loss"), (int, float)) and h.get("batch")]
    else:
        if epoch_loss is None:
            epoch_loss = [(h["epoch"], h["loss"]) for h in history if isinstance(h.get("loss"), (int, float))]
        if val_loss is None:
            val_loss = [(h["epoch"], h["val_loss"]) for h in history if isinstance(h.get("val_loss"), (int, float))]
        loss = epoch_loss
    loss = _bounded([(x, v) for x, v in loss if v is not None and math.isfinite(v)])
    val = _bounded([(x, v) for x, v in val_loss if v is not None and math.isfinite(v)])
    if not loss and not val:
        return f'<div style="color:{_MUTED};font-size:12px">The loss chart appears after the first batch.</div>'
    smoothed = [(x, v) for (x, _), v in zip(loss, smooth([v for _, v in loss])) if v is not None]
    values = [v for _, v in loss] + [v for _, v in val]
    log = use_log_scale(values)
    scale = math.log10 if log else (lambda v: v)
    low, high = min(values), max(values)
    bottom, top_value = scale(low), scale(high)
    if top_value - bottom < 1e-12:
        bottom, top_value = bottom - 0.5, top_value + 0.5
    xs = [x for x, _ in loss] + [x for x, _ in val]
    first, last = (0 if by_batch else min(xs)), max(xs)
    left, right, top, bottom_pad = 46, 8, 20, 20
    plot_w, plot_h = width - left - right, height - top - bottom_pad

    def x_of(x):
        return left + (plot_w * (x - first) / (last - first) if last > first else plot_w / 2)

    def y_of(value):
        return top + plot_h * (top_value - scale(value)) / (top_value - bottom)

    def line(points, color, extra=""):
        coords = " ".join(f"{x_of(x):.1f},{y_of(v):.1f}" for x, v in points)
        return f'<polyline points="{coords}" fill="none" style="stroke:{color}" {extra}/>'

    unit = "batch" if by_batch else "epoch"
    parts = [
        # Scales down to a narrow output area (never up): the viewBox keeps its proportions.
        f'<svg xmlns="http://www.w3.org/2000/svg" class="traincontrol-chart" viewBox="0 0 {width} {height}" '
        f'style="width:100%;max-width:{width}px;height:auto;font:11px sans-serif;fill:{_TEXT}">',
        # The legend, above the plot.
        f'<line x1="{left}" y1="8" x2="{left + 14}" y2="8" style="stroke:{_LOSS_COLOR}" stroke-width="2"/>',
        f'<text x="{left + 18}" y="11">loss (smoothed)</text>',
    ]
    if val:
        parts += [
            f'<line x1="{left + 120}" y1="8" x2="{left + 134}" y2="8" style="stroke:{_VAL_COLOR}" stroke-width="2" stroke-dasharray="4 3"/>',
            f'<text x="{left + 138}" y="11">val_loss</text>',
        ]
    if log:
        parts.append(f'<text x="{width - right}" y="11" text-anchor="end" style="fill:{_MUTED}">log scale</text>')
    parts += [
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" style="stroke:{_FRAME}"/>',
        f'<text x="{left - 4}" y="{top + 9}" text-anchor="end">{_fmt(high)}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end">{_fmt(low)}</text>',
        f'<text x="{left}" y="{height - 5}">{unit} {first}</text>',
        f'<text x="{left + plot_w}" y="{height - 5}" text-anchor="end">{last}</text>',
    ]
    if by_batch:  # epoch ends, faint
        for h in history[-50:]:
            if h.get("batch") and first < h["batch"] < last:
                x = x_of(h["batch"])
                parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" style="stroke:{_FRAME}" stroke-dasharray="2 3"/>')
    if len(loss) > 1:
        parts.append(line(loss, _LOSS_COLOR, 'stroke-width="1" opacity="0.3"'))
        parts.append(line(smoothed, _LOSS_COLOR, 'stroke-width="2"'))
    elif loss:
        parts.append(f'<circle cx="{x_of(loss[0][0]):.1f}" cy="{y_of(loss[0][1]):.1f}" r="3" style="fill:{_LOSS_COLOR}"/>')
    if len(val) > 1:
        parts.append(line(val, _VAL_COLOR, 'stroke-width="2" stroke-dasharray="4 3"'))
    for x, v in val[-1:] if len(val) > 1 else val:
        parts.append(f'<circle cx="{x_of(x):.1f}" cy="{y_of(v):.1f}" r="3" style="fill:{_VAL_COLOR}"/>')
    parts.append("</svg>")
    return "".join(parts)
