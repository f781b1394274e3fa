"""Charts for the HTML report, as inline SVG text: no chart library, no network.

Each chart function takes plain values already read from the Report's tables and returns
SVG markup; scaling values to pixels and choosing tick marks is all they work out. Every
name is escaped; each bar or point carries a native tooltip (``<title>``) and, where it
stands for a table row, a link to that row (``href="#row-id"``), which the report's
script highlights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

from advisor.units import format_count, format_ns

__all__ = [
    "Bar",
    "Ceiling",
    "Columns",
    "Marker",
    "Point",
    "Series",
    "bar_chart",
    "roofline_chart",
    "stacked_columns",
]

WIDTH = 1000
# Average glyph widths (px) of the small sans text and the monospace labels, for fitting text.
CHAR_W = 6.0
LABEL_CHAR_W = 7.0


# Bidirectional controls (U+202A-202E, U+2066-2069, the marks): a name holding U+202E
# would show "\u202egnp.exe" as "exe.png". Shown as their escapes, so a name reads as it is.
_BIDI_CODES = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_BIDI = {cp: f"\\u{cp:04x}" for cp in _BIDI_CODES}
BIDI_IN_JSON = {cp: f"\\\\u{cp:04x}" for cp in _BIDI_CODES}  # a backslash in a JSON string is written twice


def shown(text: str) -> str:
    """``text`` with its bidirectional controls written as escapes."""
    return text.translate(_BIDI)


def esc(value: object) -> str:
    return escape(shown(str(value)), quote=True)


def cut(text: str, limit: int, *, middle: bool = False) -> str:
    """``text`` in at most ``limit`` characters: its start and an ellipsis, or with
    ``middle`` its start and its end (operator names differ in their ends:
    ``autograd::engine::evaluate_function: AddmmBackward0``)."""
    text = str(text)
    if len(text) <= limit:
        return text
    if middle:
        tail = (limit - 1) // 2
        return text[: limit - 1 - tail] + "\u2026" + text[len(text) - tail:]
    return text[: limit - 1] + "\u2026"


def _num(x: float) -> str:
    """A coordinate, short."""
    return f"{x:.1f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


def _svg(width: float, height: float, label: str, body: list[str], css_class: str = "chart") -> str:
    return (
        f'<svg class="{css_class}" viewBox="0 0 {_num(width)} {_num(height)}" role="img" '
        f'aria-label="{esc(label)}" preserveAspectRatio="xMinYMin meet">' + "".join(body) + "</svg>"
    )


def _link(href: str | None, inner: str) -> str:
    return f'<a href="#{esc(href)}" class="row-link">{inner}</a>' if href else inner


def nice_ticks(hi: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``hi`` (steps of 1, 2, 2.5 or 5 times a power of ten)."""
    if not (hi > 0 and math.isfinite(hi)):
        return [0.0, 1.0]
    raw = hi / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    ticks = [0.0]
    while ticks[-1] < hi - 1e-9 * hi:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


# -- horizontal bars ------------------------------------------------------------------------


@dataclass
class Bar:
    """One bar: its label, values (one per series), the text at its end, a tooltip and
    the table row it stands for."""

    label: str
    values: list[float | None]
    text: str
    tooltip: str
    href: str | None = None
    cut_middle: bool = False


