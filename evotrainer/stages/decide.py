"""Stages 7-9, the decision: gate each raced candidate on the evaluator's held-out outcomes and the
validity evidence; move the mainline to the winner (or the control, or back where the round started);
remember every verdict as evidence for a skill. The rules are pure functions in backtest/gate.py; the
trial itself (stage 6) is race.py."""

from __future__ import annotations

from typing import Any

from evotrainer.backtest import gate
from evotrainer.backtest.statistics import Noise, Pair
from evotrainer.backtest.trial import ArmResult
from evotrainer.backtest.verdict import (
    Disagreements,
    NoiseLine,
    RaceResult,
    Statistic,
    TrialRecord,
    VerdictBudget,
    VerdictRecord,
    pair_figures,
    read_trials,
)
from evotrainer.diagnostics.detector import Finding
from evotrainer.diagnostics.suite import Suite
from evotrainer.harness.harness import Harness, save_harness
from evotrainer.ids import EVAL, branch_id, rollout_id, trial_id
from evotrainer.skills.library import FOR, Skill
from evotrainer.stages.context import RunContext, StageRecords, arm_charge
from evotrainer.stages.level import round_level, with_history
from evotrainer.stages.noise import BankedPair, NoiseBank, bank_noise, with_pairs
from evotrainer.stages.race import exploiting_controls
from evotrainer.stages.results import (
    GateResult,
    Mainline,
    PromoteResult,
    RememberResult,
    Repair,
    Rollback,
    Survivor,
    TrialResult,
    VerdictLine,
    read_stage,
)
from evotrainer.stages.start import expect_evaluator, held_against, run_evidence


def gate_stage(
    ctx: RunContext,
    rnd: int,
    head: Mainline,
    suite: Suite,
    tried: TrialResult,
    survivors: list[Survivor],
    sig: list[str],
) -> tuple[GateResult, StageRecords]:
    """Each raced candidate against the control: the race's finalist by the two-stage test, with no
    validity finding its reward pays on either of its runs, no widened reward-audit gap, no reward rise
    the audit does not follow; the others are rejected for stopping early or not being confirmed. The
    control is rejected too when its own window carries a validity finding. This round's A-A pairs
    join the noise bank."""
    cfg = ctx.cfg
    for a in tried.arms:
        expect_evaluator(ctx, "checkpoint" if a.stopped else "gate", a.evaluator_hash, f"arm {a.branch}")
    memo: dict[str, gate.ArmEvidence] = {}

    def evidence(arm: ArmResult) -> gate.ArmEvidence:  # the suite runs over each arm's window once
        if arm.branch not in memo:
            memo[arm.branch] = _evidence(ctx, suite, arm, head.harness)
        return memo[arm.branch]

    control = tried.arm(branch_id(rnd, "control"))
    if control.steps_trained == 0 and (head.exploited is not None or tried.raced == "start"):
        # Beside a segment that carries an exploit (read again, or this round's own) the control trains no step
        # (race.trial): that segment, trained under this harness from where the arms fork, is the harness's run the
        # candidates are weighed against.
        seg = head.exploited or read_stage(ctx.ledger, rnd, "train")
        memo[control.branch] = _evidence(ctx, suite, seg, head.harness)
    ctrl_ev = evidence(control)
    # The alternative to a promotion: the control, unless a control run (the control or its replicate) carries
    # an exploit, however late in the trial it appeared; then the policy the arms forked from, which the control
    # read before its first step (gate.comparators).
    exploits = exploiting_controls(tried.arms, lambda a: evidence(a).findings)
    start = control.checkpoint_outcomes.get("0") if any(exploits) else None
    against = control
    if start is not None and exploits[0]:
        against = control.model_copy(update={"outcomes": start, "last_step": control.first_step - 1})
    noise, measured, mainline, model, own_line = _noise_models(rnd, head, tried, survivors, evidence)
    raced = [a for a in tried.arms if a.role == "candidate"]
    level, spent = round_level(cfg.gate, with_history(ctx.ledger, head, rnd), bool(raced))
    singles = gate.single_stage([Pair.of(c.outcomes, against.outcomes) for c in raced], model, level)
    trials, verdicts, lines = [], [], []
    for j, (survivor, cand) in enumerate(zip(survivors, raced, strict=False), 1):
        ev = evidence(cand)
        test_noise = model if j == tried.finalist else mainline
        stat, reasons = _test(
            ctx, rnd, tried, j, cand, control, test_noise, singles[j - 1], evidence, level, start, exploits
        )
        validity, invalid = gate.validity_reasons(ev, ctrl_ev)
        stat = stat.model_copy(
            update={
                **dict(validity),
                "evidence": disagreements(cand, against, ctx.gate_ids),
                "candidate_accuracy": cand.accuracy,
                # A racer that stopped is compared where it stopped (_test set the control's accuracy there).
                "control_accuracy": control.accuracy if stat.control_accuracy is None else stat.control_accuracy,
                **spent,
            }
        )
        tid = trial_id(rnd, j)
        trials.append(_trial_record(tid, rnd, cand, control, survivor, sig))
        line = own_line if j == tried.finalist and own_line else noise.line()
        # First on the verdict: proposers/pairs.py pairs a change by its findings in order, and a fall on the gate
        # tasks is measured where the window's findings are symptoms (swe_short seed 2: turn_cap came first).
        fell = _fell(ctx, rnd, tried, j, control, noise.noise(), cfg.gate.level, bool(exploits[0]))
        verdicts.append(_verdict(ctx, tid, rnd, cand, control, stat, reasons + invalid, line, fell + ev.findings))
        lines.append(
            VerdictLine(trial=tid, decision=verdicts[-1].decision, reasons=verdicts[-1].reasons, delta=stat.delta)
        )
    return GateResult(
        noise=noise,
        aa_measured=measured,
        control_findings=ctrl_ev.findings,
        control_rejected=gate.invalid_reasons(ctrl_ev.findings),
        verdicts=lines,
    ), StageRecords(trials=trials, verdicts=verdicts)


