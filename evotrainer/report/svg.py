"""The report's drawing primitives: escaping, linear scales, round ticks, axes and marks as inline SVG text. The
report's pictures are a few lines, dots and bars with tooltips and in-page links; a plotting library would add a
dependency (or a script the page must run) for that, and could not link a mark to the part of the page it
stands for."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# One colour per kind of branch, shared by the lineage and the curves so a reader learns it once.
KIND_COLOURS = {
    "base": "#222",
    "segment": "#1b7a1b",
    "candidate": "#1f63c6",
    "control": "#666",
    "control_replicate": "#aaa",
    "replicate": "#8fb3e8",
    "aa": "#d08a00",
}
PROMOTE, REJECT, MAINLINE = "#0a8a0a", "#c62828", "#1b7a1b"
FONT = 'font-family="system-ui,sans-serif"'


def esc(x: Any) -> str:
    return html.escape(str(x))


def finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


@dataclass(frozen=True)
class Scale:
    """Maps [lo, hi] onto pixels [a, b] (b < a for a y axis, which grows upward)."""

    lo: float
    hi: float
    a: float
    b: float

    def __call__(self, v: float) -> float:
        span = self.hi - self.lo
        return self.a + (self.b - self.a) * ((v - self.lo) / span if span else 0.5)


def ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """About n round values spanning [lo, hi] (1, 2 or 5 times a power of ten apart)."""
    if not (finite(lo) and finite(hi)) or hi <= lo:
        return [lo] if finite(lo) else []
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def num(v: float) -> str:
    """A tick label: few digits, no trailing zeros, scientific only for very small or large values."""
    if v == 0:
        return "0"
    if abs(v) < 1e-3 or abs(v) >= 1e5:
        return f"{v:.0e}"
    return f"{v:.3g}"


def padded(values: Iterable[float], pad: float = 0.05) -> tuple[float, float]:
    """The finite values' range widened by `pad` of itself (a flat series gets a unit-wide window)."""
    vs = [v for v in values if finite(v)]
    if not vs:
        return 0.0, 1.0
    lo, hi = min(vs), max(vs)
    if hi == lo:
        return lo - (abs(lo) * 0.1 or 0.5), hi + (abs(hi) * 0.1 or 0.5)
    return lo - pad * (hi - lo), hi + pad * (hi - lo)


def text(x: float, y: float, s: Any, size: int = 10, anchor: str = "start", **attrs: Any) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{esc(v)}"' for k, v in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>{esc(s)}</text>'


def line(x1: float, y1: float, x2: float, y2: float, stroke: str, width: float = 1, **attrs: Any) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{esc(v)}"' for k, v in attrs.items())
    return (
        f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}" '
        f'stroke-width="{width}"{extra}/>'
    )


def polyline(points: Sequence[tuple[float, float]], stroke: str, width: float, title: str = "", **attrs: Any) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{esc(v)}"' for k, v in attrs.items())
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    tip = f"<title>{esc(title)}</title>" if title else ""
    return f'<polyline fill="none" stroke="{stroke}" stroke-width="{width}" points="{pts}"{extra}>{tip}</polyline>'


def svg(width: float, height: float, body: Iterable[str], label: str) -> str:
    """An inline SVG element with an accessible name."""
    return (
        f'<svg width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
        f'aria-label="{esc(label)}" {FONT}>' + "".join(body) + "</svg>"
    )


def y_axis(y: Scale, x0: float, x1: float, n: int = 4) -> list[str]:
    """Horizontal grid lines with their labels left of x0."""
    out = []
    for v in ticks(min(y.lo, y.hi), max(y.lo, y.hi), n):
        py = y(v)
        out.append(line(x0, py, x1, py, "#e6e6e6"))
        out.append(text(x0 - 4, py + 3, num(v), 9, "end", fill="#555"))
    return out


def x_axis(x: Scale, y0: float, n: int = 6) -> list[str]:
    """Tick labels below y0."""
    return [text(x(v), y0 + 12, num(v), 9, "middle", fill="#555") for v in ticks(x.lo, x.hi, n)]