def bar_chart(bars: list[Bar], series: list[tuple[str, str]], *, label: str, width: int = 660) -> str:
    """Horizontal bars, one row per item, a bar per series (name, css colour class) in
    each row; the longest bar spans the plot. ``width`` is the drawing's own width: a
    chart shown at half the page draws narrower so its text keeps its size."""
    row_h = 22 if len(series) == 1 else 12 + 8 * len(series)
    label_w = round(width * 0.42)
    # Room for the longest end text; labels are cut to what fits beside the bars.
    text_w = 12 + CHAR_W * max([len(b.text) for b in bars] + [8])
    label_chars = int((label_w - 12) / LABEL_CHAR_W)
    plot_w = width - label_w - text_w
    top = 6
    height = top + row_h * max(len(bars), 1) + 6
    longest = max([v for b in bars for v in b.values if v is not None and v > 0] + [1.0])
    body: list[str] = []
    for i, bar in enumerate(bars):
        y = top + i * row_h
        parts = [f"<title>{esc(bar.tooltip)}</title>"]
        parts.append(f'<rect class="band" x="0" y="{_num(y)}" width="{width}" height="{row_h}"/>')
        parts.append(
            f'<text class="label" x="{label_w - 8}" y="{_num(y + row_h / 2 + 4)}" text-anchor="end">'
            f"{esc(cut(bar.label, label_chars, middle=bar.cut_middle))}</text>"
        )
        thickness = (row_h - 8) / len(series)
        for j, (_name, colour) in enumerate(series):
            value = bar.values[j] if j < len(bar.values) else None
            if value is None or value <= 0:
                continue
            w = max(plot_w * value / longest, 1.0)
            parts.append(
                f'<rect class="{colour}" x="{label_w}" y="{_num(y + 4 + j * thickness)}" '
                f'width="{_num(w)}" height="{_num(thickness - (1 if len(series) > 1 else 0))}"/>'
            )
        end = max(plot_w * max([v for v in bar.values if v is not None] + [0]) / longest, 0)
        parts.append(
            f'<text class="value" x="{_num(label_w + end + 6)}" y="{_num(y + row_h / 2 + 4)}">{esc(bar.text)}</text>'
        )
        body.append(f'<g class="bar">{_link(bar.href, "".join(parts))}</g>')
    return _svg(width, height, label, body)


# -- stacked columns --------------------------------------------------------------------------


@dataclass
class Series:
    """One layer of stacked columns: its name, css colour class and a value per column."""

    name: str
    colour: str
    values: list[float]


@dataclass
class Marker:
    """A vertical line at a column position (a step boundary), labelled."""

    position: float  # column index, fractional allowed
    label: str


@dataclass
class Columns:
    """Stacked columns: labels under some columns, tooltips and links per column."""

    labels: list[str]
    tooltips: list[str]
    hrefs: list[str | None]
    series: list[Series]
    overlay: list[float | None] | None = None  # a dot per column (e.g. GPU busy per step)
    overlay_name: str = ""
    markers: list[Marker] = field(default_factory=list)
    label_every: int = 1