def _fell(
    ctx: RunContext,
    rnd: int,
    tried: TrialResult,
    j: int,
    control: ArmResult,
    noise: Noise,
    level: float,
    exploit: bool,
) -> list[Finding]:
    """gate.fell over candidate j's runs."""
    ids = {t: i for i, t in enumerate(ctx.gate_ids)}
    named = [
        (r.outcomes, {t: rollout_id(r.branch, r.last_step, i, EVAL) for t, i in ids.items()}, r.branch, r.last_step)
        for r in _runs(tried, rnd, j)
    ]
    return gate.fell(control.checkpoint_outcomes.get("0"), control.outcomes, named, noise, level, exploit)


def _runs(tried: TrialResult, rnd: int, j: int) -> list[ArmResult]:
    """Candidate j's runs that the trial trained: the race's, then the confirmation's."""
    arms = [tried.arm(branch_id(rnd, role, j)) for role in ("candidate", "replicate", "second_replicate")]
    return [a for a in arms if a is not None]


def _verdict(
    ctx: RunContext,
    tid: str,
    rnd: int,
    cand: ArmResult,
    control: ArmResult,
    stat: Statistic,
    reasons: list[str],
    noise: NoiseLine,
    findings: list[Finding],
) -> VerdictRecord:
    """The verdict on a candidate: rejected for any reason against it (each named once), else promoted."""
    return VerdictRecord(
        trial=tid,
        round=rnd,
        decision="reject" if reasons else "promote",
        reasons=list(dict.fromkeys(reasons)),
        statistic=stat,
        noise=noise,
        findings=findings,
        budget=VerdictBudget(candidate=arm_charge(cand), control=arm_charge(control), spent=ctx.ledger.spent()),
        evaluator_hash=cand.evaluator_hash,
    )


