"""Training curves per branch: one small chart per step metric the store holds (reward, audit pass rate, KL,
entropy, completion length, clipped ratio, ...), every branch a line over the run's global steps, the mainline's
path drawn bold over the arms, each round's fork point a vertical rule (green where the round promoted, red where
it rolled back); plus held-out accuracy, one dot per evaluated branch at its last step."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from evotrainer.report.lineage import RoundShape, mainline, round_href
from evotrainer.report.svg import (
    KIND_COLOURS,
    MAINLINE,
    PROMOTE,
    REJECT,
    Scale,
    esc,
    finite,
    line,
    padded,
    polyline,
    svg,
    text,
    x_axis,
    y_axis,
)
from evotrainer.store.rollouts import RolloutStore

# The step metrics drawn, in this order, where the store has them (TRL's names: style.md 12).
METRICS = {
    "reward": "training reward (mean over the step's rollouts)",
    "audit/pass_rate": "audit pass rate of audited training rollouts",
    "kl": "KL to the reference policy",
    "entropy": "entropy of sampled tokens (nats)",
    "completions/mean_length": "completion length (tokens, mean)",
    "completions/clipped_ratio": "clipped ratio (completions cut at the length cap)",
    "frac_reward_zero_std": "groups with zero reward spread (no signal)",
    "grad_norm": "gradient norm",
}
W, H, ML, MR, MT, MB = 560, 170, 46, 10, 22, 24


def read_metrics(store: RolloutStore) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{metric: {branch: [(step, value), ...]}} for the metrics drawn, steps in order."""
    names = ", ".join(f"'{n}'" for n in METRICS)
    out: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    rows = store.sql(
        f"SELECT name, branch, step, value FROM metrics WHERE name IN ({names}) ORDER BY name, branch, step"
    )
    for r in rows:
        if finite(r["value"]):
            out[r["name"]][r["branch"]].append((r["step"], r["value"]))
    return out


def _forks(rounds: list[RoundShape], x: Scale, top: float, bottom: float) -> list[str]:
    """A vertical rule at each round's fork step, with a tooltip saying what the round decided."""
    out = []
    for s in rounds:
        if not s.segment:
            continue
        step = s.segment["last_step"]
        colour, width, what = (
            (PROMOTE, 1.6, f"promoted {s.promoted}")
            if s.promoted
            else (REJECT, 1.6, f"rolled back to {s.rolled_back_to}")
            if s.rolled_back_to
            else ("#cfcfcf", 1, f"continued from {s.head}" if s.head else "unfinished")
        )
        dash = {} if colour != "#cfcfcf" else {"stroke_dasharray": "2,3"}
        out.append(
            f"<g><title>round {s.round}: arms fork at step {step}; {esc(what)}</title>"
            + line(x(step), top, x(step), bottom, colour, width, **dash)
            + "</g>"
        )
    return out


def _frame(title: str, x: Scale, y: Scale, rounds: list[RoundShape]) -> list[str]:
    return [
        f'<rect x="{ML}" y="{MT}" width="{W - ML - MR}" height="{H - MT - MB}" fill="#fff" stroke="#ddd"/>',
        *y_axis(y, ML, W - MR),
        *x_axis(x, H - MB),
        *_forks(rounds, x, MT, H - MB),
        text(ML, 14, title, 11, fill="#222", font_weight="600"),
    ]


def _scales(xmax: int, values: list[float]) -> tuple[Scale, Scale]:
    lo, hi = padded(values)
    return Scale(0, max(xmax, 1), ML, W - MR), Scale(lo, hi, H - MB, MT)


def smoothed(pts: list[tuple[int, float]], k: int) -> list[tuple[int, float]]:
    """A trailing mean over k points: per-step metrics of a few dozen rollouts are noisy, and a long run's curves
    are a few pixels a step."""
    if k <= 1:
        return pts
    vals = [v for _, v in pts]
    return [(s, sum(vals[max(0, i - k + 1) : i + 1]) / (i + 1 - max(0, i - k + 1))) for i, (s, _) in enumerate(pts)]


