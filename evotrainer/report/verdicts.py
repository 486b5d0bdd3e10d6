"""Verdicts in the report: a picture of every arm's effect on the gate tasks with its interval under the run's noise
model, beside the spread that seed noise alone gives (the A-A pairs, and a band of the same width around zero),
then the table of every verdict with its statistic (the table's markup is what older reports held: tests compare
it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from scipy import stats

from evotrainer.backtest.verdict import (
    NoiseLine,
    NoiseTest,
    OlderTest,
    RaceResult,
    SignHolm,
    Statistic,
    TrialRecord,
    TwoStage,
    VerdictRecord,
)
from evotrainer.harness.interventions import Intervention
from evotrainer.report.evidence import link
from evotrainer.report.svg import PROMOTE, REJECT, Scale, esc, line, num, svg, text, ticks

_e = esc


@dataclass(frozen=True)
class Effect:
    """One row of the picture: an effect (accuracy difference on the gate tasks) and the half-width of its
    interval under the noise model (None where the record holds no counts to compute it from)."""

    label: str
    outcome: str
    tip: str
    delta: float
    half: float | None
    colour: str
    round: int


def half_width(wins: int, losses: int, n: int, phi: float, dof: float | None, level: float) -> float:
    """The noise model's interval half-width for (wins - losses) / n: var(wins - losses) = phi * discordant
    (backtest/statistics.py), the t reference's quantile at the gate's one-sided level, so the interval's lower
    end is the gate's one-sided bound."""
    m = max(wins + losses, 1)
    q = stats.t.ppf(level, dof) if dof else stats.norm.ppf(level)
    return float(q * math.sqrt(phi * m) / max(n, 1))


def _counts(s: Statistic) -> tuple[int, int, int] | None:
    if isinstance(s, TwoStage):
        return s.stage2.wins, s.stage2.losses, s.stage2.n
    if isinstance(s, SignHolm | RaceResult):
        return s.wins, s.losses, s.n
    extra = s.model_extra or {}
    if isinstance(s, OlderTest) and {"wins", "losses"} <= extra.keys() and s.n:
        return int(extra["wins"]), int(extra["losses"]), s.n
    return None


def _short(iv: Intervention) -> str:
    return f"{iv.target.split('.')[-1]} {iv.before} → {iv.value}"


def effect(v: VerdictRecord, tr: TrialRecord | None) -> Effect:
    s = v.statistic
    phi = s.phi if isinstance(s, NoiseTest) else (v.noise.phi or 1.0)
    dof = s.dof if isinstance(s, NoiseTest) else v.noise.dof
    c = _counts(s)
    half = half_width(*c, phi, dof, s.level) if c else None
    what = " + ".join(_short(iv) for iv in tr.intervention.parts) if tr else ""
    tip = f"{v.trial} {what}: {v.decision}, delta {s.delta:+.3f}" + (
        f", interval {s.delta - half:+.3f} .. {s.delta + half:+.3f} (phi {phi:.2f})" if half is not None else ""
    )
    if v.reasons:
        tip += f"; {', '.join(v.reasons)}"
    outcome = f"{v.decision} {s.delta:+.3f}" + (f" ({', '.join(v.reasons)})" if v.reasons else "")
    return Effect(
        f"{v.trial} {what}", outcome, tip, s.delta, half, PROMOTE if v.decision == "promote" else REJECT, v.round
    )


def noise_effects(pairs: list[Any]) -> list[Effect]:
    """The A-A pairs (two runs of one harness on other seeds): what seed noise alone does to the difference."""
    out = []
    for p in pairs:
        d = (p.wins - p.losses) / max(p.n, 1)
        half = half_width(p.wins, p.losses, p.n, 1.0, None, 0.95)
        tip = f"A-A pair {' vs '.join(p.arms)} (harness {p.harness}): {d:+.3f} ({p.wins} won, {p.losses} lost)"
        out.append(Effect(f"A-A {' vs '.join(p.arms)}", f"seed noise {d:+.3f}", tip, d, half, "#888", p.round))
    return out


def clip(s: str, n: int) -> str:
    """s cut to n characters, an ellipsis saying so (the row's tooltip has the whole)."""
    return s if len(s) <= n else s[: n - 1] + "…"


LABEL, PLOT, RIGHT, ROW = 300, 520, 280, 19


def forest(effects: list[Effect], noise: list[Effect]) -> str:
    """One row per A-A pair (grey), then one per verdict: the effect as a dot, its interval as a bar, and behind
    it a band around zero as wide as that interval (what noise alone spreads to at that comparison's size)."""
    rows = noise + effects
    reach = max([abs(e.delta) + (e.half or 0) for e in rows] + [0.05])
    x = Scale(-reach * 1.05, reach * 1.05, LABEL + 10, LABEL + PLOT - 10)
    height = 30 + ROW * len(rows) + 26
    out = [
        text(
            LABEL + PLOT / 2,
            12,
            "effect on gate-task accuracy (arm minus the arm it was tested against)",
            10,
            "middle",
            fill="#333",
        )
    ]
    for v in ticks(x.lo, x.hi, 6):
        out.append(line(x(v), 20, x(v), height - 24, "#eee"))
        out.append(text(x(v), height - 12, num(v), 9, "middle", fill="#555"))
    out.append(line(x(0), 20, x(0), height - 24, "#999", 1))
    for i, e in enumerate(rows):
        y = 30 + ROW * i
        if i == len(noise) and noise:
            out.append(line(4, y - ROW / 2, LABEL + PLOT + RIGHT, y - ROW / 2, "#ccc", 1, stroke_dasharray="4,3"))
        out.append(
            f'<a href="#round-{e.round}">' + text(LABEL, y + 3.5, clip(e.label, 52), 10, "end", fill="#222") + "</a>"
        )
        out.append(text(LABEL + PLOT + 4, y + 3.5, clip(e.outcome, 50), 10, fill=e.colour))
        body = [f"<title>{esc(e.tip)}</title>"]
        if e.half is not None:
            body.append(
                f'<rect x="{x(-e.half):.1f}" y="{y - 6}" width="{x(e.half) - x(-e.half):.1f}" height="12" '
                'fill="#000" fill-opacity="0.07"/>'
            )
            body.append(line(x(e.delta - e.half), y, x(e.delta + e.half), y, e.colour, 2))
        body.append(f'<circle cx="{x(e.delta):.1f}" cy="{y}" r="4" fill="{e.colour}"/>')
        out.append("<g>" + "".join(body) + "</g>")
    return svg(LABEL + PLOT + RIGHT, height, out, "verdicts: each arm's effect with its interval against the noise")


