"""Markdown tables as the benchmarks print them (to paste into benchmarks/RESULTS.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table: the header, the rule, one line a row (cells already formatted, or str()'d)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def mean_and_seeds(xs: Sequence[float | None]) -> str:
    """`0.806 (0.816 / 0.812 / 0.789)`: the mean and each seed's value, or `-` where a seed is missing."""
    if any(x is None for x in xs):
        return "-"
    return f"{np.mean(xs):.3f} ({' / '.join(f'{x:.3f}' for x in xs)})"
