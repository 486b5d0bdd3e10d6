"""Stage 6, the trial: a race, then a confirmation. The control and the candidates fork from one
checkpoint, each on its own seeds; the control runs first (it carries the mainline and never stops)
and the candidates race it, evaluated on the gate tasks at checkpoints, a loser stopping where it
cannot win (stopping.futile); beside a segment that carries an exploit they race the start's read instead (race_reads).
The race's best is then trained again on fresh seeds beside a control
replicate (the confirmation, gate.two_stage), which is also the run's A-A measurement, where that confirmation could
pass (gate.confirmation_power); beside a control that carries an exploit no replicate of it trains, and beside a
segment that carries one (this round's, or one read again) the control only reads the start where a remedy races
(an exploit's extra samples buy nothing the gate reads). A trial that
cannot finish inside the budget is not started, and the candidates a round trials are cut to keep
arms that end discarded within loop.max_trial_share, paced over the run (loop.trial_phases)."""

from __future__ import annotations

from collections.abc import Callable

from evotrainer.backtest import gate
from evotrainer.backtest.statistics import Pair
from evotrainer.backtest.trial import ArmResult, ArmSpec
from evotrainer.diagnostics.detector import Finding
from evotrainer.diagnostics.suite import Suite
from evotrainer.harness.harness import Harness
from evotrainer.ids import branch_id
from evotrainer.skills.library import model_name
from evotrainer.stages.context import RunContext, StageRecords, arm_charge
from evotrainer.stages.level import round_level, with_history
from evotrainer.stages.noise import bank_noise
from evotrainer.stages.results import SEED_STRIDE, BranchRecord, Mainline, Survivor, TrialResult
from evotrainer.stages.spend import library_share, lineage, race_allowance, spend
from evotrainer.stages.start import over_budget
from evotrainer.store.ledger import Charge
from evotrainer.store.rollouts import RolloutStore

# The control's slot is the segment's seed: after the segment, the control continues it on later steps' draws. Beside
# a tainted segment it forks from where the segment did, so on that seed it would replay it step for step (on
# swe_short a 25k-token copy whose window could only repeat the segment's exploit): it draws its own there.
_SEED_SLOT = {"control": 0, "aa": 100, "control_replicate": 200, "tainted_control": 500}
_REPLICATE_SLOT = {"replicate": 300, "second_replicate": 400}


def arm_seed(base: int, role: str, k: int = 0) -> int:
    """Each arm its own seeds (tasks drawn, sampling noise): a candidate that changes nothing is then
    exactly an A-A arm, which is what the gate's noise model measures. Shared seeds would buy nothing
    here: on benchmarks/gate_calibration.py's arms the spread of a learning-rate fix minus its control
    was 0.020 with shared seeds and 0.019 with other seeds (trajectories part within a few steps)."""
    slot = 1 + k if role == "candidate" else _REPLICATE_SLOT[role] + k if role in _REPLICATE_SLOT else _SEED_SLOT[role]
    return base + SEED_STRIDE * slot


def checkpoints(length: int, n: int) -> tuple[int, ...]:
    """n evenly spaced checkpoints strictly inside a trial of `length` steps (or tokens)."""
    return tuple(sorted({round(length * i / (n + 1)) for i in range(1, n + 1)} - {0, length}))


def race_size(n: int, full: int, racing: bool, aa_due: bool, confirms: bool, fits) -> int:
    """How many of `n` candidates a round can afford: the most k for which `fits(race tokens, confirmation
    tokens)` holds (0 when none). `full` is one arm's tokens. A racing candidate is charged half an arm (the
    race stops most losers early), an A-A arm a whole one, and a confirmation three (a replicate, a control
    replicate, and whichever of control and winner the mainline leaves): a race whose winner could not then
    be confirmed would buy nothing but discarded tokens."""
    cost = full // 2 if racing else full
    k = n
    while k and not fits(k * cost + aa_due * full, 3 * full if confirms else 0):
        k -= 1
    return k