def forest_html(verdicts: list[VerdictRecord], trials: dict[str, TrialRecord], pairs: list[Any]) -> list[str]:
    if not verdicts:
        return ["<p class=muted>no verdicts yet</p>"]
    effects = [effect(v, trials.get(v.trial)) for v in verdicts]
    return [
        "<p class=muted>Each row an arm the gate decided (green promoted, red rejected): the dot is its effect on "
        "the gate tasks, the bar its interval under the run's noise model (phi from the A-A pairs; the bar's left "
        "end is the gate's one-sided bound), the grey band behind it the interval noise alone would give a "
        "comparison of that size. Grey rows above the dashed line: the A-A pairs themselves, two runs of one "
        "harness on other seeds. Hover a row for its figures; click its label for its round.</p>",
        '<div class="effects">' + forest(effects, noise_effects(pairs)) + "</div>",
    ]


def verdicts_table(verdicts: list[VerdictRecord], trials: dict[str, TrialRecord], cited: list[str]) -> list[str]:
    parts = [
        "<h2>Verdicts</h2><table><tr><th>trial</th><th>intervention</th><th>hypothesis</th><th>decision</th><th>statistic</th>"
        "<th>noise (A-A)</th><th>reasons</th><th>validity findings</th><th>evidence</th><th>budget</th>"
        "<th>evaluator</th></tr>"
    ]
    for v in verdicts:
        tr = trials[v.trial]
        iv, s = tr.intervention, v.statistic
        ev = s.evidence
        cited += ev.candidate_won[:2] + ev.candidate_lost[:2]
        vf = [f for f in v.findings if f.validity]
        parts.append(
            f"<tr><td>{_e(v.trial)}<br><span class=muted>{_e(tr.source)}</span></td>"
            "<td>"
            + " + ".join(
                f"<code>{_e(p.kind)} {_e(p.target)}: {_e(p.before)} &rarr; {_e(p.value)}</code>" for p in iv.parts
            )
            + f"</td><td>{_e(iv.hypothesis.finding)}: "
            f"{_e(iv.hypothesis.signal)} {_e(iv.hypothesis.direction)}</td>"
            f'<td class="{_e(v.decision)}">{_e(v.decision)}</td>'
            f"<td>{statistic(s)}</td><td>{noise_line(v.noise)}</td>"
            f"<td>{_e(', '.join(v.reasons) or '-')}</td>"
            "<td>"
            f"{'; '.join(_e(f.name) + ': ' + ' '.join(link(i) for i in f.evidence[:2]) for f in vf) or '-'}"
            "</td>"
            f"<td>won: {' '.join(link(i) for i in ev.candidate_won[:2])}<br>lost: "
            f"{' '.join(link(i) for i in ev.candidate_lost[:2])}</td>"
            f"<td>{v.budget.candidate.generated_tokens:,} tok</td>"
            f"<td><code>{_e(v.evaluator_hash)}</code></td></tr>"
        )
        cited += [i for f in vf for i in f.evidence[:2]]
    parts.append("</table>")
    return parts


def statistic(s: Statistic) -> str:
    """A verdict's statistic in a line: the two-stage test, a race's comparison, or an older run's test."""
    acc = f"cand {s.candidate_accuracy:.3f} vs ctrl {s.control_accuracy:.3f}"
    if isinstance(s, TwoStage):
        st1, st2 = s.stage1, s.stage2
        return (
            f"two-stage p {s.p:.4f} (K={s.candidates}): race {st1.delta:+.3f} ({st1.wins} won, "
            f"{st1.losses} lost, adjusted p {st1.p_adjusted:.3f}), confirmed {st2.delta:+.3f} "
            f"({st2.wins} won, {st2.losses} lost, p {st2.p:.3f}); {acc}"
        )
    if isinstance(s, RaceResult):
        why = s.stopped or s.not_confirmed or ""
        return f"race delta {s.delta:+.3f} ({s.wins} won, {s.losses} lost): {_e(why)}; {acc}"
    lower = s.lower if isinstance(s, OlderTest) else None
    bound = f", lower {lower:+.3f}" if lower is not None else f", p {1 if s.p is None else s.p:.3f}"
    return f"{_e(s.test)} delta {s.delta:+.3f}{bound}; {acc} on {'?' if s.n is None else s.n} tasks"


def noise_line(n: NoiseLine) -> str:
    if n.phi is not None:
        return f"phi {n.phi:.2f} ({n.pairs_used} pair(s))" if n.valid else "no A-A pair"
    return f"{n.abs_delta or 0:.3f}"
