"""Stages 6-9, the decision: trial the candidates against a control (and, when due, an A-A control) from
the same checkpoint; gate each on the evaluator's held-out outcomes and the validity evidence; move
the mainline to the winner (or the control, or back where the round started); remember every verdict
as evidence for a skill. The rules that keep invalid branches out are pure functions in backtest/gate.py."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from evotrainer.backtest import gate
from evotrainer.backtest.trial import ArmResult
from evotrainer.diagnostics.detector import Finding
from evotrainer.diagnostics.suite import Suite
from evotrainer.harness.harness import save_harness
from evotrainer.proposers.proposer import Proposal
from evotrainer.skills.library import Evidence
from evotrainer.stages.context import RunContext, StageRecords, arm_charge
from evotrainer.stages.results import (
    BranchRecord,
    GateResult,
    Mainline,
    PromoteResult,
    RememberResult,
    Rollback,
    TrialResult,
    VerdictLine,
)
from evotrainer.stages.start import over_budget
from evotrainer.store.ledger import Charge
from evotrainer.types import branch_id, trial_id

AA_SEED_OFFSET = 1_000_003  # the A-A arm trains on other seeds: same harness, other tasks and sampling noise

Survivor = tuple[Proposal, "dict[str, Any] | None"]  # a proposal that reaches a trial, with its replay


def trial(
    ctx: RunContext, rnd: int, head: Mainline, seg: ArmResult, survivors: list[Survivor], taint: list[str]
) -> tuple[TrialResult, StageRecords]:
    """Control, candidates and (when due) the A-A control fork from one checkpoint and train the same
    steps; a trial that cannot finish inside the budget is not started."""
    cfg, steps = ctx.cfg, ctx.cfg.loop.trial_steps
    start, first = (head.checkpoint, head.step + 1) if taint else (seg.checkpoint, seg.last_step + 1)
    harness = head.harness
    specs = [ctx.spec(branch_id(rnd, "control"), "control", start, harness, first, steps, cfg.run.seed, True)]
    for j, (p, _) in enumerate(survivors, 1):
        specs.append(
            ctx.spec(
                branch_id(rnd, "candidate", j),
                "candidate",
                start,
                p.intervention.apply(harness),
                first,
                steps,
                cfg.run.seed,
                True,
            )
        )
    if survivors and (head.aa_due or cfg.gate.aa_control == "round"):
        specs.append(
            ctx.spec(branch_id(rnd, "aa"), "aa", start, harness, first, steps, cfg.run.seed + AA_SEED_OFFSET, True)
        )
    n = cfg.loop.segment_steps
    per_step = Charge(seg.generated_tokens // n, seg.trained_tokens // n, seg.seconds / n)
    k = len(specs) * steps
    if cap := over_budget(
        cfg,
        ctx.ledger.spent(),
        Charge(per_step.generated_tokens * k, per_step.trained_tokens * k, per_step.seconds * k),
    ):
        return TrialResult(
            arms=[], abandoned=f"budget.{cap} would be exceeded by {len(specs)} arm(s) of {steps} steps"
        ), StageRecords()
    results = ctx.executor.run(specs, started=lambda s: ctx.ledger.set_status(rnd, "trial", s.branch))
    seeds = {s.branch: s.seed for s in specs}
    parent = head.branch if taint else seg.branch
    return TrialResult(arms=results), StageRecords(
        branches=[BranchRecord.of(r, rnd, parent, head.suite.version, seeds[r.branch]) for r in results],
        charges={r.branch: arm_charge(r) for r in results},
    )


def gate_stage(
    ctx: RunContext,
    rnd: int,
    head: Mainline,
    suite: Suite,
    tried: TrialResult,
    survivors: list[Survivor],
    sig: list[str],
) -> tuple[GateResult, StageRecords]:
    """Each candidate against the control: a paired win beyond the A-A noise, no validity finding, no
    widened reward-audit gap. A control whose own window carries a validity finding is rejected too."""
    cfg = ctx.cfg
    control = tried.arm(branch_id(rnd, "control"))
    ctrl_ev = _evidence(ctx, suite, control)
    ctrl_invalid = gate.invalid_reasons(ctrl_ev.findings)
    noise, aa_measured = head.noise, False
    if (aa := tried.arm(branch_id(rnd, "aa"))) is not None:
        if gate.aa_pair_valid(ctrl_ev.findings, _evidence(ctx, suite, aa).findings):
            noise, aa_measured = (
                {**gate.aa_noise(control.outcomes, aa.outcomes, cfg.gate, cfg.run.seed), "round": rnd},
                True,
            )
    noise = noise or {"abs_delta": 0.0, "note": "no valid A-A measurement yet"}
    trials, verdicts, lines = [], [], []
    for j, (p, rep) in enumerate(survivors, 1):
        cand = tried.arm(branch_id(rnd, "candidate", j))
        ev = _evidence(ctx, suite, cand)
        v = gate.decide(
            cand.outcomes, control.outcomes, ev, ctrl_ev, noise, cfg.gate, cand.evaluator_hash, cfg.run.seed + rnd
        )
        v.statistic["evidence"] = disagreements(cand, control, ctx.gate_ids)
        tid = trial_id(rnd, j)
        trials.append(
            {
                "id": tid,
                "round": rnd,
                "candidate": cand.branch,
                "control": control.branch,
                "intervention": p.intervention.model_dump(mode="json"),
                "source": p.source,
                "skill_id": p.skill_id,
                "signature": list(sig),
                "replay": rep,
            }
        )
        budget = {
            "candidate": asdict(arm_charge(cand)),
            "control": asdict(arm_charge(control)),
            "spent": asdict(ctx.ledger.spent()),
        }
        verdicts.append({"trial": tid, "round": rnd, **v.to_dict(), "budget": budget})
        lines.append(VerdictLine(trial=tid, decision=v.decision, reasons=v.reasons, delta=v.statistic["delta"]))
    return GateResult(
        noise=noise,
        aa_measured=aa_measured,
        control_findings=ctrl_ev.findings,
        control_rejected=ctrl_invalid,
        verdicts=lines,
    ), StageRecords(trials=trials, verdicts=verdicts)


def _evidence(ctx: RunContext, suite: Suite, arm: ArmResult) -> gate.ArmEvidence:
    return gate.arm_evidence(
        ctx.store, suite, arm.branch, arm.first_step, arm.last_step, arm.reward_last - arm.reward_first
    )


def promote(
    ctx: RunContext,
    rnd: int,
    head: Mainline,
    suite: Suite,
    tried: TrialResult,
    gated: GateResult,
    survivors: list[Survivor],
) -> tuple[PromoteResult, StageRecords]:
    """At most one winner: the mainline continues from its checkpoint under its harness; else from the
    control's; else, when the control carries an exploit, from where the round started."""
    j = gate.winner([(v.decision, v.delta) for v in gated.verdicts])
    control = tried.arm(branch_id(rnd, "control"))
    harness, carry, arm = head.harness, gated.control_findings, control
    if j is not None:
        arm, harness = tried.arm(branch_id(rnd, "candidate", j)), survivors[j - 1][0].intervention.apply(head.harness)
        save_harness(ctx.run_dir, harness)
        carry = findings_of(ctx, arm.branch, arm.last_step)
    new = head.at(arm.branch, arm.checkpoint, arm.last_step)
    rollback = None
    if gate.rolls_back(j is not None, gated.control_rejected):
        rollback = Rollback(branch=control.branch, reasons=gated.control_rejected, rolled_back_to=head.branch)
        new = head.at(head.branch, head.checkpoint, head.step)
    # The A-A control is re-measured after a promotion (the policy changed), or when it was due and not run.
    measured = gated.aa_measured if gated.aa_measured is not None else tried.arm(branch_id(rnd, "aa")) is not None
    aa_due = j is not None or (head.aa_due and not measured)
    new = new.model_copy(
        update={"harness": harness, "suite": suite, "noise": gated.noise, "carry": carry, "aa_due": aa_due}
    )
    return PromoteResult(
        head=new, promoted=gated.verdicts[j - 1].trial if j else None, rejected=rollback
    ), StageRecords()