def _priced(ctx: RunContext, full: int, n_arms: int) -> tuple[int, TrialResult | None]:
    """What one arm of this trial counts at, and the trial abandoned if `n_arms` of them would pass a budget cap.
    The budget is a cap, not a share with a margin: each arm counts at what this run's trial arms cost with their
    gate reads where that is more than the segment's steps say (swe_short seed 2 at 150k: five arms of 20k-31k
    where the steps said 17.6k, 186k spent; swe_short_300k seed 8: a round-4 trial forecast at 52.1k of the
    52.5k left cost 78.5k, and the run spent 328k)."""
    arm = max(full, _arm_cost(ctx))
    if cap := over_budget(ctx.cfg, ctx.ledger.spent(), Charge(arm * n_arms)):
        # Seconds are not forecast (they depend on the machine): that cap is reached only once spent.
        why = (
            "spent"
            if cap == "seconds"
            else f"would be exceeded by {n_arms} arm(s) of {ctx.cfg.loop.trial_steps} steps"
        )
        return arm, TrialResult(arms=[], abandoned=f"budget.{cap} {why}", cap=cap)
    return arm, None


def trial(
    ctx: RunContext,
    rnd: int,
    head: Mainline,
    seg: ArmResult,
    survivors: list[Survivor],
    taint: list[str],
    suite: Suite,
) -> tuple[TrialResult, StageRecords]:
    cfg, steps = ctx.cfg, ctx.cfg.loop.trial_steps
    start, first = (head.checkpoint, head.step + 1) if taint else (seg.checkpoint, seg.last_step + 1)
    per_step = seg.generated_tokens // max(1, seg.last_step - seg.first_step + 1)
    kept = lineage(ctx.ledger, head.branch) | ({seg.branch} if not taint else set())
    # On a segment read again (Mainline.exploited) the harness has shown its exploit twice, in the segment and in
    # its control on seeds of their own: a third sample would be a control the gate sets aside and the mainline
    # cannot go on from (swe_short at 300k: a 26k-token arm), and no A-A pair (gate.aa_pair_valid). The control then
    # trains no step: it reads the policy the arms fork from, and the gate takes the segment read again as the
    # harness's run. And the mainline cannot train until a remedy wins or repairs its harness, so the run's later
    # parts the pacing keeps trials for would never come, and the tokens the share keeps for mainline training could
    # only go unspent: the whole budget is open to the remedies (swe_short at 300k: the regrade with half the step did
    # not fit 0.6 of it after the regrade alone fell). Where none fits, the trial (and the run) ends.
    again = head.exploited is not None
    # Beside a segment that carries an exploit no A-A arm trains: its pair would be the control, which reads only
    # (below) or, trained, pays the exploit again (gate.aa_pair_valid).
    aa_due = (
        bool(survivors)
        and not taint
        and (cfg.gate.aa_control == "round" or (cfg.gate.aa_control == "promotion" and head.aa_due))
    )
    full, confirms = per_step * steps, cfg.gate.statistic == "two_stage"
    share = (1.0, "the token budget") if again else trial_share(ctx, head.harness)
    k, note = _affordable(ctx, kept, len(survivors), full, aa_due, confirms, share, paced=not again)
    if again and not k:
        why = f"{note}: no remedy fits" if survivors else "no remedy is left to try"
        return TrialResult(
            arms=[], abandoned=f"{why}, and the harness carries {', '.join(taint)} in its segment and its control"
        ), StageRecords()
    aa_due = aa_due and k > 0
    # Beside a segment whose own window carries an exploit, with a remedy to race, the control trains no step either:
    # it reads the policy the arms fork from, and the segment stands as the harness's run (gate_stage). The remedies
    # race that read (race_reads) and the gate holds them against it wherever the harness shows the exploit
    # (gate.comparators), so a second sample of the exploit on seeds of its own changes no decision the gate reads;
    # on swe_short_300k it was a 20k-25k-token arm of every round 1, and on code a 40k one. Where nothing is raced the
    # control trains: it carries the mainline on.
    lean = bool(taint) and not again and k > 0
    # With the confirmation's two: beside an exploit, the finalist's replicate and the third run it owes against
    # the start (no control replicate); a control that only reads counts as one arm all the same.
    n_arms = 1 + k + aa_due + (2 if k and confirms else 0)
    arm, over = _priced(ctx, full, n_arms)
    if over is not None:
        return over, StageRecords()
    # Equal spend (loop.trial_unit tokens): every arm trains to the tokens trial_steps of the segment's steps
    # generated, at most 4 x trial_steps steps, and the race reads the arms at equal fractions of them.
    target = full if cfg.loop.trial_unit == "tokens" else 0
    marks = checkpoints(target or steps, cfg.loop.race_checkpoints) if k else ()
    # The control reads the policy the arms fork from first, every round (one read): an exploit can appear in
    # a control run at any point of the trial, and the alternative a remedy must then beat is that policy, not
    # the exploit (gate.comparators); it is also what the regression guard reads the new head against.
    spec = _specs(ctx, rnd, head, start, first, marks, target, start_read=True, taint=bool(taint))
    specs = [spec("control", "control", head.harness, train=not (again or lean))]
    [control] = _run(ctx, rnd, specs)
    harnesses = [s.proposal.intervention.apply(head.harness) for s in survivors[:k]]
    reads, against = race_reads(control, marks, bool(taint))
    race = [spec("candidate", "candidate", h, j, reads, against=against) for j, h in enumerate(harnesses, 1)]
    specs += race + ([spec("aa", "aa", head.harness)] if aa_due else [])
    raced = _run(ctx, rnd, specs[1:])
    arms = [control, *raced]
    j = None
    if k and confirms:
        exploited = again or lean or control_exploits(ctx.store, suite, [control])
        j, note = _finalist(ctx, rnd, head, control, raced, (k, kept, 3 * full), note, exploited, share)
    if j is not None:
        more, ran = _confirm(ctx, rnd, spec, (harnesses[j - 1], j), head.harness, suite, arms, arm, exploited)
        specs, arms = specs + more, arms + ran
    parent = head.branch if taint else seg.branch
    seeds = {sp.branch: sp.seed for sp in specs}
    return TrialResult(arms=arms, finalist=j, note=note, raced=against), StageRecords(
        branches=[BranchRecord.of(a, rnd, parent, head.suite.version, seeds[a.branch]) for a in arms],
        charges={a.branch: arm_charge(a) for a in arms},
    )