def _noise_models(
    rnd: int, head: Mainline, tried: TrialResult, survivors: list[Survivor], evidence
) -> tuple[NoiseBank, bool, Noise, Noise, NoiseLine | None]:
    """The noise bank with this round's valid A-A pairs (the control against its replicate or an A-A arm),
    whether any of them measured something (a discordant task), the mainline harness's noise model, the
    finalist's (gate.finalist_noise), and when the finalist's came from its own runs, the verdict's noise line
    for it (that pair joins the bank under its harness)."""
    control = tried.arm(branch_id(rnd, "control"))
    pairs = []
    for role in ("control_replicate", "aa"):
        other = tried.arm(branch_id(rnd, role))
        if other is not None and gate.aa_pair_valid(evidence(control).findings, evidence(other).findings):
            pairs.append((Pair.of(other.outcomes, control.outcomes), other.branch, control.branch))
    noise = with_pairs(head.noise, head.harness.version, rnd, pairs)
    mainline = noise.noise()
    own = _finalist_pairs(rnd, tried, evidence)
    version = survivors[tried.finalist - 1].proposal.intervention.apply(head.harness).version if own else ""
    model, measured_on = gate.finalist_noise(
        mainline, bank_noise(noise, version, [p for p, *_ in own]) if own else None
    )
    if measured_on != "candidate":
        return noise, any(p.discordant for p, *_ in pairs), mainline, model, None
    banked = [BankedPair.of(p, version, rnd, *names) for p, *names in own]
    noise = noise.model_copy(update={"pairs": noise.pairs + banked})
    line = NoiseLine(
        harness=version,
        phi=model.phi,
        pairs_used=model.pairs,
        dof=model.dof,
        valid=True,
        measured_on="the candidate's harness: its race and confirmation runs, which spread more than the "
        "mainline's pairs (or the mainline's measured nothing: a control run carries an exploit, or its runs agreed "
        "on every gate task)",
    )
    return noise, any(p.discordant for p, *_ in pairs), mainline, model, line


def _trial_record(
    tid: str, rnd: int, cand: ArmResult, control: ArmResult, survivor: Survivor, sig: list[str]
) -> TrialRecord:
    p = survivor.proposal
    return TrialRecord(
        id=tid,
        round=rnd,
        candidate=cand.branch,
        control=control.branch,
        intervention=p.intervention,
        source=p.source,
        skill_id=p.skill_id,
        signature=list(sig),
        replay=survivor.replay,
    )


def _finalist_pairs(rnd: int, tried: TrialResult, evidence) -> list[tuple[Pair, str, str]]:
    """The finalist's A-A pairs: its race run against each of its confirmation runs (the replicate, and the second
    replicate where there is one), its own harness on other seeds from one checkpoint; none when there is no
    confirmation, or a run carries an exploit. Each pair holds the race's run, the luckier of its seeds, so each
    leans wide: the test it feeds is, if anything, stricter."""
    j = tried.finalist
    cand = tried.arm(branch_id(rnd, "candidate", j)) if j else None
    if cand is None or cand.stopped:
        return []
    reps = [tried.arm(branch_id(rnd, role, j)) for role in ("replicate", "second_replicate")]
    reps = [r for r in reps if r is not None]
    if not reps or not all(gate.aa_pair_valid(evidence(cand).findings, evidence(r).findings) for r in reps):
        return []
    return [(Pair.of(r.outcomes, cand.outcomes), r.branch, cand.branch) for r in reps]


