"""`evotrainer report RUN`: one self-contained HTML file (no scripts, no external assets; it works offline) that a
reader opens first: the run in a paragraph, the lineage as a tree (report/lineage.py), training curves per branch
(report/curves.py), every verdict's effect against the noise (report/verdicts.py), the budget, each round's
findings with their evidence rollouts' text a click away (report/evidence.py), the verdicts' table, the skills."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evotrainer.backtest.verdict import read_trials, read_verdicts
from evotrainer.ids import branch_id
from evotrainer.report.curves import curves_html
from evotrainer.report.evidence import evidence_section, link, opened, read_rollouts
from evotrainer.report.lineage import RoundShape, lineage_svg, shapes
from evotrainer.report.svg import esc
from evotrainer.report.verdicts import forest_html, verdicts_table
from evotrainer.stages.results import past_budget_note, seconds_cut_note, skill_note, stage_results
from evotrainer.stages.retention import disk_use
from evotrainer.store.checkpoints import human
from evotrainer.store.files import atomic_write_text
from evotrainer.store.ledger import Ledger
from evotrainer.store.rollouts import RolloutStore

CSS = (
    "body{font-family:system-ui,sans-serif;margin:1.5em 2em;max-width:1160px;color:#222}\n"
    "table{border-collapse:collapse;margin:.5em 0}"
    "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px;vertical-align:top}\n"
    "th{background:#f3f3f3}.promote{color:#070;font-weight:bold}.reject{color:#a00;font-weight:bold}\n"
    "pre{background:#f7f7f7;padding:6px;white-space:pre-wrap;font-size:12px;margin:2px 0 6px}\n"
    ".main{font-weight:bold}.muted{color:#777}code{font-size:12px}p.muted{font-size:13px}\n"
    ".lineage{overflow-x:auto;border:1px solid #ddd;padding:4px}"
    ".charts{display:flex;flex-wrap:wrap;gap:6px 16px}.charts svg{border:1px solid #eee}\n"
    "nav a{margin-right:1em}details summary{cursor:pointer;color:#06c;font-size:12px}.ev{margin:4px 0}\n"
    "h2{margin-top:1.4em;border-bottom:1px solid #ddd}"
)
SECTIONS = [
    ("lineage", "Lineage"),
    ("curves", "Training curves"),
    ("effects", "Verdicts at a glance"),
    ("budget", "Budget"),
    ("rounds", "Rounds"),
    ("verdicts", "Verdicts"),
    ("evidence", "Evidence rollouts"),
]
_e = esc


def write_report(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    ledger = Ledger(run_dir / "ledger.sqlite")
    try:
        page = _page(run_dir, ledger, RolloutStore(run_dir / "store"))
    finally:
        ledger.close()
    return atomic_write_text(run_dir / "report.html", page)


def _summary(run_dir: Path, ledger: Ledger) -> list[str]:
    """The run in a few sentences: how it ended, the accuracy it reached, where its spend and disk went."""
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    parts = []
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
            f"promoted {_e(', '.join(summary.get('promoted', [])) or 'nothing')}, "
            f"{len(summary.get('rejected', []))} rejected; "
            f"evaluator <code>{_e(summary['evaluator_hash'])}</code>; "
            f"final harness <code>{_e(summary['harness_version'])}</code>.</p>"
        )
        if summary.get("ended_on_best"):
            parts.append(f"<p>Ended on the best read: {_e(summary['ended_on_best'])}.</p>")
        if summary.get("cut_by_seconds"):
            parts.append(f'<p class="reject">{_e(seconds_cut_note(summary["rounds"]))}.</p>')
        for cap, over in (summary.get("past_budget") or {}).items():
            parts.append(f"<p>{_e(past_budget_note(cap, summary['spent'][cap], over))}.</p>")
        if summary.get("adopted"):
            parts.append(
                "<p>Started under skills adopted from the library without a trial (loop.adopt_skills; each won or "
                "repaired in this domain, model and harness before; no gain claimed): "
                + "; ".join(_e(a) for a in summary["adopted"])
                + ".</p>"
            )
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
    return parts


def _cited_ids(results: dict[tuple[int, str], Any], verdicts: list[Any]) -> list[str]:
    """Every rollout id the page cites: findings' first three, verdicts' disagreements and validity evidence."""
    ids = [
        i for (_, st), r in results.items() if st in ("diagnose", "revise") for f in r.findings for i in f.evidence[:3]
    ]
    for v in verdicts:
        ev = v.statistic.evidence
        ids += ev.candidate_won[:2] + ev.candidate_lost[:2]
        ids += [i for f in v.findings if f.validity for i in f.evidence[:2]]
    return ids


def _page(run_dir: Path, ledger: Ledger, store: RolloutStore) -> str:
    results = stage_results(ledger.rows("SELECT round, stage, result FROM stages ORDER BY round, finished"))
    branches = ledger.branches()
    rounds = shapes(branches, results)
    verdicts, trials = read_verdicts(ledger), {t.id: t for t in read_trials(ledger)}
    decision = {trials[v.trial].candidate: v.decision for v in verdicts if v.trial in trials}
    decision |= {
        branch_id(r, "control"): "reject" for (r, st), g in results.items() if st == "gate" and g.control_rejected
    }
    gates = [r for (_, st), r in sorted(results.items()) if st == "gate"]
    rollouts = read_rollouts(store, _cited_ids(results, verdicts))
    cited: list[str] = []
    parts = [
        f"<!doctype html><meta charset=utf-8><title>EvoTrainer run {_e(run_dir.name)}</title><style>{CSS}</style>",
        f"<h1>EvoTrainer run <code>{_e(run_dir.name)}</code></h1>",
        "<nav>" + "".join(f'<a href="#{k}">{v}</a>' for k, v in SECTIONS) + "</nav>",
        *_summary(run_dir, ledger),
        '<h2 id="lineage">Lineage</h2>',
        "<p class=muted>The mainline runs left to right, one column a round: its segment, then the arm training "
        "continued from (held-out accuracy above it). Below each fork, the round's other arms. Hover a mark for the "
        "branch's steps, harness and suite; click it for its round.</p>",
        '<div class="lineage">'
        + lineage_svg(rounds, next((b for b in branches if b["kind"] == "base"), None), decision)
        + "</div>",
        '<h2 id="curves">Training curves</h2>',
        curves_html(store, branches, rounds),
        '<h2 id="effects">Verdicts at a glance</h2>',
        *forest_html(verdicts, trials, gates[-1].noise.pairs if gates else []),
        '<h2 id="budget">Budget by stage</h2>',
        *_budget(ledger),
        '<h2 id="rounds">Rounds</h2>',
    ]
    by_round = {s.round: s for s in rounds}
    for rnd in sorted({r for r, _ in results if r > 0} | set(by_round)):
        parts += _round(rnd, results, by_round.get(rnd), decision, rollouts, cited)
    parts.append('<div id="verdicts"></div>')
    parts += verdicts_table(verdicts, trials, cited)
    transcripts = sorted((run_dir / "llm").glob("*.json")) if (run_dir / "llm").is_dir() else []
    if transcripts:
        parts.append(
            "<h2>LLM exchanges</h2><ul>"
            + "".join(f'<li><a href="llm/{_e(p.name)}">{_e(p.name)}</a></li>' for p in transcripts)
            + "</ul>"
        )
    parts += evidence_section(rollouts, cited)
    return "\n".join(parts)


def _budget(ledger: Ledger) -> list[str]:
    parts = ["<table><tr><th>stage</th><th>generated tokens</th><th>trained tokens</th><th>seconds</th></tr>"]
    for st, c in sorted(ledger.spent_by_stage().items()):
        parts.append(
            f"<tr><td>{_e(st)}</td><td>{c.generated_tokens:,}</td><td>{c.trained_tokens:,}</td><td>{c.seconds:.1f}</td></tr>"
        )
    t = ledger.spent()
    parts.append(
        f"<tr><th>total</th><th>{t.generated_tokens:,}</th><th>{t.trained_tokens:,}</th><th>{t.seconds:.1f}</th></tr></table>"
    )
    return parts


def _branches(shape: RoundShape | None, decision: dict[str, str]) -> str:
    """The round's branches: what each trained, from where, under which harness, and how it ended."""
    if shape is None:
        return ""
    rows = ([shape.segment] if shape.segment else []) + shape.arms
    out = [
        "<table><tr><th>branch</th><th>kind</th><th>from</th><th>steps</th><th>harness</th><th>suite</th>"
        "<th>held-out</th><th>outcome</th></tr>"
    ]
    for b in rows:
        acc = "" if b["heldout_accuracy"] is None else f"{b['heldout_accuracy']:.3f}"
        outcome = decision.get(b["id"], "")
        if b["id"] == shape.head:
            outcome = (outcome + "; " if outcome else "") + "the mainline continues from it"
        out.append(
            f'<tr><td class="{"main" if b["id"] == shape.head else ""}">{_e(b["id"])}</td><td>{_e(b["kind"])}</td>'
            f"<td>{_e(b['parent'])}</td><td>{b['first_step']}-{b['last_step']}</td>"
            f"<td><code>{_e(b['harness_version'])}</code></td><td><code>{_e(b['suite_version'])}</code></td>"
            f'<td>{acc}</td><td class="{_e(decision.get(b["id"], ""))}">{_e(outcome)}</td></tr>'
        )
    return "".join(out) + "</table>"


