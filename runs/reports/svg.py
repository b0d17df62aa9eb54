"""A chart block of an exported report drawn as inline SVG: the export opens with no server and no
script, and plotly (4.8 MB) inlined in every file would dwarf the report. A line per series, steps on
x, a linear or (when every value is positive and spans two decades) log y axis, a legend of run and
series names as text. Every string in it goes through format_html, so a name is never markup."""
from __future__ import annotations

import math

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")
WIDTH, HEIGHT = 760, 320
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 40
LEGEND_LINE = 18


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        return [low]
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if raw <= m * step)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def line_chart(*, title: str, lines: list[dict]) -> SafeString:
    """`lines`: [{"name": text, "colour": index into the palette, "steps": [...], "values": [...]}]; values
    that are not finite (NaN, inf, strings the API wrote for them) are left out of the line."""
    points = [[(s, v) for s, v in zip(line["steps"], line["values"])
               if isinstance(v, (int, float)) and math.isfinite(v)] for line in lines]
    drawn = [p for p in points if p]
    legend_height = LEGEND_LINE * len(lines) + 8
    height = HEIGHT + legend_height
    if not drawn:
        return format_html('<svg xmlns="http://www.w3.org/2000/svg" class="report-svg" width="{}" height="60" role="img">'
                           '<text x="8" y="30">{}: no points</text></svg>', WIDTH, title)
    xs = [s for p in drawn for s, _ in p]
    ys = [v for p in drawn for _, v in p]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    log = y0 > 0 and y1 / y0 >= 100
    ty = (lambda v: math.log10(v)) if log else (lambda v: v)
    t0, t1 = ty(y0), ty(y1)
    if t1 == t0:
        t0, t1 = t0 - 1, t1 + 1
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(s: float) -> float:
        return LEFT + (s - x0) / (x1 - x0) * plot_w

    def py(v: float) -> float:
        return TOP + (1 - (ty(v) - t0) / (t1 - t0)) * plot_h

    parts = [format_html('<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#bbb"/>', LEFT, TOP, plot_w, plot_h)]
    for tick in _ticks(x0, x1):
        parts.append(format_html('<text x="{}" y="{}" text-anchor="middle" font-size="11">{}</text>',
                                 f"{px(tick):.1f}", TOP + plot_h + 16, _fmt(tick)))
    y_ticks = [10 ** t for t in _ticks(t0, t1) if float(t).is_integer()] if log else _ticks(t0, t1)
    for tick in y_ticks or [y0, y1]:
        parts.append(format_html('<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="#eee"/>'
                                 '<text x="{}" y="{}" text-anchor="end" font-size="11">{}</text>',
                                 LEFT, LEFT + plot_w, f"{py(tick):.1f}", f"{py(tick):.1f}", LEFT - 6, f"{py(tick) + 4:.1f}",
                                 _fmt(tick)))
    parts.append(format_html('<text x="{}" y="{}" text-anchor="middle" font-size="11">step{}</text>',
                             LEFT + plot_w / 2, TOP + plot_h + 32, " (log y)" if log else ""))
    for i, (line, pts) in enumerate(zip(lines, points)):
        colour = PALETTE[line["colour"] % len(PALETTE)]
        if pts:
            path = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in pts)
            parts.append(format_html('<polyline class="series" fill="none" stroke="{}" stroke-width="1.6" points="{}"/>',
                                     colour, path))
        y = HEIGHT + 4 + LEGEND_LINE * i
        parts.append(format_html('<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="{}" stroke-width="3"/>'
                                 '<text class="legend" x="{}" y="{}" font-size="12">{}{}</text>',
                                 LEFT, LEFT + 24, y + 8, y + 8, colour, LEFT + 30, y + 12, line["name"],
                                 "" if pts else " (no points)"))
    return format_html('<svg xmlns="http://www.w3.org/2000/svg" class="report-svg" width="{}" height="{}" role="img" '
                       'aria-label="{}">{}</svg>', WIDTH, height, title, mark_safe("".join(parts)))

