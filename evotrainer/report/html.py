"""`evotrainer report RUN`: one self-contained HTML file (no scripts, no external assets) with the
lineage tree, the held-out metric per branch over time, the findings of each round linked to their
evidence rollouts (included at the end of the file), every verdict with its statistic, the budget by
stage, and the skills used and created. The chart is a hand-written inline SVG: a plotting library
would add a dependency (or JavaScript) for one line chart."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from evotrainer.backtest.verdict import (
    NoiseLine,
    OlderTest,
    RaceResult,
    Statistic,
    TwoStage,
    read_trials,
    read_verdicts,
)
from evotrainer.ids import branch_id
from evotrainer.stages.results import seconds_cut_note, stage_results
from evotrainer.stages.retention import disk_use
from evotrainer.store.checkpoints import human
from evotrainer.store.files import atomic_write_text, sql_list
from evotrainer.store.ledger import Ledger
from evotrainer.store.rollouts import RolloutStore

CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}\n"
    "table{border-collapse:collapse;margin:.5em 0}"
    "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px;vertical-align:top}\n"
    "th{background:#f3f3f3}.promote{color:#070;font-weight:bold}.reject{color:#a00;font-weight:bold}\n"
    "pre{background:#f7f7f7;padding:6px;white-space:pre-wrap;font-size:12px}ul.tree{list-style:none}\n"
    ".main{font-weight:bold}.muted{color:#777}code{font-size:12px}"
)


def _e(x: Any) -> str:
    return html.escape(str(x))


def _link(rid: str) -> str:
    return f'<a href="#r-{_e(rid)}"><code>{_e(rid)}</code></a>'


def _chart(branches: list[dict[str, Any]], heads: set[str]) -> str:
    pts = [(b["last_step"], b["heldout_accuracy"], b) for b in branches if b["heldout_accuracy"] is not None]
    if not pts:
        return "<p class=muted>no held-out evaluations yet</p>"
    w, h, pad = 720, 260, 40
    xmax = max(p[0] for p in pts) or 1
    ys = [p[1] for p in pts]
    ylo, yhi = max(0.0, min(ys) - 0.05), min(1.0, max(ys) + 0.05)

    def xy(x: float, y: float) -> tuple[float, float]:
        return pad + (w - 2 * pad) * x / xmax, h - pad - (h - 2 * pad) * (y - ylo) / max(yhi - ylo, 1e-9)

    out = [
        f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" style="border:1px solid #ddd">',
        f'<text x="{pad}" y="15" font-size="12">held-out accuracy (gate tasks) by branch, at its last step</text>',
    ]
    for frac in (0.0, 0.5, 1.0):
        y = ylo + frac * (yhi - ylo)
        _, py = xy(0, y)
        out.append(
            f'<text x="2" y="{py:.0f}" font-size="10">{y:.2f}</text>'
            f'<line x1="{pad}" x2="{w - pad}" y1="{py:.0f}" y2="{py:.0f}" stroke="#eee"/>'
        )
    main = sorted((p for p in pts if p[2]["id"] in heads), key=lambda p: p[0])
    if len(main) > 1:
        out.append(
            '<polyline fill="none" stroke="#070" stroke-width="2" points="'
            + " ".join("{:.0f},{:.0f}".format(*xy(x, y)) for x, y, _ in main)
            + '"/>'
        )
    colors = {"control": "#555", "candidate": "#06c", "aa": "#c80", "segment": "#070"}
    for x, y, b in pts:
        px, py = xy(x, y)
        out.append(
            f'<circle cx="{px:.0f}" cy="{py:.0f}" r="4" fill="{colors.get(b["kind"], "#000")}"><title>{_e(b["id"])}: '
            f"{y:.3f} ({_e(b['kind'])}, step {x})</title></circle>"
        )
    out.append(
        f'<text x="{w - pad}" y="{h - 8}" font-size="10" text-anchor="end">step (max {xmax}); '
        "green line: mainline heads; blue candidates, grey controls, orange A-A</text></svg>"
    )
    return "".join(out)


def _tree(branches: list[dict[str, Any]], heads: set[str]) -> str:
    children: dict[str | None, list[dict[str, Any]]] = {}
    for b in branches:
        children.setdefault(b["parent"], []).append(b)

    def node(b: dict[str, Any]) -> str:
        acc = f" acc {b['heldout_accuracy']:.3f}" if b["heldout_accuracy"] is not None else ""
        label = (
            f'<span class="{"main" if b["id"] in heads else ""}">{_e(b["id"])}</span> '
            f"<span class=muted>{_e(b['kind'])}, "
            f"steps {b['first_step']}-{b['last_step']}, harness {_e(b['harness_version'])}, "
            f"suite {_e(b['suite_version'])}{acc}</span>"
        )
        kids = children.get(b["id"], [])
        return "<li>" + label + (f'<ul class="tree">{"".join(node(k) for k in kids)}</ul>' if kids else "") + "</li>"

    return '<ul class="tree">' + "".join(node(b) for b in children.get(None, [])) + "</ul>"


def write_report(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    ledger = Ledger(run_dir / "ledger.sqlite")
    try:
        page = _page(run_dir, ledger, RolloutStore(run_dir / "store"))
    finally:
        ledger.close()
    return atomic_write_text(run_dir / "report.html", page)


def _page(run_dir: Path, ledger: Ledger, store: RolloutStore) -> str:
    results = stage_results(ledger.rows("SELECT round, stage, result FROM stages ORDER BY round, finished"))
    branches = ledger.branches()
    heads = {branch_id(0, "base")} | {r.head.branch for (_, st), r in results.items() if st == "promote"}
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    cited: list[str] = []
    parts = [
        f"<!doctype html><meta charset=utf-8><title>EvoTrainer run {_e(run_dir.name)}</title><style>{CSS}</style>",
        f"<h1>EvoTrainer run <code>{_e(run_dir.name)}</code></h1>",
    ]
    if libraries := ledger.skill_libraries():
        parts.append(
            "<p>Skill library (read and written by this run): "
            + ", ".join(f"<code>{_e(p)}</code>" for p in libraries)
            + ".</p>"
        )
    if summary:
        parts.append(
            f"<p>{summary['rounds']} round(s), stopped: {_e(summary['stop_reason'])}. "
            "Final-task accuracy (tasks no gate decision read) "
            f"<b>{summary['baseline_accuracy']:.3f} &rarr; {summary['final_accuracy']:.3f}</b>; "
            f"evaluator <code>{_e(summary['evaluator_hash'])}</code>; "
            f"final harness <code>{_e(summary['harness_version'])}</code>.</p>"
        )
        if summary.get("cut_by_seconds"):
            parts.append(f'<p class="reject">{_e(seconds_cut_note(summary["rounds"]))}.</p>')
        if "warm_start_seconds" in summary:
            parts.append(
                f"<p>Warm start (building or loading the starting policy; cached, outside the budget): "
                f"{summary['warm_start_seconds']:.0f} s.</p>"
            )
        if "discarded_step_share" in summary:
            parts.append(
                f"<p>Arms that ended discarded (race losers, confirmations, the control or winner the mainline did "
                f"not continue from): {summary['discarded_step_share']:.0%} of the training steps, "
                f"{summary['discarded_token_share']:.0%} of the arms' generated tokens.</p>"
            )
    disk = disk_use(ledger, run_dir)
    parts.append(
        f"<p>Disk: the run directory holds {human(disk.run_bytes)}, its checkpoints {human(disk.checkpoint_bytes)}; "
        f"pruning the weights of discarded arms (run.keep_checkpoints) freed {human(disk.pruned_bytes)}.</p>"
    )
    parts += _budget(ledger)
    parts += [
        "<h2>Lineage</h2>",
        _tree(branches, heads),
        "<h2>Held-out metric per branch</h2>",
        _chart(branches, heads),
    ]
    parts.append("<h2>Rounds</h2>")
    for rnd in sorted({r for r, _ in results if r > 0}):
        parts += _round(rnd, results, cited)
    parts += _verdicts(ledger, cited)
    transcripts = sorted((run_dir / "llm").glob("*.json")) if (run_dir / "llm").is_dir() else []
    if transcripts:
        parts.append(
            "<h2>LLM exchanges</h2><ul>"
            + "".join(f'<li><a href="llm/{_e(p.name)}">{_e(p.name)}</a></li>' for p in transcripts)
            + "</ul>"
        )
    parts += _evidence(store, cited)
    return "\n".join(parts)


def _budget(ledger: Ledger) -> list[str]:
    parts = [
        "<h2>Budget by stage</h2><table>"
        "<tr><th>stage</th><th>generated tokens</th><th>trained tokens</th><th>seconds</th></tr>"
    ]
    for st, c in sorted(ledger.spent_by_stage().items()):
        parts.append(
            f"<tr><td>{_e(st)}</td><td>{c.generated_tokens:,}</td><td>{c.trained_tokens:,}</td><td>{c.seconds:.1f}</td></tr>"
        )
    t = ledger.spent()
    parts.append(
        f"<tr><th>total</th><th>{t.generated_tokens:,}</th><th>{t.trained_tokens:,}</th><th>{t.seconds:.1f}</th></tr></table>"
    )
    return parts


def _round(rnd: int, results: dict[tuple[int, str], Any], cited: list[str]) -> list[str]:
    """One round: its findings (linked to their evidence), the suite revision, proposals, replay drops,
    a rejected control and the skills it touched."""
    diag = results.get((rnd, "diagnose"))
    rev = results.get((rnd, "revise"))
    found = (diag.findings if diag else []) + (rev.findings if rev else [])
    parts = [
        f"<h3>Round {rnd}</h3>",
        "<table><tr><th>finding</th><th>severity</th><th>validity</th><th>message</th><th>evidence</th><th>knobs</th></tr>",
    ]
    for f in found:
        cited += f.evidence[:3]
        parts.append(
            f"<tr><td>{_e(f.name)}</td><td>{_e(f.severity)}</td><td>{'yes' if f.validity else ''}</td>"
            f"<td>{_e(f.message)}</td><td>{' '.join(_link(i) for i in f.evidence[:3])}</td>"
            f"<td>{_e(', '.join(f.knobs))}</td></tr>"
        )
    parts.append("</table>" if found else "</table><p class=muted>no findings on the segment</p>")
    if rev:
        parts.append(
            f"<p>suite revision: {'accepted' if rev.accepted else 'none'}; induction: {_e(rev.induction['reason'])}"
            + (f"; refused for {len(rev.refused_for_flips)} verdict flip(s)" if rev.refused_for_flips else "")
            + "</p>"
        )
    if prop := results.get((rnd, "propose")):
        parts.append(
            "<p>proposals (signature <code>"
            + _e(", ".join(prop.signature) or "none")
            + "</code>): "
            + "; ".join(
                f"<code>{_e(p.key)}</code> [{_e(p.source)}{' ' + _e(p.skill_id) if p.skill_id else ''}]"
                for p in prop.proposals
            )
            + "</p>"
        )
        if prop.refused:
            parts.append(
                "<p class=muted>refused: "
                + "; ".join(f"{_e(r['proposal']['key'])}: {_e(r['reason'])}" for r in prop.refused)
                + "</p>"
            )
    if (rep := results.get((rnd, "replay"))) and rep.dropped:
        parts.append("<p class=muted>dropped by replay: " + "; ".join(_e(d.why) for d in rep.dropped) + "</p>")
    if (g := results.get((rnd, "gate"))) and g.control_rejected:
        rej = results[(rnd, "promote")].rejected if (rnd, "promote") in results else None
        parts.append(
            f"<p class=reject>control {branch_id(rnd, 'control')} (the harness unchanged) rejected: "
            f"{_e(', '.join(g.control_rejected))}; "
            + (
                f"the mainline rolled back to {_e(rej.rolled_back_to)}"
                if rej
                else "the mainline continues from the winner"
            )
            + "</p>"
        )
    if (rem := results.get((rnd, "remember"))) and rem.skills:
        parts.append(
            "<p>skills: "
            + "; ".join(
                f"{_e(s['skill'])} ({s['wins']} won, {s['losses']} lost{', quarantined' if s['quarantined'] else ''})"
                for s in rem.skills
            )
            + "</p>"
        )
    return parts


def _verdicts(ledger: Ledger, cited: list[str]) -> list[str]:
    trials = {t.id: t for t in read_trials(ledger)}
    parts = [
        "<h2>Verdicts</h2><table><tr><th>trial</th><th>intervention</th><th>hypothesis</th><th>decision</th><th>statistic</th>"
        "<th>noise (A-A)</th><th>reasons</th><th>validity findings</th><th>evidence</th><th>budget</th>"
        "<th>evaluator</th></tr>"
    ]
    for v in read_verdicts(ledger):
        tr = trials[v.trial]
        iv, s = tr.intervention, v.statistic
        ev = s.evidence
        cited += ev.candidate_won[:2] + ev.candidate_lost[:2]
        vf = [f for f in v.findings if f.validity]
        parts.append(
            f"<tr><td>{_e(v.trial)}<br><span class=muted>{_e(tr.source)}</span></td>"
            f"<td><code>{_e(iv.kind)} {_e(iv.target)}: "
            f"{_e(iv.before)} &rarr; {_e(iv.value)}</code></td><td>{_e(iv.hypothesis.finding)}: "
            f"{_e(iv.hypothesis.signal)} {_e(iv.hypothesis.direction)}</td>"
            f'<td class="{_e(v.decision)}">{_e(v.decision)}</td>'
            f"<td>{_statistic(s)}</td><td>{_noise(v.noise)}</td>"
            f"<td>{_e(', '.join(v.reasons) or '-')}</td>"
            "<td>"
            f"{'; '.join(_e(f.name) + ': ' + ' '.join(_link(i) for i in f.evidence[:2]) for f in vf) or '-'}"
            "</td>"
            f"<td>won: {' '.join(_link(i) for i in ev.candidate_won[:2])}<br>lost: "
            f"{' '.join(_link(i) for i in ev.candidate_lost[:2])}</td>"
            f"<td>{v.budget.candidate.generated_tokens:,} tok</td>"
            f"<td><code>{_e(v.evaluator_hash)}</code></td></tr>"
        )
        cited += [i for f in vf for i in f.evidence[:2]]
    parts.append("</table>")
    return parts


def _statistic(s: Statistic) -> str:
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


def _noise(n: NoiseLine) -> str:
    if n.phi is not None:
        return f"phi {n.phi:.2f} ({n.pairs_used} pair(s))" if n.valid else "no A-A pair"
    return f"{n.abs_delta or 0:.3f}"


def _evidence(store: RolloutStore, cited: list[str]) -> list[str]:
    """Every cited rollout in full, as the target of the links above."""
    parts = ["<h2>Evidence rollouts</h2>"]
    ids = list(dict.fromkeys(cited))
    for r in store.query(f"id IN {sql_list(ids)}") if ids else []:
        turns = "".join(
            f"<b>action</b> {_e(t['action'])}\n"
            + (f"<b>observation</b> {_e(t['observation'])}\n" if t["observation"] else "")
            for t in r["turns"]
        )
        rw = r["rewards"] if isinstance(r["rewards"], dict) else {x["term"]: x["value"] for x in r["rewards"]}
        rewards = ", ".join(f"{k}={v:.2f}" for k, v in rw.items())
        parts.append(
            f'<div id="r-{_e(r["id"])}"><h4><code>{_e(r["id"])}</code> <span class=muted>{_e(r["split"])}, task '
            f"{_e(r['task_id'])}, termination {_e(r['termination'])}, reward {r['reward']:.3f} ({_e(rewards)}), audit "
            f"{_e(r['audit'])}</span></h4><pre>{_e(r['prompt'])}\n{turns}</pre></div>"
        )
    return parts
