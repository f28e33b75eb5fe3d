"""Charts as inline SVG written by gpuvet: no plotting library, no script, no font beyond the page's.

Chosen over matplotlib (+152 MB with numpy, so the default install sent a page of numbers) and
over a vendored JavaScript library (uPlot, 51 KB minified before any data, drawing only where
scripts run) by measure (benchmarks/html_plots.py): an 8-GPU 10-minute soak at 10 Hz is a 0.58 MB page,
report included, written in 0.4 s and painted by headless Chromium 230 ms after it starts loading;
uPlot's page of three of those charts alone was 0.26 MB and painted after 300 ms. SVG also prints,
and reads in any viewer, scripts or not. Hover values come from the SVG itself: the plot area is cut into vertical
bands, each carrying a <title> with every line's value at that time (the browser's own tooltip),
and each cluster dot names its node and value the same way.

A chart draws the time since start on x, the value in its unit on y (axis titled with the unit),
every limit as a dashed line named in the legend, and breaks a line where a reading is missing.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeGuard

MAX_POINTS = 1200  # per line: a 60-minute soak at 10 Hz still draws in a light page
HOVER_BANDS = 120  # tooltips per chart: one per 5 s of a 10-minute soak

# One colour per GPU, the same on every plot (tab10, readable on white and in grey print).
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")

WIDTH, HEIGHT = 1100, 340
LEFT, RIGHT, TOP, BOTTOM = 72, 880, 36, 292  # the plot area; the legend sits right of it


@dataclass
class Line:
    label: str
    t: list[float]
    y: list[float | None]  # None (or NaN): no reading, the line breaks there


@dataclass
class Limit:
    label: str  # "power limit 700 W"
    value: float


@dataclass
class Dot:
    group: str  # where it is on x (a node)
    label: str  # what it is ("node-0017 gpu3")
    value: float


@dataclass
class _Scale:
    lo: float
    hi: float
    a: float  # pixel of lo
    b: float  # pixel of hi

    def __call__(self, v: float) -> float:
        span = self.hi - self.lo or 1.0
        return self.a + (v - self.lo) / span * (self.b - self.a)


@dataclass
class _Svg:
    key: str
    title: str
    parts: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        self.parts.append(text)

    def done(self) -> str:
        return (f'<svg class="plot" id="svg-{self.key}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
                f'aria-label="{_e(self.title)}" font-size="12">' + "".join(self.parts) + "</svg>")


def colour(label: str, fallback: int) -> str:
    """A GPU keeps its colour on every chart (gpu3 is always the fourth colour)."""
    m = re.fullmatch(r"gpu(\d+)", label)
    return COLOURS[(int(m.group(1)) if m else fallback) % len(COLOURS)]


def line_chart(key: str, title: str, axis: str, lines: Sequence[Line], limits: Sequence[Limit] = (),
               unit: str = "", x_title: str = "time since start (s)",
               x_ticks: Callable[[float], str] | None = None) -> str | None:
    """`axis`: the y axis' title with its unit ("power (W)"); `unit` follows each hover value;
    `x_ticks`: how a time tick is written (a watch log's wall clock), seconds by default."""
    # Time series on a shared time axis, with the limits dashed; None when nothing is known.
    lines = [line for line in lines if any(_known(v) for v in line.y)]
    if not lines:
        return None
    ts = [t for line in lines for t in line.t]
    top = max(max(v for v in line.y if _known(v)) for line in lines)
    top = max([top, *(lim.value for lim in limits)]) * 1.08 or 1.0
    bottom = min(0.0, min(min(v for v in line.y if _known(v)) for line in lines))
    x = _Scale(min(ts), max(ts) if max(ts) > min(ts) else min(ts) + 1, LEFT, RIGHT)
    y = _Scale(bottom, top, BOTTOM, TOP)
    svg = _Svg(key, title)
    _frame(svg, title, axis, x_title, x, y, x_ticks=x_ticks)
    for n, line in enumerate(lines):
        stroke = colour(line.label, n)
        t, v = thin(line.t, line.y)
        for run in _runs(t, v):
            points = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in run)
            svg.add(f'<polyline points="{points}" fill="none" stroke="{stroke}" stroke-width="1.5">'
                    f"<title>{_e(line.label)}</title></polyline>")
    for n, lim in enumerate(limits):
        svg.add(f'<line x1="{LEFT}" x2="{RIGHT}" y1="{y(lim.value):.1f}" y2="{y(lim.value):.1f}" stroke="#333" '
                f'stroke-width="1.2" stroke-dasharray="{"6 4" if n == 0 else "2 3"}"><title>{_e(lim.label)}</title></line>')
    _legend(svg, [(line.label, colour(line.label, n), None) for n, line in enumerate(lines)]
            + [(lim.label, "#333", "6 4" if n == 0 else "2 3") for n, lim in enumerate(limits)])
    _hover_bands(svg, lines, unit, x, x_ticks)
    return svg.done()