def stacked_columns(data: Columns, *, label: str, height: int = 300, full_scale: float | None = None) -> str:
    """Stacked columns on a linear y axis of durations (ns). With ``full_scale`` the axis
    runs from 0 to that value and is labelled in percent of it (each column a share of
    its time slice)."""
    n = len(data.labels)
    left, right, bottom = 70, 12, 34
    top = 24 if data.markers else 12  # marker labels sit above the plot
    plot_w, plot_h = WIDTH - left - right, height - top - bottom
    if full_scale:
        y_max = float(full_scale)
        ticks = [y_max * q for q in (0, 0.25, 0.5, 0.75, 1.0)]
    else:
        totals = [sum(max(s.values[i] or 0, 0) for s in data.series) for i in range(n)]
        highest = max(totals + [v or 0 for v in (data.overlay or [])] + [0])
        ticks = nice_ticks(highest)
        y_max = ticks[-1] or 1.0
    slot = plot_w / max(n, 1)
    gap = min(slot * 0.2, 6) if slot > 4 else 0
    body: list[str] = []
    for t in ticks:
        y = top + plot_h * (1 - t / y_max)
        body.append(f'<line class="grid" x1="{left}" x2="{WIDTH - right}" y1="{_num(y)}" y2="{_num(y)}"/>')
        if full_scale:
            text = f"{t / y_max * 100:.0f}%"
        else:
            text = format_ns(t) if t else "0"
        body.append(f'<text class="tick" x="{left - 6}" y="{_num(y + 4)}" text-anchor="end">{esc(text)}</text>')
    for i in range(n):
        x = left + i * slot + gap / 2
        w = max(slot - gap, 0.5)
        base = top + plot_h
        parts = [f"<title>{esc(data.tooltips[i])}</title>"]
        parts.append(f'<rect class="hit" x="{_num(left + i * slot)}" y="{top}" width="{_num(slot)}" height="{plot_h}"/>')
        for s in data.series:
            value = max(s.values[i] or 0, 0)
            if value <= 0:
                continue
            h = plot_h * value / y_max
            base -= h
            parts.append(f'<rect class="{s.colour}" x="{_num(x)}" y="{_num(base)}" width="{_num(w)}" height="{_num(h)}"/>')
        if data.overlay is not None and data.overlay[i] is not None:
            y = top + plot_h * (1 - data.overlay[i] / y_max)
            parts.append(
                f'<line class="overlay" x1="{_num(x)}" x2="{_num(x + w)}" y1="{_num(y)}" y2="{_num(y)}"/>'
            )
        body.append(f'<g class="col">{_link(data.hrefs[i], "".join(parts))}</g>')
        if data.labels[i] and i % max(data.label_every, 1) == 0:
            body.append(
                f'<text class="tick" x="{_num(left + (i + 0.5) * slot)}" y="{height - bottom + 16}" '
                f'text-anchor="middle">{esc(data.labels[i])}</text>'
            )
    for m in data.markers:
        x = left + m.position * slot
        body.append(f'<line class="marker" x1="{_num(x)}" x2="{_num(x)}" y1="{top}" y2="{top + plot_h}"/>')
        body.append(f'<line class="marker" x1="{_num(x)}" x2="{_num(x)}" y1="{top - 14}" y2="{top}"/>')
        body.append(f'<text class="marker-label" x="{_num(x + 3)}" y="{top - 6}">{esc(m.label)}</text>')
    body.append(f'<line class="axis" x1="{left}" x2="{WIDTH - right}" y1="{top + plot_h}" y2="{top + plot_h}"/>')
    return _svg(WIDTH, height, label, body)


# -- roofline -----------------------------------------------------------------------------------


@dataclass
class Point:
    """An op or kernel on the roofline: FLOPs per byte, achieved FLOP/s, size by time."""

    intensity: float
    achieved: float
    weight_ns: float
    kind: str  # css class: "pt-op" or "pt-kernel"
    tooltip: str
    href: str | None = None


@dataclass
class Ceiling:
    """A compute roof (peak FLOP/s) with its label; the memory roof is ``bandwidth``."""

    label: str
    peak_flops: float


def _decades(lo: float, hi: float) -> tuple[int, int]:
    return math.floor(math.log10(lo)), math.ceil(math.log10(hi))


def _si(value: float) -> str:
    """A power of ten for a log axis: 0.01, 0.1, 1, 10, 100, 1K, 10K, ... 1T."""
    if value < 1:
        return f"{value:g}"
    for factor, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if value >= factor:
            return f"{value / factor:g}{suffix}"
    return f"{value:g}"