def _test(
    ctx: RunContext,
    rnd: int,
    tried: TrialResult,
    j: int,
    cand: ArmResult,
    control: ArmResult,
    model: Noise,
    single: tuple[Statistic, list[str]],
    evidence,
    level: float,
    start: dict[str, bool] | None = None,
    exploits: tuple[bool, bool] = (False, False),
) -> tuple[Statistic, list[str]]:
    """One candidate's statistic and the reasons against it, before validity. `start`: when a control run carries
    an exploit (`exploits`: the control, the control replicate), the outcomes of the policy the arms forked from,
    which the finalist's run beside that control run is tested against. `level`: the round's (round_level)."""
    cfg, k = ctx.cfg, sum(a.role == "candidate" for a in tried.arms)
    # A racer that stopped is compared with what it raced where it stopped, at its last checkpoint.
    at = list(cand.checkpoint_outcomes)[-1] if cand.stopped else None
    raced = control.checkpoint_outcomes["0" if tried.raced == "start" else at] if at else control.outcomes
    stage1 = Pair.of(cand.outcomes, raced)
    if cand.stopped:
        return RaceResult(
            level=level,
            candidates=k,
            stopped=cand.stopped,
            **pair_figures(stage1),
            # Both accuracies where the candidate stopped, like the delta (against the start where it raced that).
            control_accuracy=sum(raced.values()) / max(1, len(raced)),
        ), ["stopped_early"]
    if cfg.gate.statistic != "two_stage":
        return single
    rep, ctlr = tried.arm(branch_id(rnd, "replicate", j)), tried.arm(branch_id(rnd, "control_replicate"))
    if ctlr is None and exploits[0] and start is not None:
        # Beside a control that carries an exploit no control replicate trains (race.trial): the confirmation is held
        # against the start, as it would be against a replicate that carried the exploit again.
        read = {"outcomes": start, "accuracy": sum(start.values()) / max(1, len(start))}
        ctlr, exploits = control.model_copy(update=read), (True, True)
    if j != tried.finalist or rep is None or ctlr is None:
        return RaceResult(
            level=level,
            candidates=k,
            not_confirmed=tried.note or "not the race's best",
            **pair_figures(stage1),
        ), ["not_confirmed"]
    runs = [a for a in (rep, tried.arm(branch_id(rnd, "second_replicate", j))) if a is not None]
    stat, reasons = gate.confirmed(
        (cand.outcomes, *(a.outcomes for a in runs)),
        (control.outcomes, ctlr.outcomes),
        start,
        k,
        model,
        level,
        exploits,
    )
    stat = stat.model_copy(update={"confirmed_accuracy": rep.accuracy, "confirmed_control_accuracy": ctlr.accuracy})
    # The confirmation's runs are the candidate too: an exploit they pick up counts against it.
    reasons += sorted({f"validity:{f.name}" for a in runs for f in evidence(a).findings if f.validity})
    return stat, reasons