def dot_chart(key: str, title: str, axis: str, dots: Sequence[Dot], limits: Sequence[Limit] = (),
              unit: str = "", x_title: str = "node") -> str | None:
    """One dot per value, grouped on x (a node's GPUs side by side): the spread of one figure
    across a cluster, with the baseline and the straggler threshold drawn."""
    if not dots:
        return None
    groups = list(dict.fromkeys(d.group for d in dots))
    top = max([*(d.value for d in dots), *(lim.value for lim in limits)]) * 1.08 or 1.0
    x = _Scale(-0.5, len(groups) - 0.5, LEFT, RIGHT)
    y = _Scale(0.0, top, BOTTOM, TOP)
    svg = _Svg(key, title)
    _frame(svg, title, axis, x_title, x, y, categories=groups)
    index = {g: i for i, g in enumerate(groups)}
    per_group: dict[str, int] = {}
    width = (RIGHT - LEFT) / len(groups)
    for d in dots:
        k = per_group[d.group] = per_group.get(d.group, -1) + 1
        spread = min(width * 0.6, 24.0)
        offset = ((k % 8) / 7 - 0.5) * spread if spread > 2 else 0.0
        svg.add(f'<circle cx="{x(index[d.group]) + offset:.1f}" cy="{y(d.value):.1f}" r="3" fill="{COLOURS[0]}" '
                f'fill-opacity="0.75"><title>{_e(d.label)}: {_value(d.value)} {_e(unit)}</title></circle>')
    for n, lim in enumerate(limits):
        svg.add(f'<line x1="{LEFT}" x2="{RIGHT}" y1="{y(lim.value):.1f}" y2="{y(lim.value):.1f}" stroke="#333" '
                f'stroke-width="1.2" stroke-dasharray="{"6 4" if n else "none"}"><title>{_e(lim.label)}</title></line>')
    _legend(svg, [("a GPU or node's value", COLOURS[0], "dot")]
            + [(lim.label, "#333", "6 4" if n else None) for n, lim in enumerate(limits)])
    return svg.done()


# -- pieces ----------------------------------------------------------------------------------------

def _frame(svg: _Svg, title: str, unit: str, x_title: str, x: _Scale, y: _Scale,
           categories: list[str] | None = None, x_ticks: Callable[[float], str] | None = None) -> None:
    svg.add(f'<text x="{LEFT}" y="20" font-size="15" font-weight="700" fill="#101828">{_e(title)}</text>')
    svg.add(f'<rect x="{LEFT}" y="{TOP}" width="{RIGHT - LEFT}" height="{BOTTOM - TOP}" fill="#fff" stroke="#98a2b3"/>')
    for v in nice_ticks(y.lo, y.hi):
        py = y(v)
        svg.add(f'<line x1="{LEFT}" x2="{RIGHT}" y1="{py:.1f}" y2="{py:.1f}" stroke="#eaecf0"/>'
                f'<text x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end" fill="#475467">{_value(v)}</text>')
    if categories is None:
        for v in nice_ticks(x.lo, x.hi):
            px = x(v)
            svg.add(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{TOP}" y2="{BOTTOM}" stroke="#eaecf0"/>'
                    f'<text x="{px:.1f}" y="{BOTTOM + 16}" text-anchor="middle" fill="#475467">'
                    f"{_e(x_ticks(v)) if x_ticks else _value(v)}</text>")
    else:
        step = max(1, math.ceil(len(categories) / 12))  # at most a dozen names fit under the axis
        for i in range(0, len(categories), step):
            svg.add(f'<text x="{x(i):.1f}" y="{BOTTOM + 16}" text-anchor="middle" fill="#475467">'
                    f"{_e(_shorten(categories[i], 14))}</text>")
    svg.add(f'<text x="{(LEFT + RIGHT) / 2:.0f}" y="{HEIGHT - 8}" text-anchor="middle" fill="#344054">{_e(x_title)}</text>')
    mid = (TOP + BOTTOM) / 2
    svg.add(f'<text transform="translate(16 {mid:.0f}) rotate(-90)" text-anchor="middle" fill="#344054">{_e(unit)}</text>')