def remember(
    ctx: RunContext, rnd: int, gated: GateResult, survivors: list[Survivor], sig: list[str]
) -> tuple[RememberResult, StageRecords]:
    """Every verdict becomes evidence for (or against) a skill; a promotion creates one (quarantined)."""
    cfg, touched = ctx.cfg, []
    for v, (p, _) in zip(gated.verdicts, survivors):
        ev = Evidence(
            run=cfg.run.name,
            round=rnd,
            trial=v.trial,
            decision=v.decision,
            effect=v.delta,
            domain=cfg.env.domain,
            signature=list(sig),
        )
        s = ctx.skills.record(p.intervention, ev, source=p.source, create=v.decision == "promote", sid=p.skill_id)
        if s is not None:
            touched.append(
                {"skill": s.id, "trial": v.trial, "wins": s.wins, "losses": s.losses, "quarantined": s.quarantined}
            )
    return RememberResult(skills=touched), StageRecords()


def findings_of(ctx: RunContext, branch: str, last: int) -> list[Finding]:
    """The findings stored for an arm's window (the gate ran the suite over it)."""
    rows = ctx.store.sql(
        "SELECT * EXCLUDE (suite_version) FROM findings WHERE branch = ? AND last_step = ?", [branch, last]
    )
    return [Finding(**{**r, "evidence": tuple(r["evidence"]), "knobs": tuple(r["knobs"])}) for r in rows]


def disagreements(cand: ArmResult, control: ArmResult, gate_ids: list[str], n: int = 5) -> dict[str, list[str]]:
    """Held-out rollout ids where the arms disagree, both sides, so a reader can open the trajectories."""
    index = {t: i for i, t in enumerate(gate_ids)}

    def rid(arm: ArmResult, task: str) -> str:
        return f"{arm.branch}-e{arm.last_step:06d}-{index[task]:04d}"

    won = [t for t in gate_ids if cand.outcomes.get(t) and not control.outcomes.get(t)][:n]
    lost = [t for t in gate_ids if control.outcomes.get(t) and not cand.outcomes.get(t)][:n]
    return {
        "candidate_won": [rid(cand, t) for t in won] + [rid(control, t) for t in won],
        "candidate_lost": [rid(cand, t) for t in lost] + [rid(control, t) for t in lost],
    }