def metric_chart(
    name: str, series: dict[str, list[tuple[int, float]]], kinds: dict[str, str], path: list[str], rounds, xmax
) -> str:
    k = max(1, round(xmax / 120))
    on_path = [b for b in path if b in series]
    # The mainline as one line through its branches, so a reader follows the policy that went on; the arms over
    # it, each from its fork point.
    lines = {"mainline": smoothed([p for b in on_path for p in series[b]], k)}
    lines |= {b: smoothed(pts, k) for b, pts in sorted(series.items()) if b not in on_path}
    x, y = _scales(xmax, [v for pts in lines.values() for _, v in pts])
    title = METRICS.get(name, name) + (f", {k}-step mean" if k > 1 else "")
    out = _frame(title, x, y, rounds)
    for b, pts in lines.items():
        colour, width = (MAINLINE, 1.8) if b == "mainline" else (KIND_COLOURS.get(kinds.get(b, ""), "#999"), 1.3)
        out.append(polyline([(x(s), y(v)) for s, v in pts], colour, width, f"{b}: {name}", opacity="0.9"))
    return svg(W, H, out, f"{name} per branch by step")


def accuracy_chart(branches: list[dict[str, Any]], path: list[str], rounds: list[RoundShape], xmax: int) -> str:
    """Held-out accuracy on the gate tasks: a dot per evaluated branch at its last step, the mainline's joined."""
    pts = [b for b in branches if b["heldout_accuracy"] is not None]
    x, y = _scales(xmax, [b["heldout_accuracy"] for b in pts])
    out = _frame("held-out accuracy (gate tasks), each arm at its last step", x, y, rounds)
    main = sorted((b for b in pts if b["id"] in path), key=lambda b: b["last_step"])
    if len(main) > 1:
        out.append(polyline([(x(b["last_step"]), y(b["heldout_accuracy"])) for b in main], MAINLINE, 1.8))
    for b in pts:
        r = 4 if b["id"] in path else 3
        out.append(
            f'<a href="{round_href(b)}"><circle cx="{x(b["last_step"]):.1f}" cy="{y(b["heldout_accuracy"]):.1f}" '
            f'r="{r}" fill="{KIND_COLOURS.get(b["kind"], "#000")}" fill-opacity="0.85">'
            f"<title>{esc(b['id'])} ({esc(b['kind'])}): {b['heldout_accuracy']:.3f} at step {b['last_step']}"
            "</title></circle></a>"
        )
    return svg(W, H, out, "held-out accuracy per branch")


def curves_html(store: RolloutStore, branches: list[dict[str, Any]], rounds: list[RoundShape]) -> str:
    """Every chart, two to a row, with a line on what is absent and how to read the marks."""
    data = read_metrics(store)
    kinds = {b["id"]: b["kind"] for b in branches}
    path = mainline(rounds)
    xmax = max([b["last_step"] for b in branches] + [s for m in data.values() for p in m.values() for s, _ in p] + [1])
    charts = [accuracy_chart(branches, path, rounds, xmax)] if any(b["heldout_accuracy"] for b in branches) else []
    charts += [metric_chart(n, data[n], kinds, path, rounds, xmax) for n in METRICS if data.get(n)]
    absent = [n for n in METRICS if not data.get(n)]
    note = (
        "<p class=muted>Bold green: the mainline (the segments and the arm each round continued from); thin: the "
        "other arms (blue candidates, grey controls, light the replicates on fresh seeds, orange A-A arms). "
        "Vertical rules: each round's fork point, green where the round promoted, red where it rolled back. "
        "Hover a line or a rule for its branch or round."
        + (f" Not recorded in this run (or never finite): {esc(', '.join(absent))}." if absent else "")
        + "</p>"
    )
    return note + '<div class="charts">' + "".join(f"<div>{c}</div>" for c in charts) + "</div>"