def _dropped(rep: Any, prop: Any) -> list[str]:
    """What the replay dropped, and the spare proposals replayed in their place."""
    out = ["<p class=muted>dropped by replay: " + "; ".join(_e(d.why) for d in rep.dropped) + "</p>"]
    if prop and (spare := [k for k in rep.kept if k.index >= len(prop.proposals)]):
        pool = prop.proposals + (prop.spares or [])
        out.append(
            "<p class=muted>in its place, the spare: "
            + "; ".join(_e(pool[k.index].intervention.describe()) for k in spare)
            + "</p>"
        )
    return out


def _round(
    rnd: int,
    results: dict[tuple[int, str], Any],
    shape: RoundShape | None,
    decision: dict[str, str],
    rollouts: dict[str, dict[str, Any]],
    cited: list[str],
) -> list[str]:
    """One round: its branches, its findings (their evidence rollouts a click away), the suite revision,
    proposals, replay drops, a rejected control and the skills it touched."""
    diag = results.get((rnd, "diagnose"))
    rev = results.get((rnd, "revise"))
    found = (diag.findings if diag else []) + (rev.findings if rev else [])
    parts = [f'<h3 id="round-{rnd}">Round {rnd}</h3>', _branches(shape, decision)]
    if found:
        parts.append(
            "<table><tr><th>finding</th><th>severity</th><th>validity</th><th>message</th><th>evidence</th>"
            "<th>knobs</th></tr>"
        )
    for f in found:
        cited += f.evidence[:3]
        text = opened(list(f.evidence[:3]), rollouts, f.name)
        parts.append(
            f"<tr><td>{_e(f.name)}</td><td>{_e(f.severity)}</td><td>{'yes' if f.validity else ''}</td>"
            f"<td>{_e(f.message)}</td><td>{' '.join(link(i) for i in f.evidence[:3])}</td>"
            f"<td>{_e(', '.join(f.knobs))}</td></tr>" + (f"<tr><td colspan=6>{text}</td></tr>" if text else "")
        )
    parts.append("</table>" if found else "<p class=muted>no findings on the segment</p>")
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
        parts += _dropped(rep, prop)
    if (g := results.get((rnd, "gate"))) and g.control_rejected:
        rej = results[(rnd, "promote")].rejected if (rnd, "promote") in results else None
        fix = results[(rnd, "promote")].repaired if (rnd, "promote") in results else None
        parts.append(
            f"<p class=reject>control {branch_id(rnd, 'control')} (the harness unchanged) rejected: "
            f"{_e(', '.join(g.control_rejected))}; "
            + (
                f"the mainline rolled back to {_e(rej.rolled_back_to)}"
                if rej
                else f"repaired: the mainline takes {_e(fix.trial)}'s harness {_e(fix.harness)} (valid on every run, "
                f"not below the start; no gain claimed) and continues from {_e(fix.continues_from)}"
                if fix
                else "the mainline continues from the winner"
            )
            + "</p>"
        )
    rej = results[(rnd, "promote")].rejected if (rnd, "promote") in results else None
    if rej is not None and (r := rej.regression) is not None:
        parts.append(
            f"<p class=reject>regression guard: {_e(rej.branch)} read {r.head_accuracy:.3f} on the gate tasks against "
            f"{r.start_accuracy:.3f} where the round started ({r.wins} won, {r.losses} lost, p {r.p:.3g} under phi "
            f"{r.phi:.2f}); the mainline rolled back to {_e(rej.rolled_back_to)}</p>"
        )
    return parts + _skills(results.get((rnd, "remember"))) + _guarded(results.get((rnd, "guard")))


def _guarded(g: Any) -> list[str]:
    """The guard stage's rollback, where it sent the mainline back to its best read."""
    if g is None or (back := g.rollback) is None or (r := back.regression) is None:
        return []
    return [
        f"<p class=reject>guard: {_e(back.branch)} read {r.head_accuracy:.3f} on the gate tasks against the "
        f"mainline's best, {r.start_accuracy:.3f} at {_e(back.rolled_back_to)} ({r.wins} won, {r.losses} lost, p "
        f"{r.p:.3g} under phi {r.phi:.2f}): a decline; the mainline went back there</p>"
    ]


def _skills(rem: Any) -> list[str]:
    """The skills a round's verdicts touched."""
    if not (rem and rem.skills):
        return []
    return ["<p>skills: " + "; ".join(_e(skill_note(s)) for s in rem.skills) + "</p>"]