def race_reads(control: ArmResult, marks: tuple[int, ...], taint: bool) -> tuple[dict[str, dict[str, bool]], str]:
    """What the candidates race, by mark, and against what (stopping.futile): the control's reads at the race's
    checkpoints; beside a segment that carries an exploit (`taint`), the start's read at every mark. There the
    gate holds a remedy against the start wherever the control pays the exploit (gate.comparators), and the
    control has not shown it on the gate tasks yet three steps in: raced against it, a remedy level with the
    start stopped at the first checkpoint beside a control that went on to fall (swe_short_300k on an AVX2 EPYC,
    seeds 1 and 2), and the mainline had no trained arm to go on from."""
    start = control.checkpoint_outcomes.get("0")
    if not taint or start is None:
        return control.checkpoint_outcomes, "control"
    return {str(m): start for m in marks}, "start"


def _confirm(
    ctx: RunContext,
    rnd: int,
    spec: Callable[..., ArmSpec],
    finalist: tuple[Harness, int],
    mainline: Harness,
    suite: Suite,
    arms: list[ArmResult],
    arm: int,
    exploited: bool,
) -> tuple[list[ArmSpec], list[ArmResult]]:
    """The confirmation of `finalist` (its harness, its index): its replicate beside a control replicate, on fresh
    seeds, and its third run where that is due (_second_replicate_due). Beside a control that carries an exploit
    (`exploited`) no control replicate trains: the confirmation is held against the start there (gate.comparators),
    and it would be one more sample of the exploit, whose window the gate sets aside (on swe_short_300k a 25k-token
    arm in each of the loop's first two trials)."""
    harness, j = finalist
    twin = [] if exploited else [spec("control_replicate", "control_replicate", mainline)]
    specs = [spec("replicate", "replicate", harness, j), *twin]
    ran = _run(ctx, rnd, specs)
    if _second_replicate_due(ctx, suite, arms + ran, arm, exploited):
        specs.append(spec("replicate", "second_replicate", harness, j))
        ran += _run(ctx, rnd, specs[-1:])
    return specs, ran


def _arm_cost(ctx: RunContext) -> int:
    """The mean generated tokens (training and gate reads) of this run's trial arms that trained so far (a control
    beside a segment read again only reads); 0 before the first."""
    rows = ctx.ledger.rows(
        "SELECT avg(generated_tokens) AS g FROM charges "
        "WHERE stage = 'trial' AND item != 'stage' AND generated_tokens > 0 AND trained_tokens > 0"
    )
    return int(rows[0]["g"] or 0) if rows else 0