def _evidence(ctx: RunContext, suite: Suite, arm: ArmResult, shared: Harness) -> gate.ArmEvidence:
    return gate.arm_evidence(ctx.store, suite, arm.branch, arm.first_step, arm.last_step, shared)


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
    control's; else, when the control carries an exploit, from where the round started. Whichever arm it would
    continue from goes back to where the round started too when it is significantly below it on the gate
    tasks (gate.regression, the regression guard)."""
    j = gate.winner([(v.decision, v.delta) for v in gated.verdicts])
    control = tried.arm(branch_id(rnd, "control"))
    harness, carry, arm = head.harness, gated.control_findings, control
    if j is not None:
        arm = tried.arm(branch_id(rnd, "candidate", j))
        harness = survivors[j - 1].proposal.intervention.apply(head.harness)
        save_harness(ctx.run_dir, harness)
        carry = findings_of(ctx, arm.branch, arm.last_step)
    new = head.at(arm.branch, arm.checkpoint, arm.last_step)
    rollback, repaired = None, None
    if gate.rolls_back(j is not None, gated.control_rejected):
        rollback = Rollback(branch=control.branch, reasons=gated.control_rejected, rolled_back_to=head.branch)
        new = head.retried()
        if (fix := _repair(ctx, rnd, head, tried, gated, survivors)) is not None:
            rollback, (new, harness, carry, repaired) = None, fix
    elif reg := gate.regression(
        arm.outcomes, control.checkpoint_outcomes.get("0"), gated.noise.noise(), ctx.cfg.gate.level
    ):
        # The policy goes back; a harness that beat the control on this trial is kept (the verdict stands).
        rollback = Rollback(branch=arm.branch, reasons=["regression"], rolled_back_to=head.branch, regression=reg)
        new = head.retried()
    # An A-A arm (aa_control: promotion) is due again after a promotion (the policy changed), or when it
    # was due and no valid pair was measured.
    measured = gated.aa_measured if gated.aa_measured is not None else tried.arm(branch_id(rnd, "aa")) is not None
    aa_due = j is not None or (head.aa_due and not measured)
    past = with_history(ctx.ledger, head, rnd)
    raced = (past.raced or 0) + any(a.role == "candidate" for a in tried.arms)
    found = (past.promoted_at or []) + ([raced] if j is not None else [])
    new = new.model_copy(
        update={
            "harness": harness,
            "suite": suite,
            "noise": gated.noise,
            "carry": carry,
            "aa_due": aa_due,
            "raced": raced or None,
            "promoted_at": found or None,
        }
    )
    return PromoteResult(
        head=new, promoted=gated.verdicts[j - 1].trial if j else None, rejected=rollback, repaired=repaired
    ), StageRecords()


def _repair(
    ctx: RunContext, rnd: int, head: Mainline, tried: TrialResult, gated: GateResult, survivors: list[Survivor]
) -> tuple[Mainline, Harness, list[Finding], Repair] | None:
    """Where the control's exploit would send the mainline back, a raced remedy for it that qualifies (gate.repair):
    the mainline it continues as, its harness (saved), the findings it carries, and the record; None where none
    does. A candidate that stopped early leaves its policy behind: only its harness is adopted."""
    control = tried.arm(branch_id(rnd, "control"))
    raced = [a for a in tried.arms if a.role == "candidate"]
    harnesses = [s.proposal.intervention.apply(head.harness) for s in survivors]
    cands = [
        gate.Remedy(
            s.proposal.intervention.hypothesis.finding, v.reasons, [r.outcomes for r in _runs(tried, rnd, j)], h
        )
        for j, (s, v, h) in enumerate(zip(survivors, gated.verdicts, harnesses, strict=False), 1)
    ]
    # The exploits a remedy may be proposed for: the validity findings the round's proposer saw (the segment's, the
    # revision's, those carried from the mainline's last arm) and the control's.
    seen = read_stage(ctx.ledger, rnd, "diagnose").findings + read_stage(ctx.ledger, rnd, "revise").findings
    exploits = set(gate.tainted(seen + head.carry + gated.control_findings))
    start = control.checkpoint_outcomes.get("0")
    j = gate.repair(gated.control_rejected, exploits, cands, start, gated.noise.noise(), ctx.cfg.gate.level)
    if j is None:
        return None
    arm, harness = raced[j - 1], harnesses[j - 1]
    save_harness(ctx.run_dir, harness)
    new = head.retried() if arm.stopped else head.at(arm.branch, arm.checkpoint, arm.last_step)
    record = Repair(
        trial=gated.verdicts[j - 1].trial,
        harness=harness.version,
        closes=gated.control_rejected,
        continues_from=new.branch,
    )
    return new, harness, findings_of(ctx, arm.branch, arm.last_step), record


def remember(
    ctx: RunContext,
    rnd: int,
    harness: str,
    gated: GateResult,
    survivors: list[Survivor],
    sig: list[str],
    promoted: PromoteResult,
) -> tuple[RememberResult, StageRecords]:
    """Every verdict becomes evidence for (or against) a skill, with the context it was tried in (the domain, the
    model, `harness`: the version the interventions were applied to, and the value each replaced); a promotion
    creates one (quarantined), and so does a repair (`promoted.repaired`: the rejected remedy whose harness the
    mainline took in place of one that pays an exploit), recorded as `repair`: neither a win nor a loss. A rejection
    is also kept as a loss of its change (SkillLibrary.record_loss), so that a later run in this context need not
    try it again. A round rolled back under the harness the run adopted counts against the adopted skills
    (start.held_against)."""
    touched, repaired = [], promoted.repaired
    branches = {b["id"]: b for b in ctx.ledger.branches()}
    forked = {t.id: branches.get(t.candidate, {}).get("first_step") for t in read_trials(ctx.ledger)}

    def note(s: Skill, trial: str) -> dict[str, Any]:
        # The library's counts pool every run that shared it; this run's own are kept beside them, so a reader can
        # tell what this run added from what it inherited.
        mine = [e.decision for e in s.evidence if e.run == ctx.skills.run]
        return {"skill": s.id, "trial": trial, "wins": s.wins, "losses": s.losses, "quarantined": s.quarantined,
                "run_wins": mine.count("promote"), "run_losses": mine.count("reject")}  # fmt: skip

    for v, survivor in zip(gated.verdicts, survivors):
        p = survivor.proposal
        decision = "repair" if repaired is not None and repaired.trial == v.trial else v.decision
        ev = run_evidence(ctx, round=rnd, trial=v.trial, decision=decision, effect=v.delta, signature=list(sig),
                          harness=harness, before=p.intervention.before, reused=p.skill_id is not None,
                          step=forked.get(v.trial))  # fmt: skip
        s = ctx.skills.record(p.intervention, ev, source=p.source, create=decision in FOR, sid=p.skill_id)
        if decision == "reject":
            ctx.skills.record_loss(p.intervention, ev)
        if s is not None:
            touched.append(note(s, v.trial))
    # A loss held against an adoption: the round rolled back under the harness it made.
    touched += [
        note(s, trial) | {"held": True} for trial, s in held_against(ctx, rnd, harness, promoted.rejected, sig)
    ]
    return RememberResult(skills=touched), StageRecords()


def findings_of(ctx: RunContext, branch: str, last: int) -> list[Finding]:
    """The findings stored for an arm's window (the gate ran the suite over it)."""
    rows = ctx.store.sql(
        "SELECT * EXCLUDE (suite_version) FROM findings WHERE branch = ? AND last_step = ?", [branch, last]
    )
    return [Finding(**{**r, "evidence": tuple(r["evidence"]), "knobs": tuple(r["knobs"])}) for r in rows]


