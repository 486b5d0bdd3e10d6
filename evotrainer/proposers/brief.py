"""Builds the Brief a proposer reads: findings with their evidence rollouts in full (plus a few rollouts
of the last step for context), step-metric trends, this run's trials and verdicts, and the skills whose
signature matches. Only training rollouts of the run go in; held-out rollouts and the evaluator's data
never do (check_isolation raises if they would)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from evotrainer.backtest.verdict import read_trials, read_verdicts
from evotrainer.diagnostics.detector import Finding
from evotrainer.harness.harness import Harness
from evotrainer.proposers.proposer import Brief, PastTrial, SkillMatch, signature
from evotrainer.store.files import sql_list
from evotrainer.store.ledger import Ledger
from evotrainer.store.rollouts import RolloutStore


class IsolationError(RuntimeError):
    """A brief that would show the proposer held-out or evaluator data: a bug, never a user mistake."""


TREND_METRICS = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/clipped_ratio",
    "entropy",
    "kl",
    "grad_norm",
    "audit/pass_rate",
    "tool_errors/mean",
    "turn_cap_ratio",
)


def evidence(store: RolloutStore, ids: list[str]) -> dict[str, dict[str, Any]]:
    """Full records of the cited training rollouts (turns, rewards per term, audit, termination)."""
    if not ids:
        return {}
    rows = store.query(f"split = 'train' AND id IN {sql_list(ids)}")
    out = {}
    for r in rows:
        r = dict(r)
        r["rewards"] = (
            {x["term"]: x["value"] for x in r["rewards"]} if isinstance(r.get("rewards"), list) else r.get("rewards")
        )
        if isinstance(r.get("info"), str):
            r["info"] = json.loads(r["info"])
        out[r["id"]] = r
    return out


def history(ledger: Ledger) -> list[PastTrial]:
    verdicts = {v.trial: v for v in read_verdicts(ledger)}
    branches = {b["id"]: b for b in ledger.branches()}

    @cache
    def control_findings(rnd: int) -> set[str]:  # a round's candidates share its control: one read a round
        return {f["name"] for f in (ledger.stage_result(rnd, "gate") or {}).get("control_findings", [])}

    out = []
    for t in read_trials(ledger):
        v = verdicts.get(t.id)
        ctrl, cand = branches.get(t.control, {}), branches.get(t.candidate, {})
        out.append(
            PastTrial(
                t.round,
                t.intervention,
                tuple(t.signature),
                v.decision if v else "abandoned",
                tuple(v.reasons) if v else (),
                v.statistic.delta if v else None,
                harness=ctrl.get("harness_version", ""),
                step=cand.get("first_step", 0),
                new_findings=_new_findings(v.findings, control_findings(t.round)) if v else (),
            )
        )
    return out


def _new_findings(findings: list[Finding], control: set[str]) -> tuple[Finding, ...]:
    """The candidate window's warning and critical findings that the round's control window did not carry."""
    return tuple(f for f in findings if f.severity != "info" and f.name not in control)


def samples(store: RolloutStore, branches: list[str], n: int) -> list[str]:
    """Ids of a few train rollouts of the branches' last step, best and worst reward alternately: raw
    context for a proposer when few findings cite evidence."""
    if n <= 0 or not branches:
        return []
    names = sql_list(branches)
    rows = store.sql(
        f"WITH last AS (SELECT * FROM rollouts WHERE split = 'train' AND branch IN {names} "
        f"AND step = (SELECT max(step) FROM rollouts WHERE split = 'train' AND branch IN {names})) "
        f"(SELECT id, 0 AS k FROM last ORDER BY reward DESC, id LIMIT {int(n)}) UNION ALL "
        f"(SELECT id, 1 AS k FROM last ORDER BY reward ASC, id LIMIT {int(n)})"
    )
    best, worst = [r["id"] for r in rows if r["k"] == 0], [r["id"] for r in rows if r["k"] == 1]
    out: list[str] = []
    for pair in zip(best, worst):
        out += [i for i in pair if i not in out]
    return out[:n]


def check_isolation(brief: Brief) -> None:
    """Raise IsolationError unless every evidence rollout is a training rollout and no metric is the
    evaluator's: what a proposer reads must hold no held-out task, hidden test or verdict input."""
    leaked = [i for i, r in brief.evidence.items() if r.get("split") != "train"]
    if leaked:
        raise IsolationError(f"brief for round {brief.round} holds non-training rollouts: {leaked[:5]}")
    bad = [m for m in brief.metrics if m.startswith(("heldout/", "eval/"))]
    if bad:
        raise IsolationError(f"brief for round {brief.round} holds evaluator metrics: {bad}")


def build_brief(
    *,
    run: str,
    rnd: int,
    domain: str,
    harness: Harness,
    findings: list[Finding],
    store: RolloutStore,
    branches: list[str],
    ledger: Ledger,
    skills: list[SkillMatch],
    limit: int,
    explore: float,
    step: int = 0,
    expiry: int = 0,
    losses: list[PastTrial] | None = None,
    per_finding: int = 3,
    context: int = 4,
) -> Brief:
    """`per_finding`: evidence rollouts kept per finding; `context`: extra samples of the last step; `losses`: other
    runs' rejections on this harness, from the skill library (the screen blocks them as it blocks the run's own)."""
    ids: list[str] = []
    for f in findings:
        ids += [i for i in f.evidence[:per_finding] if i not in ids]
    ids += [i for i in samples(store, branches, context) if i not in ids]
    metrics: dict[str, list[tuple[int, float]]] = {}
    for b in branches:
        for step, m in sorted(store.metrics(b).items()):
            for name in TREND_METRICS:
                if name in m:
                    metrics.setdefault(name, []).append((step, m[name]))
    found = evidence(store, ids)
    brief = Brief(
        run=run,
        round=rnd,
        domain=domain,
        harness=harness,
        findings=findings,
        signature=signature(findings),
        evidence={i: found[i] for i in ids if i in found},
        metrics=metrics,
        history=history(ledger),
        skills=skills,
        limit=limit,
        explore=explore,
        step=step,
        expiry=expiry,
        losses=list(losses or []),
    )
    check_isolation(brief)
    return brief