def trial_share(ctx: RunContext, harness: Harness) -> tuple[float, str]:
    """The share of the token budget this round's discarded arms may reach (loop.max_trial_share, lowered by the
    skill library's record of other runs' trials on this harness where loop.trial_share_by_library), and what it
    is, in words."""
    cfg, share = ctx.cfg, ctx.cfg.loop.max_trial_share
    if not cfg.loop.trial_share_by_library:
        return share, "loop.max_trial_share"
    won, lost = ctx.skills.record_in(cfg.env.domain, model_name(cfg.policy), harness.version, besides=ctx.skills.run)
    lowered = library_share(share, won, lost)
    if lowered >= share:
        return share, "loop.max_trial_share"
    return lowered, (
        f"loop.max_trial_share {share:g} lowered to {lowered:.3g} by the skill library "
        f"(other runs' trials on harness {harness.version}: {won} won, {lost} lost)"
    )


def _affordable(
    ctx: RunContext,
    kept: set[str],
    n: int,
    full: int,
    aa_due: bool,
    confirms: bool,
    share: tuple[float, str],
    paced: bool = True,
) -> tuple[int, str]:
    """How many of the round's `n` candidates race (race_size under `share`, a share of the token budget and its
    name, paced over the run's parts unless `paced` is False), and a note when fewer."""
    racing = bool(ctx.cfg.loop.race_checkpoints)
    k = race_size(n, full, racing, aa_due, confirms, _fits(ctx, kept, share[0], paced=paced))
    if k == n:
        return k, ""
    note = f"{k} of {n} candidate(s) within {share[1]}"
    if paced and k < (whole := race_size(n, full, racing, aa_due, confirms, _fits(ctx, kept, share[0], paced=False))):
        note += f" as paced by loop.trial_phases={ctx.cfg.loop.trial_phases} ({whole} within the whole share)"
    return k, note


def _specs(
    ctx: RunContext,
    rnd: int,
    head: Mainline,
    start: str,
    first: int,
    marks: tuple[int, ...],
    tokens: int,
    start_read: bool = False,
    taint: bool = False,
):
    """A maker of this trial's arm specs: role, branch role, harness, candidate index, the control's
    checkpoint outcomes to race (candidates only). `tokens`: each arm's token target (0: steps);
    `start_read`: the control also reads the policy it forks from (mark 0); `taint`: the arms fork from where a
    tainted segment did (the control then draws seeds of its own, _SEED_SLOT). An arm made with `train=False` trains
    no step and only reads the policy it forks from (mark 0, a control beside a segment read again)."""
    cfg = ctx.cfg
    steps = cfg.loop.trial_steps * (4 if tokens else 1)  # with a token target, a cap on a cheap harness's steps

    def spec(
        role: str, branch_role: str, harness, k: int = 0, race: dict | None = None, train=True, against="control"
    ) -> ArmSpec:
        s = ctx.spec(
            branch_id(rnd, branch_role, k),
            role,
            start,
            harness,
            first,
            steps if train else 0,
            arm_seed(
                head.seed(cfg.run.seed), "tainted_control" if taint and branch_role == "control" else branch_role, k
            ),
            True,
        )
        racing = role in ("control", "candidate")  # only the race's arms are read at checkpoints
        at = ((0,) if start_read and role == "control" else ()) + (marks if train else ()) if racing else ()
        fields = {"checkpoints": at, "race": race, "race_against": against, "tokens": tokens if train else 0}
        return ArmSpec(**{**s.__dict__, **fields})

    return spec


def _run(ctx: RunContext, rnd: int, specs: list[ArmSpec]) -> list[ArmResult]:
    return ctx.executor.run(specs, started=lambda s: ctx.ledger.set_status(rnd, "trial", s.branch)) if specs else []


def _second_replicate_due(ctx: RunContext, suite: Suite, arms: list[ArmResult], arm: int, exploited: bool) -> bool:
    """Whether the finalist gets a third run, on seeds of its own: where a control run carries an exploit
    (control_exploits), the finalist is compared with the policy the arms forked from (gate.comparators). Against
    that one fixed read, two runs of a harness that spreads the policy cannot show the spread when both land high:
    the gate promoted such a harness raced against itself in 1.5-1.8% of first rounds (benchmarks/gate_calibration
    .py, digits at a learning transition; nominal 1.25%). Each confirmation run must then pass (gate.confirmed).
    Not where the run, with the round's others (`arm` tokens each, the trial's forecast), would pass a budget cap:
    the gate says what was missing. `exploited`: the race's control is known to carry one (on a segment read again
    it trains nothing for the suite to read)."""
    if not exploited and not control_exploits(ctx.store, suite, arms):
        return False
    return over_budget(ctx.cfg, ctx.ledger.spent(), Charge(arm * (len(arms) + 1))) is None