def _legend(svg: _Svg, entries: list[tuple[str, str, str | None]]) -> None:
    """Right of the plot area; two columns when there are many lines (16 GPUs)."""
    rows = 16
    for i, (label, stroke, dash) in enumerate(entries[: rows * 2]):
        col, row = divmod(i, rows)
        lx, ly = RIGHT + 14 + col * 104, TOP + 8 + row * 16
        if dash == "dot":
            mark = f'<circle cx="{lx + 9}" cy="{ly}" r="3" fill="{stroke}"/>'
        else:
            dashes = f' stroke-dasharray="{dash}"' if dash else ""
            mark = f'<line x1="{lx}" x2="{lx + 18}" y1="{ly}" y2="{ly}" stroke="{stroke}" stroke-width="2"{dashes}/>'
        text = _shorten(label, 15 if len(entries) > rows else 30)
        svg.add(f'{mark}<text x="{lx + 24}" y="{ly + 4}" fill="#101828">{_e(text)}<title>{_e(label)}</title></text>')


def _hover_bands(svg: _Svg, lines: Sequence[Line], unit: str, x: _Scale,
                 x_ticks: Callable[[float], str] | None = None) -> None:
    """Invisible vertical bands over the plot area, each with a tooltip: the time and every
    line's reading nearest to the middle of the band. CSS (.band:hover) shades the one under
    the pointer, so a reader sees which moment the values are for."""
    bands = HOVER_BANDS
    width = (RIGHT - LEFT) / bands
    svg.add('<g class="bands">')
    for i in range(bands):
        t = x.lo + (i + 0.5) / bands * (x.hi - x.lo)
        values = [f"{line.label} {_value(v)} {unit}" for line in lines if (v := _nearest(line, t, width / (RIGHT - LEFT) * (x.hi - x.lo))) is not None]
        if not values:
            continue
        when = f"{x_ticks(t)} (t = {_value(t)} s)" if x_ticks else f"t = {_value(t)} s"
        tip = when + "\n" + "\n".join(values)
        svg.add(f'<rect class="band" x="{LEFT + i * width:.1f}" y="{TOP}" width="{width:.2f}" height="{BOTTOM - TOP}">'
                f"<title>{_e(tip)}</title></rect>")
    svg.add("</g>")


def _nearest(line: Line, t: float, within: float) -> float | None:
    """The reading nearest to time t, if one lies within `within` seconds of it (t is sorted)."""
    import bisect

    i = bisect.bisect_left(line.t, t)
    best: tuple[float, float] | None = None  # (distance in time, reading)
    for j in (i - 1, i):
        if 0 <= j < len(line.t) and _known(v := line.y[j]) and abs(line.t[j] - t) <= within:
            if best is None or abs(line.t[j] - t) < best[0]:
                best = abs(line.t[j] - t), float(v)
    return None if best is None else best[1]


# -- numbers ---------------------------------------------------------------------------------------

def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values (1, 2, 5 x 10^k apart) covering [lo, hi]."""
    span = hi - lo
    if span <= 0 or not math.isfinite(span):
        return [lo]
    raw = span / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step) * step
    ticks = []
    v = first
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 10))
        v += step
    return ticks


def thin(t: Sequence[float], y: Sequence[float | None]) -> tuple[list[float], list[float | None]]:
    """At most MAX_POINTS points: each bucket keeps its lowest and highest reading (in time
    order), so a dip or a spike still shows; a bucket with a missing reading keeps the gap."""
    if len(y) <= MAX_POINTS:
        return list(t), list(y)
    size = math.ceil(len(y) / (MAX_POINTS // 2))
    out_t: list[float] = []
    out_y: list[float | None] = []
    for start in range(0, len(y), size):
        known = [(i, v) for i in range(start, min(start + size, len(y))) if _known(v := y[i])]
        if len(known) < min(start + size, len(y)) - start:  # a gap inside: keep it visible
            out_t.append(t[start])
            out_y.append(None)
        if known:
            low = min(known, key=lambda reading: reading[1])[0]
            high = max(known, key=lambda reading: reading[1])[0]
            for i in sorted({low, high}):
                out_t.append(t[i])
                out_y.append(y[i])
    return out_t, out_y


def _runs(t: Sequence[float], y: Sequence[float | None]) -> list[list[tuple[float, float]]]:
    """The stretches of consecutive known readings (a missing one breaks the line)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for a, b in zip(t, y):
        if _known(b):
            runs[-1].append((a, float(b)))
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def _known(v: float | None) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _value(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10 or v == int(v):
        return f"{v:.0f}" if v == int(v) else f"{v:.1f}"
    return f"{v:.3g}"


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)
