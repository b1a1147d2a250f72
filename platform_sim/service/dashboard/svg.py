"""A job's eval curve as inline SVG: score against step, with the best step and the stop step marked and labelled.

Inline SVG needs no script and no file from anywhere: it renders in any browser, with JavaScript off too. The
elements carry classes (``curve``, ``line``, ``best-marker``, ``stop-marker``) styled by the page's stylesheet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT = 760, 320
"""The drawing's size in SVG units (it scales to the page's width)."""
_LEFT, _RIGHT, _TOP, _BOTTOM = 58, 18, 48, 40


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering ``[lo, hi]`` (steps of 1, 2 or 5 times a power of ten).

    Args:
        lo: Lowest value shown.
        hi: Highest value shown (``hi > lo``).
        count: Ticks wanted (about).
    """
    raw = (hi - lo) / max(count, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _span(lo: float, hi: float) -> tuple[float, float]:
    # A flat series (one point, or equal scores) still needs a range to draw in.
    if hi > lo:
        return lo, hi
    pad = abs(lo) * 0.05 or 1.0
    return lo - pad, hi + pad


def eval_curve(
    points: Sequence[tuple[int, float]], best_step: int | None = None, stop_step: int | None = None, title: str = ""
) -> str:
    """The SVG element of an eval curve.

    Args:
        points: ``(step, score)`` of each report, in step order.
        best_step: The best step to mark, or None.
        stop_step: The step at which the job was stopped, to mark, or None.
        title: The drawing's accessible title (escaped here).
    """
    label = escape(title or "eval score by step")
    head = (
        f'<svg class="curve" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{label}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{label}</title>'
    )
    if not points:
        return head + f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}">no reports yet</text></svg>'
    steps = [p[0] for p in points]
    scores = [p[1] for p in points]
    x_lo, x_hi = _span(float(min(steps)), float(max(steps)))
    y_lo, y_hi = _span(min(scores), max(scores))
    y_pad = (y_hi - y_lo) * 0.08
    y_lo, y_hi = y_lo - y_pad, y_hi + y_pad
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM

    def x(step: float) -> float:
        return _LEFT + (step - x_lo) / (x_hi - x_lo) * plot_w

    def y(score: float) -> float:
        return _TOP + (y_hi - score) / (y_hi - y_lo) * plot_h

    parts = [head, f'<rect class="frame" x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}"/>']
    for tick in nice_ticks(y_lo, y_hi):
        ty = y(tick)
        parts.append(f'<line class="grid" x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{ty:.1f}" y2="{ty:.1f}"/>')
        parts.append(f'<text class="tick" x="{_LEFT - 6}" y="{ty + 4:.1f}" text-anchor="end">{_fmt(tick)}</text>')
    for tick in nice_ticks(x_lo, x_hi, 8):
        tx = x(tick)
        parts.append(f'<line class="grid" x1="{tx:.1f}" x2="{tx:.1f}" y1="{_TOP}" y2="{HEIGHT - _BOTTOM}"/>')
        parts.append(
            f'<text class="tick" x="{tx:.1f}" y="{HEIGHT - _BOTTOM + 16}" text-anchor="middle">{_fmt(tick)}</text>'
        )
    parts.append(f'<text class="axis" x="{_LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle">step</text>')
    parts.append(
        f'<text class="axis" x="14" y="{_TOP + plot_h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {_TOP + plot_h / 2})">eval score</text>'
    )
    line = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in points)
    parts.append(f'<polyline class="line" points="{line}"/>')
    if len(points) <= 200:  # beyond that the dots hide the line
        parts.extend(f'<circle class="dot" cx="{x(s):.1f}" cy="{y(v):.1f}" r="2.5"/>' for s, v in points)
    by_step = dict(points)
    if stop_step is not None:
        parts.append(_marker("stop-marker", stop_step, f"stop at step {stop_step}", x(stop_step), plot_h, 16))
    if best_step is not None and best_step in by_step:
        bx, by = x(best_step), y(by_step[best_step])
        text = f"best step {best_step} ({_fmt(by_step[best_step])})"
        parts.append(_marker("best-marker", best_step, text, bx, plot_h, 34, by))
    parts.append("</svg>")
    return "".join(parts)


def _marker(cls: str, step: int, text: str, mx: float, plot_h: float, ty: float, point_y: float | None = None) -> str:
    """A vertical marker at ``mx`` labelled at height ``ty``, above the plot (where no curve can hide the label);
    ``point_y`` adds a ring around the marked point."""
    # Labels right of the line, or left of it in the right third, so that they stay inside the drawing.
    anchor, tx = ("end", mx - 5) if mx > _LEFT + 0.66 * (WIDTH - _LEFT - _RIGHT) else ("start", mx + 5)
    ring = "" if point_y is None else f'<circle class="ring" cx="{mx:.1f}" cy="{point_y:.1f}" r="6"/>'
    return (
        f'<g class="{cls}" data-step="{step}">'
        f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{ty - 12}" y2="{_TOP + plot_h}"/>{ring}'
        f'<text x="{tx:.1f}" y="{ty}" text-anchor="{anchor}">{escape(text)}</text></g>'
    )