def exploiting_controls(arms: list[ArmResult], findings: Callable[[ArmResult], list[Finding]]) -> tuple[bool, bool]:
    """Whether the control and the control replicate (where there is one) carry an exploit in their own windows,
    read as the gate reads it: gate.invalid_reasons over the round's suite's `findings` of each run's window. The
    trial stage asks it to decide the finalist's third run, the gate stage to choose what the finalist must beat."""

    def exploits(role: str) -> bool:
        run = next((a for a in arms if a.role == role), None)
        return run is not None and bool(gate.invalid_reasons(findings(run)))

    return exploits("control"), exploits("control_replicate")


def control_exploits(store: RolloutStore, suite: Suite, arms: list[ArmResult]) -> bool:
    """Whether the control or its replicate carries an exploit, by the suite run over each window (the gate stage
    runs it again and stores the findings)."""
    return any(exploiting_controls(arms, lambda a: suite.run(store, a.branch, a.first_step, a.last_step)))


def _finalist(
    ctx: RunContext,
    rnd: int,
    head: Mainline,
    control: ArmResult,
    raced: list[ArmResult],
    sizes: tuple[int, set[str], int],
    note: str,
    exploited: bool,
    share: tuple[float, str],
) -> tuple[int | None, str]:
    """The race's best, if it is worth a confirmation, the confirmation could pass (gate.confirmation_power at the
    round's level; beside an exploit it is held against the start and needs two runs that each pass), and it fits
    the round's `share` of the token budget (with this round's other racers, which end discarded whatever the gate
    says, counted in; the share's name for the note). `sizes`: the candidates raced, the mainline's lineage, the
    confirmation's tokens."""
    k, kept, confirm_tokens = sizes
    noise = bank_noise(head.noise, head.harness.version, [])
    stage1 = [None if c.stopped else Pair.of(c.outcomes, control.outcomes) for c in raced[:k]]
    j, why = gate.finalist(stage1, noise)
    note = "; ".join(x for x in (note, why) if x)
    if j is None:
        return None, note
    level, _ = round_level(ctx.cfg.gate, with_history(ctx.ledger, head, rnd), True)
    power = gate.confirmation_power(stage1[j - 1], k, noise, level, runs=2 if exploited else 1)
    if power < gate.CONFIRM_POWER_MIN:
        why = (
            f"candidate {j} is not confirmed: a confirmation would pass the round's alpha "
            f"{1 - level:.4g} {100 * power:.0f}% of the time at its race's own effect "
            f"(under {100 * gate.CONFIRM_POWER_MIN:.0f}%)"
        )
        return None, "; ".join(x for x in (note, why) if x)
    losers = sum(a.generated_tokens + a.eval_tokens for i, a in enumerate(raced, 1) if i != j)
    if not _fits(ctx, kept, share[0], paced=False)(0, confirm_tokens + losers):
        return None, "; ".join(x for x in (note, f"the confirmation would pass {share[1]}") if x)
    return j, note


def _fits(ctx: RunContext, kept: set[str], share: float, paced: bool):
    """`fits(race, confirm)`: whether a race of `race` more discarded tokens, with `confirm` kept back for the
    confirmation its winner would need, keeps the arms that end discarded within `share` of the token budget
    (trial_share; the whole of it where the mainline cannot train, see trial), paced over loop.trial_phases
    (`paced`: within the portion the run's part has reached). A confirmation is checked against the whole share:
    the race was sized to fit it in its part, and a race that cost more than its estimate (a loser that ran its
    length) is still confirmed rather than wasted. Without a token budget there is no total to take a share of: a
    share of the spend so far would forbid every confirmable trial in the early rounds (round 1 has spent one
    segment), so the share does not bind and the other budgets bound the trials."""
    cfg = ctx.cfg
    cap = cfg.budget.generated_tokens

    def fits(race: int, confirm: int) -> bool:
        if not cap:
            return True
        left = race_allowance(
            share * cap,
            spend(ctx.ledger, kept).tokens_discarded,
            confirm,
            ctx.ledger.spent().generated_tokens,
            cap,
            cfg.loop.trial_phases if paced else 1,
        )
        return race <= left

    return fits
