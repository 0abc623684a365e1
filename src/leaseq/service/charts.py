"""Server-rendered SVG charts for the dashboard: no JavaScript, no charting library.

Each function returns an ``<svg>`` element as :class:`markupsafe.Markup`;
every label taken from the data (kind and queue names) is escaped here.
"""

from __future__ import annotations

from datetime import datetime, timezone
from html import escape

from markupsafe import Markup

#: Series colours, in order (colour-blind safe palette).
PALETTE = ("#2f5bd3", "#e8871e", "#1a7f37", "#b42318", "#7a5af8", "#0e9384", "#c11574", "#667085")
WIDTH, HEIGHT = 760, 200
LEFT, RIGHT, TOP, BOTTOM = 44, 12, 12, 26


def _colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _clock(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%H:%M")


def _nice_max(value: float) -> float:
    """A round axis maximum at or above ``value``."""
    if value <= 0:
        return 1.0
    step = 10 ** (len(str(int(value))) - 1)
    for m in (1, 2, 5, 10):
        if m * step >= value:
            return float(m * step)
    return float(10 * step)  # pragma: no cover


def legend(groups: list[str]) -> Markup:
    """The colour key of a chart's groups, as HTML."""
    items = "".join(f'<span class="key"><i style="background:{_colour(i)}"></i>{escape(g)}</span>'
                    for i, g in enumerate(groups))
    return Markup(f'<div class="legend">{items}</div>')


def stacked_bars(minutes: list[int], series: dict[str, list[int]], *, title: str, unit: str) -> Markup:
    """One bar per minute, stacked by group; the y axis counts ``unit`` per minute."""
    groups = list(series)
    n = max(len(minutes), 1)
    totals = [sum(series[g][i] for g in groups) for i in range(len(minutes))]
    top = _nice_max(max(totals, default=0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / n
    bar = max(slot * 0.8, 1.0)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
             f'height="{HEIGHT}" role="img" aria-label="{escape(title)}" class="chart">',
             f"<title>{escape(title)}</title>"]
    for frac in (0, 0.5, 1):  # grid lines and axis labels
        y = TOP + plot_h * (1 - frac)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e7ec"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" fill="#667085">'
                     f"{top * frac:g}</text>")
    for i, minute in enumerate(minutes):
        y = TOP + plot_h
        x = LEFT + i * slot + (slot - bar) / 2
        for gi, g in enumerate(groups):
            v = series[g][i]
            if not v:
                continue
            h = plot_h * v / top
            y -= h
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="{_colour(gi)}">'
                         f"<title>{_clock(minute)} {escape(g)}: {v} {escape(unit)}</title></rect>")
    ticks = sorted({0, n // 4, n // 2, 3 * n // 4, n - 1}) if minutes else []
    for i in ticks:
        x = LEFT + i * slot + slot / 2
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="middle" font-size="11" fill="#667085">'
                     f"{_clock(minutes[i])}</text>")
    if not any(totals):
        parts.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" '
                     f'font-size="13" fill="#98a2b3">none in this window</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def duration_bars(durations: dict[str, dict[str, float]], *, title: str) -> Markup:
    """Per group, a bar for the mean duration and a tick for the longest, on one seconds axis."""
    groups = list(durations)
    row = 26
    height = TOP + BOTTOM + row * max(len(groups), 1)
    label_w = 160
    plot_w = WIDTH - label_w - RIGHT - 150  # room for the figures on the right
    top = _nice_max(max((d["max"] for d in durations.values()), default=0.0))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
             f'height="{height}" role="img" aria-label="{escape(title)}" class="chart">',
             f"<title>{escape(title)}</title>"]
    for i, g in enumerate(groups):
        d = durations[g]
        y = TOP + i * row
        mean_w, max_x = plot_w * d["mean"] / top, label_w + plot_w * d["max"] / top
        parts.append(f'<text x="{label_w - 8}" y="{y + 16}" text-anchor="end" font-size="12" fill="#1d2330">'
                     f"{escape(g[:24])}</text>")
        parts.append(f'<rect x="{label_w}" y="{y + 5}" width="{max(mean_w, 1):.1f}" height="14" '
                     f'fill="{_colour(i)}"><title>{escape(g)}: mean {d["mean"]:.3f}s over {d["count"]:g} tasks'
                     f"</title></rect>")
        parts.append(f'<line x1="{max_x:.1f}" x2="{max_x:.1f}" y1="{y + 2}" y2="{y + 22}" stroke="#1d2330" '
                     f'stroke-width="2"><title>{escape(g)}: longest {d["max"]:.3f}s</title></line>')
        parts.append(f'<text x="{label_w + plot_w + 8}" y="{y + 16}" font-size="11" fill="#667085">'
                     f'{d["mean"]:.2f}s · max {d["max"]:.2f}s</text>')
    if not groups:
        parts.append(f'<text x="{WIDTH / 2:.0f}" y="{TOP + 16}" text-anchor="middle" font-size="13" '
                     f'fill="#98a2b3">no completed tasks in this window</text>')
    axis_y = height - BOTTOM + 14
    for frac in (0, 0.5, 1):
        x = label_w + plot_w * frac
        parts.append(f'<text x="{x:.1f}" y="{axis_y}" text-anchor="middle" font-size="11" fill="#667085">'
                     f"{top * frac:g}s</text>")
    parts.append("</svg>")
    return Markup("".join(parts))


def sparkline(minutes: list[int], values: list[int], *, title: str, unit: str, colour: str = PALETTE[0]) -> Markup:
    """A small bar per minute with no axes, for the overview's at-a-glance figures."""
    width, height = 240, 36
    top = max(max(values, default=0), 1)
    slot = width / max(len(values), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img" aria-label="{escape(title)}" class="spark">',
             f"<title>{escape(title)}</title>",
             f'<line x1="0" x2="{width}" y1="{height - 0.5}" y2="{height - 0.5}" stroke="#e4e7ec"/>']
    for i, (minute, v) in enumerate(zip(minutes, values)):
        if not v:
            continue
        h = max((height - 2) * v / top, 1.0)
        parts.append(f'<rect x="{i * slot:.1f}" y="{height - h:.1f}" width="{max(slot * 0.8, 1.0):.1f}" '
                     f'height="{h:.1f}" fill="{colour}"><title>{_clock(minute)}: {v} {escape(unit)}</title></rect>')
    parts.append("</svg>")
    return Markup("".join(parts))