def roofline_chart(points: list[Point], ceilings: list[Ceiling], bandwidth: float | None, *, label: str,
                   height: int = 420) -> str:
    """Log-log roofline: intensity (FLOP/byte) across, achieved FLOP/s up; the memory roof
    (bandwidth x intensity) and a compute roof per ceiling, points sized by their time."""
    left, right, top, bottom = 78, 150, 14, 40
    plot_w, plot_h = WIDTH - left - right, height - top - bottom
    xs = [p.intensity for p in points if p.intensity > 0]
    ys = [p.achieved for p in points if p.achieved > 0]
    peaks = [c.peak_flops for c in ceilings if c.peak_flops and c.peak_flops > 0]
    ridges = [c / bandwidth for c in peaks] if bandwidth else []
    x_lo, x_hi = _decades(min(xs + ridges) / 2, max(xs + ridges) * 2)
    y_lo, y_hi = _decades(min(ys + peaks) / 2, max(ys + peaks) * 1.5)
    x_hi, y_hi = max(x_hi, x_lo + 1), max(y_hi, y_lo + 1)

    def px(x: float) -> float:
        return left + plot_w * (math.log10(x) - x_lo) / (x_hi - x_lo)

    def py(y: float) -> float:
        return top + plot_h * (1 - (math.log10(y) - y_lo) / (y_hi - y_lo))

    body: list[str] = [f'<clipPath id="roof-clip"><rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}"/></clipPath>']
    for d in range(x_lo, x_hi + 1):
        x = px(10.0**d)
        body.append(f'<line class="grid" x1="{_num(x)}" x2="{_num(x)}" y1="{top}" y2="{top + plot_h}"/>')
        body.append(f'<text class="tick" x="{_num(x)}" y="{top + plot_h + 16}" text-anchor="middle">{esc(_si(10.0**d))}</text>')
    for d in range(y_lo, y_hi + 1):
        y = py(10.0**d)
        body.append(f'<line class="grid" x1="{left}" x2="{left + plot_w}" y1="{_num(y)}" y2="{_num(y)}"/>')
        body.append(f'<text class="tick" x="{left - 6}" y="{_num(y + 4)}" text-anchor="end">{esc(_si(10.0**d))}</text>')
    body.append(
        f'<text class="axis-title" x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle">'
        "arithmetic intensity (FLOP per byte)</text>"
    )
    body.append(
        f'<text class="axis-title" x="14" y="{top + plot_h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + plot_h / 2})">achieved FLOP/s</text>'
    )
    lo_x, hi_x = 10.0**x_lo, 10.0**x_hi
    roofs: list[str] = []
    if bandwidth:
        for c in sorted(ceilings, key=lambda c: c.peak_flops or 0):
            if not c.peak_flops:
                continue
            ridge = c.peak_flops / bandwidth
            roofs.append(
                f'<polyline class="roof" points="{_num(px(lo_x))},{_num(py(bandwidth * lo_x))} '
                f'{_num(px(ridge))},{_num(py(c.peak_flops))} {_num(px(hi_x))},{_num(py(c.peak_flops))}">'
                f"<title>{esc(c.label)}: {esc(format_count(c.peak_flops))}FLOP/s peak, ridge at {ridge:.3g} FLOP/byte</title>"
                "</polyline>"
            )
        if not peaks:
            roofs.append(
                f'<line class="roof" x1="{_num(px(lo_x))}" y1="{_num(py(bandwidth * lo_x))}" '
                f'x2="{_num(px(hi_x))}" y2="{_num(py(bandwidth * hi_x))}"/>'
            )
    else:
        for c in ceilings:
            if c.peak_flops:
                roofs.append(
                    f'<line class="roof" x1="{left}" x2="{left + plot_w}" y1="{_num(py(c.peak_flops))}" '
                    f'y2="{_num(py(c.peak_flops))}"/>'
                )
    body.append('<g clip-path="url(#roof-clip)">' + "".join(roofs) + "</g>")
    for c in ceilings:
        if c.peak_flops:
            body.append(
                f'<text class="roof-label" x="{left + plot_w + 6}" y="{_num(py(c.peak_flops) + 4)}">'
                f"{esc(cut(c.label, 22))}</text>"
            )
    if bandwidth:
        body.append(
            f'<text class="roof-label" x="{_num(px(lo_x) + 6)}" y="{_num(min(py(bandwidth * lo_x), top + plot_h) - 6)}">'
            f"{esc(format_count(bandwidth))}B/s memory</text>"
        )
    heaviest = max([p.weight_ns for p in points] + [1.0])
    # Largest first, so small points are drawn on top and stay reachable.
    for p in sorted(points, key=lambda p: -p.weight_ns):
        if p.intensity <= 0 or p.achieved <= 0:
            continue
        r = 3 + 9 * math.sqrt(max(p.weight_ns, 0) / heaviest)
        shape = (
            f'<circle class="{p.kind}" cx="{_num(px(p.intensity))}" cy="{_num(py(p.achieved))}" r="{_num(r)}">'
            f"<title>{esc(p.tooltip)}</title></circle>"
        )
        body.append(_link(p.href, shape))
    return _svg(WIDTH, height, label, body)