def disagreements(cand: ArmResult, control: ArmResult, gate_ids: list[str], n: int = 5) -> Disagreements:
    """Held-out rollout ids where the arms disagree, both sides, so a reader can open the trajectories. An arm's
    gate tasks are evaluated in gate_ids' order, so a task's place there is its rollout's index."""
    index = {t: i for i, t in enumerate(gate_ids)}

    def rid(arm: ArmResult, task: str) -> str:
        return rollout_id(arm.branch, arm.last_step, index[task], EVAL)

    won = [t for t in gate_ids if cand.outcomes.get(t) and not control.outcomes.get(t)][:n]
    lost = [t for t in gate_ids if control.outcomes.get(t) and not cand.outcomes.get(t)][:n]
    return Disagreements(
        candidate_won=[rid(cand, t) for t in won] + [rid(control, t) for t in won],
        candidate_lost=[rid(cand, t) for t in lost] + [rid(control, t) for t in lost],
    )


def reread(promoted: PromoteResult, gated: GateResult, seg: ArmResult, taint: list[str]) -> Mainline:
    """The mainline the round ends on; where it rolled back and its control, on seeds of its own, carried the
    segment's exploit again, with that segment to read again next round rather than train a third copy of it
    (Mainline.exploited). Another exploit in the control is no second sample of this one: the next round trains
    a segment of its own."""
    again = set(taint) & set(gate.tainted(gated.control_findings))
    moved = promoted.promoted or promoted.repaired  # the mainline left the harness that pays the exploit
    return promoted.head.model_copy(update={"exploited": seg}) if again and not moved else promoted.head
