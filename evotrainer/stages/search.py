"""Stages 4-5, the search: propose single-factor interventions from the findings and the skill library,
then replay them on the segment's rollouts and drop those that change nothing or worsen the audit AUC."""

from __future__ import annotations

from evotrainer.backtest.replay import load_columns, replay
from evotrainer.diagnostics.detector import Finding
from evotrainer.diagnostics.revision import admit
from evotrainer.diagnostics.suite import Suite
from evotrainer.envs.domains import variants_of
from evotrainer.harness.harness import Harness
from evotrainer.proposers.brief import build_brief
from evotrainer.proposers.hedges import hedge
from evotrainer.proposers.proposer import (
    Brief,
    PastTrial,
    Proposal,
    Refusal,
    intervention_key,
    screen,
    signature,
)
from evotrainer.skills.library import model_name
from evotrainer.stages.context import RunContext, StageRecords
from evotrainer.stages.evidence import past_verdicts
from evotrainer.stages.results import ProposalRecord, ProposeResult, ReplayDecision, ReplayResult
from evotrainer.store.files import sql_str
from evotrainer.training.trl_backend import unhonoured

# A replay that lowers the reward-audit AUC by more than this drops the proposal before its trial.
AUC_DROP = 0.02


def record(p: Proposal) -> ProposalRecord:
    return ProposalRecord(
        intervention=p.intervention,
        source=p.source,
        skill_id=p.skill_id,
        note=p.note,
        key=intervention_key(p.intervention),
    )


def propose(
    ctx: RunContext,
    rnd: int,
    harness: Harness,
    suite: Suite,
    findings: list[Finding],
    seg_branch: str,
    seg_window: tuple[int, int],
) -> tuple[ProposeResult, StageRecords]:
    """Whoever proposed, the same screen applies; detectors a proposer wrote join the suite only after
    the same validation and backtest against past verdicts as induced ones."""
    cfg = ctx.cfg
    sig = signature(findings)
    brief = build_brief(
        run=cfg.run.name,
        rnd=rnd,
        domain=cfg.env.domain,
        harness=harness,
        findings=findings,
        store=ctx.store,
        branches=[seg_branch],
        ledger=ctx.ledger,
        skills=ctx.skills.match(sig, cfg.env.domain, harness, model_name(cfg.policy), variants_of(cfg.env.domain)),
        limit=cfg.loop.candidates,
        explore=cfg.loop.explore,
        step=seg_window[1],
        expiry=cfg.loop.reject_expiry_steps,
        losses=library_losses(ctx, harness),
    )
    out = ctx.proposer.propose(brief)
    planted = [Proposal(iv, "planted", note="loop.planted") for iv in cfg.loop.planted[rnd - 1 : rnd]]
    kept, refused = screen(planted + list(out.proposals) + list(out.spares), brief)
    if cfg.train.backend == "trl":  # an arm under a harness TRL cannot honour would stop the run
        why = {id(p): unhonoured(p.intervention.apply(harness)) for p in kept}
        refused += [Refusal(p, f"train.backend trl does not honour:{why[id(p)]}") for p in kept if why[id(p)]]
        kept = [p for p in kept if not why[id(p)]]
    n = cfg.loop.candidates
    proposals, spares, no = _hedged(kept[:n], kept[n : 2 * n], brief, findings, harness, cfg.loop.hedge_step)
    refused += no
    new_suite, admitted = suite, []
    if out.detectors:
        new_suite, admitted = admit(
            suite, ctx.store, out.detectors, seg_branch, *seg_window, past_verdicts(ctx.ledger)
        )
    return ProposeResult(
        signature=list(sig),
        proposals=[record(p) for p in proposals],
        spares=[record(p) for p in spares] or None,
        refused=[{"proposal": record(r.proposal).model_dump(mode="json"), "reason": r.reason} for r in refused],
        skills_matched=[m.skill_id for m in brief.skills],
        suite=new_suite,
        detectors=admitted,
    ), StageRecords(charges=out.charges)


def library_losses(ctx: RunContext, harness: Harness) -> list[PastTrial]:
    """Other runs' rejected trials on this harness version, in this domain and model, as the screen reads a past
    trial (a loss without the step it forked from cannot be placed, and blocks nothing)."""
    cfg = ctx.cfg
    found = ctx.skills.losses_in(cfg.env.domain, model_name(cfg.policy), harness.version, besides=ctx.skills.run)
    return [
        PastTrial(0, iv, tuple(e.signature), "reject", (f"{e.run}/{e.trial}",), e.effect, e.harness, e.step, run=e.run)
        for iv, e in found
        if e.step is not None
    ]


def _hedged(
    proposals: list[Proposal],
    spares: list[Proposal],
    brief: Brief,
    findings: list[Finding],
    harness: Harness,
    step: float,
) -> tuple[list[Proposal], list[Proposal], list[Refusal]]:
    """The round's proposals with the hedge of its first remedy for an exploit (hedges.py) after them, one more
    candidate, unless the same change is among them or the screen refuses it (rejected under this signature); the
    spares without it; the screen's refusal, if any."""
    h = hedge(proposals, findings, harness, step)
    if h is None:
        return proposals, spares, []
    bound, refused = screen([h], brief)
    if not bound:
        return proposals, spares, refused
    key = intervention_key(bound[0].intervention)
    if key in {intervention_key(p.intervention) for p in proposals}:
        return proposals, spares, []
    return proposals + bound, [p for p in spares if intervention_key(p.intervention) != key], []


def replay_stage(
    ctx: RunContext,
    harness: Harness,
    proposals: list[Proposal],
    findings: list[Finding],
    seg_branch: str,
    want: int,
) -> tuple[ReplayResult, StageRecords]:
    """Re-score the segment's rollouts under each replayable proposal (rewards, shaping, filters,
    estimator); the rest need a trial and go on. `proposals` are the round's (`want` of them), then its spares:
    once `want` go on, the spares left are not needed. A hedge (hedges.py) goes where its remedy goes: its
    learning rate needs a trial, but a remedy the replay drops is no remedy at any step."""
    kept, dropped, gone = [], [], set()
    terms = list(harness.reward_weights) + [t for t in ctx.domain.reward_terms if t not in harness.reward_weights]
    cols = load_columns(ctx.store, terms, where=f"split = 'train' AND branch = {sql_str(seg_branch)}")
    flagged = {i for f in findings for i in f.evidence}
    for i, p in enumerate(proposals):
        if len(kept) == want:
            break
        if p.source == "hedge" and intervention_key(p.intervention.model_copy(update={"paired": None})) in gone:
            dropped.append(ReplayDecision(index=i, replay=None, why="its remedy was dropped by the replay"))
            continue
        if not p.intervention.replayable:
            kept.append(ReplayDecision(index=i, replay=None, why="needs a trial (not replayable)"))
            continue
        rep = replay(harness, p.intervention, cols, flagged)
        why = (
            "no effect on advantages or masks"
            if not rep.has_effect
            else "worse reward-audit agreement"
            if rep.reward_audit_auc_after < rep.reward_audit_auc_before - AUC_DROP
            else ""
        )
        (dropped if why else kept).append(
            ReplayDecision(index=i, replay=rep.to_dict(), why=why or "replay shows an effect")
        )
        if why:
            gone.add(intervention_key(p.intervention))
    return ReplayResult(kept=kept, dropped=dropped), StageRecords()
