"""The gate: promote a candidate only on a statistically supported win on the evaluator-owned
held-out metric, by more than the noise the run measured itself, and with no validity finding
against it. Every verdict carries its statistic, the noise estimate, the findings and the
evaluator hash, whatever the decision."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from scipy import stats

from evotrainer.backtest.replay import load_columns
from evotrainer.backtest.statistics import Noise, Pair, combine, noise_of, p_value, sign_p
from evotrainer.backtest.stopping import BEHIND_P
from evotrainer.backtest.verdict import (
    ConfirmStage,
    RaceStage,
    Regression,
    SignHolm,
    TwoStage,
    Validity,
    pair_figures,
)
from evotrainer.diagnostics.detector import Finding
from evotrainer.diagnostics.suite import Suite
from evotrainer.harness.harness import Harness
from evotrainer.harness.rewards import total_reward
from evotrainer.ids import GATE, shard_id
from evotrainer.store.files import sql_str
from evotrainer.store.rollouts import RolloutStore

# Validity margins. Fixed, not configurable: they are part of what "valid" means, and a proposer
# or harness change must not be able to loosen them.
GAP_WIDENING = 0.05  # share of rewarded train rollouts failing the audit, candidate minus control
REWARD_RISE = 0.10  # candidate's in-arm reward rise beyond the control's ...
AUDIT_FLAT = 0.0  # ... while its train audit pass rate is no better than the control's
# The two-stage test's constants, fixed for the same reason (benchmarks/gate_calibration.py measured the
# false-promotion rate and the power with exactly these).
CONFIRM_WEIGHT = 0.8  # weight of the confirmation in the inverse-normal combination (the race's: 0.6)
CONFIRM_P_MAX = 0.3  # the confirmation's own p must be at most this: it leans the same way
SCREEN = 0.5  # a race winner whose adjusted stage-1 p is above this is not worth a confirmation
# A finalist is confirmed only where the confirmation could pass: its chance of passing the round's level if the
# finalist's true effect were what its race read (the conditional power of group-sequential trials, at the race's
# estimate, which its selection biases up, so this skips less than it would at the true effect) must be at least
# this. Skipping only removes promotions, so the run's error rate holds; what it costs is power on effects the race
# under-read. A confirmation is three arms' tokens (on swe_short_300k 36k-45k of 300k a round).
CONFIRM_POWER_MIN = 0.2
# The noise model's prior: worth BASE_DOF A-A pairs at phi = PRIOR_PHI, and the t reference's degrees of freedom
# before the measured pairs add theirs (statistics.noise_of). The centre is the pooled phi of
# benchmarks/gate_calibration.py's 2026-11 arms (1.32 from the round-1 start, 1.48 after the learning-rate fix),
# rounded up; those arms are not the ones the gate is scored on now (benchmarks/gate_simulation.py draws its own at
# phi 1 to 3), so the prior is not tuned on its own scorecard. A prior at 1 (the binomial floor) let false
# promotions grow with the true phi (0.042 at 1.3, 0.108 at 3.0, K = 1, per round). Its weight: 10 pseudo-pairs at
# 1.5 still let a run at phi 3 promote a null candidate 6% of the time (its first round has one measured pair to
# outweigh the prior); 4 keeps every path at or below the run's 0.05 at phi 1 to 3 (benchmarks/RESULTS.md).
BASE_DOF = 4.0
PRIOR_PHI = 1.5


def moderated(pairs: list[Pair]) -> Noise:
    """The run's noise model from its A-A pairs: the prior of BASE_DOF pseudo-pairs at PRIOR_PHI pooled in."""
    return noise_of(pairs, BASE_DOF, PRIOR_PHI)


def spending(t: int) -> float:
    """gamma_t of the run's alpha spending (t = 1, 2, ...): 1 / (t (t + 1)), non-increasing and summing to 1.
    A run gates a handful of rounds, not thousands of hypotheses: this puts half the wealth on the first raced
    round and a sixth on the second, where LORD's published sequence (built for long streams) gives the first
    test 7% of it."""
    return 1.0 / (t * (t + 1)) if t >= 1 else 0.0


def round_alpha(alpha: float, t: int, discoveries: list[int]) -> float:
    """The t-th raced round's share of the run's error rate `alpha`, by LORD++ (Ramdas, Yang, Wainwright and
    Jordan 2017): gamma_t W0 + (alpha - W0) gamma_{t - tau_1} + alpha sum_{j >= 2} gamma_{t - tau_j}, with the
    initial wealth W0 = alpha / 2 and tau_j the raced rounds that promoted. It keeps the false-discovery rate
    of the run's promotions at most alpha; when no candidate is better than its control (the null the gate is
    calibrated on) any promotion is false, so the chance of a false promotion in the whole run is at most
    alpha (benchmarks/gate_simulation.py measures it). A promotion earns wealth back: a run that keeps finding
    real gains keeps its power. Every raced round counts as a test, confirmed or not, so that which rounds
    spend does not depend on what their races showed."""
    w0 = alpha / 2
    taus = sorted(d for d in discoveries if d < t)
    a = spending(t) * w0
    if taus:
        a += (alpha - w0) * spending(t - taus[0]) + alpha * sum(spending(t - d) for d in taus[1:])
    return a


@dataclass
class ArmEvidence:
    """What the gate knows about one arm besides its held-out outcomes: its train-audit statistics
    and the suite's findings over its window."""

    reward_rise: float  # mean reward, last third minus first third of the arm's steps
    audit_pass: float | None  # audit pass rate of its audited train rollouts
    gap: float | None  # share of its rewarded audited train rollouts that fail the audit
    findings: list[Finding] = field(default_factory=list)


def validity_reasons(cand: ArmEvidence, ctrl: ArmEvidence) -> tuple[Validity, list[str]]:
    """The candidate's own window carries a validity finding its reward pays (demoted ones do not count),
    its reward-audit gap widened, or its reward rose beyond the control's while its audit did not follow
    (both measured under one reward function, see arm_evidence). Returns the figures read and the reasons."""
    reasons = [f"validity:{f.name}" for f in cand.findings if f.validity]
    if cand.gap is not None and ctrl.gap is not None and cand.gap - ctrl.gap > GAP_WIDENING:
        reasons.append("reward_audit_gap_widened")
    if (
        cand.reward_rise - ctrl.reward_rise > REWARD_RISE
        and cand.audit_pass is not None
        and ctrl.audit_pass is not None
        and cand.audit_pass - ctrl.audit_pass <= AUDIT_FLAT
    ):
        reasons.append("reward_up_audit_flat")
    figures = Validity(
        gap_candidate=cand.gap,
        gap_control=ctrl.gap,
        reward_rise_candidate=cand.reward_rise,
        reward_rise_control=ctrl.reward_rise,
        audit_pass_candidate=cand.audit_pass,
        audit_pass_control=ctrl.audit_pass,
    )
    return figures, reasons


def finalist(stage1: list[Pair | None], noise: Noise) -> tuple[int | None, str]:
    """Stage 1's pick: the candidate that finished the race furthest ahead of the control (None entries
    stopped early), if it is ahead and worth a confirmation: its stage-1 p, Bonferroni-adjusted for the
    round's K candidates, at most SCREEN (a cost screen; the decision is the combined test). Returns
    (1-based index or None, why not)."""
    ahead = [(p.wins - p.losses, j) for j, p in enumerate(stage1, 1) if p is not None and p.wins > p.losses]
    if not ahead:
        return None, "no candidate finished ahead of the control"
    _, j = max(ahead)
    p1 = min(1.0, len(stage1) * p_value(stage1[j - 1], noise))
    if p1 > SCREEN:
        return None, f"the best (candidate {j}) is not worth a confirmation: adjusted stage-1 p {p1:.3f} > {SCREEN}"
    return j, ""


def confirmation_power(stage1: Pair, k: int, noise: Noise, level: float, runs: int = 1) -> float:
    """The chance that a confirmation of the finalist passes two_stage at `level` (its combined p, its own p at most
    CONFIRM_P_MAX, its delta above 0) if its true effect is what `stage1` read: a confirmation run on the same gate
    tasks splits as many discordant tasks binomially at the race's win share. `k`: the round's candidates (stage 1's
    adjustment); `runs`: the confirmation runs that must each pass (two against the round's start, gate.confirmed).
    The test then stands on the pairs the confirmation brings as well, one a run (the control replicate's, or the
    finalist's own runs' against the start, gate.finalist_noise): `noise` with as many more degrees of freedom, its
    phi as it stands. Without them the power of a round with no pair banked yet was read at the prior's 4 degrees of
    freedom, and a simulated +0.05 fix among four candidates lost half its power (benchmarks/RESULTS.md)."""
    m = stage1.discordant
    if not m or stage1.wins <= stage1.losses:
        return 0.0
    noise = Noise(noise.phi, noise.pairs + runs, noise.dof + runs)
    p1 = min(1.0, k * p_value(stage1, noise))

    def passes(w: int) -> bool:  # two_stage's rule for a confirmation run that wins w of the m tasks
        p2 = p_value(Pair(w, m - w, stage1.n), noise)
        return w > m - w and p2 <= CONFIRM_P_MAX and combine(p1, p2, CONFIRM_WEIGHT) <= 1.0 - level

    wins = [w for w in range(m + 1) if passes(w)]
    return float(stats.binom.pmf(wins, m, stage1.wins / m).sum()) ** runs


def two_stage(stage1: Pair, stage2: Pair, k: int, noise: Noise, level: float) -> tuple[TwoStage, list[str]]:
    """The finalist's test: stage 1 (the race, its p Bonferroni-adjusted for the K candidates it was
    selected from) combined with stage 2 (the confirmation on fresh seeds, which selection never saw) by
    a weighted inverse-normal combination; the confirmation must also lean the same way on its own. The
    noise model must rest on at least one A-A pair. Returns the statistic and the reasons against."""
    p1 = min(1.0, k * p_value(stage1, noise))
    p2 = p_value(stage2, noise)
    p = combine(p1, p2, CONFIRM_WEIGHT)
    stat = TwoStage(
        level=level,
        candidates=k,
        p=p,
        phi=noise.phi,
        noise_pairs=noise.pairs,
        dof=noise.dof,
        stage1=RaceStage(**pair_figures(stage1), p_adjusted=p1),
        stage2=ConfirmStage(**pair_figures(stage2), p=p2),
        # The effect on record is the confirmation's: the race's is inflated by its selection.
        delta=stage2.delta,
        selected_delta=stage1.delta,
    )
    reasons = []
    if not noise.valid:
        reasons.append("no_valid_noise_estimate")
    if p > 1 - level or p2 > CONFIRM_P_MAX or stage2.delta <= 0:
        reasons.append("no_supported_gain")
    return stat, reasons


Outcomes = dict[str, bool]


def comparators(
    control: tuple[Outcomes, Outcomes], exploits: tuple[bool, bool], start: Outcomes | None
) -> tuple[tuple[Outcomes, Outcomes], bool]:
    """What each stage's run is compared with: its control run (the race's control, the confirmation's
    control replicate), or `start`, the policy the arms forked from (read on the gate tasks every round),
    where that control run carries an exploit: whichever of the two, however late in the trial it appeared.
    Beating an exploit is no evidence of being any good. Returns the comparators and whether either is the
    start. Without a start read (a run from before it was read every round) the controls stand."""
    if start is None or not any(exploits):
        return control, False
    return (start if exploits[0] else control[0], start if exploits[1] else control[1]), True


def confirmed(
    cand: tuple[Outcomes, ...],
    control: tuple[Outcomes, Outcomes],
    start: Outcomes | None,
    k: int,
    noise: Noise,
    level: float,
    exploits: tuple[bool, bool] = (True, True),
) -> tuple[TwoStage, list[str]]:
    """The finalist's two-stage test, its race run (`cand[0]`) and its confirmation run (`cand[1]`) against the
    alternative to promoting it: the control and the control's replicate; or, where one of them carries an exploit
    (`exploits`, by stage), `start`, the policy the round's arms forked from (gate.comparators): a remedy that
    trains the policy below where it started is no remedy. Against that one fixed read the finalist needs a second
    confirmation run (`cand[2]`, on seeds of its own) and must pass with each: two runs of a harness that spreads
    the policy cannot show the spread when both land high (reason `no_second_confirmation` without it). The record
    is the weaker test's, with the other confirmation as `second_stage`. A third run given where no control run
    exploits counts the same way: the finalist passes with every run it has."""
    base, against_start = comparators(control, exploits, start)
    tests = [two_stage(Pair.of(cand[0], base[0]), Pair.of(run, base[1]), k, noise, level) for run in cand[1:]]
    if len(tests) == 1 and not against_start:
        return tests[0]
    # A third run passes or fails with the others wherever it exists (the loop trains one only against the start).
    (stat, reasons), *other = sorted(tests, key=lambda t: -t[0].p)
    update = {"second_stage": other[0][0].stage2 if other else None}
    if against_start:
        update |= {
            "against": "the round's starting policy: a control run carries an exploit",
            "start_accuracy": sum(start.values()) / max(1, len(start)),
        }
    reasons = sorted({*reasons, *(r for _, rs in other for r in rs)})
    return stat.model_copy(update=update), reasons + ([] if other or not against_start else ["no_second_confirmation"])


def single_stage(pairs: list[Pair], noise: Noise, level: float) -> list[tuple[SignHolm, list[str]]]:
    """Without a confirmation (gate.statistic sign): each candidate's p under the noise model, Holm-
    corrected across the round's candidates, so the round's chance of a false promotion stays at most
    1 - level whatever K is."""
    ps = [p_value(p, noise) for p in pairs]
    order = sorted(range(len(ps)), key=lambda j: ps[j])
    passed, alpha = set(), 1 - level
    for r, j in enumerate(order):
        if ps[j] > alpha / (len(ps) - r):
            break
        passed.add(j)
    out = []
    for j, pair in enumerate(pairs):
        stat = SignHolm(
            level=level,
            candidates=len(pairs),
            p=ps[j],
            phi=noise.phi,
            noise_pairs=noise.pairs,
            dof=noise.dof,
            **pair_figures(pair),
        )
        reasons = ([] if noise.valid else ["no_valid_noise_estimate"]) + ([] if j in passed else ["no_supported_gain"])
        out.append((stat, reasons))
    return out


def arm_evidence(
    store: RolloutStore, suite: Suite, branch: str, first: int, last: int, shared: Harness
) -> ArmEvidence:
    """Run the suite over an arm's window (its findings are stored: they are evidence; a validity
    finding the arm's own reward does not pay is already demoted by the suite), and read its train-audit
    statistics with every rollout rescored under one reward function, `shared` (the control's harness):
    a candidate's own reward is not comparable with the control's (a length penalty climbs as
    completions shorten), so the rise and the reward-audit gap are measured in the same units on both."""
    findings = suite.run(store, branch, first, last)
    store.append_findings(findings, suite.version, shard_id(branch, last, GATE), branch, first, last)
    cols = load_columns(
        store,
        list(shared.reward_weights),
        where=f"branch = {sql_str(branch)} AND split = 'train' AND step BETWEEN {int(first)} AND {int(last)}",
    )
    if not len(cols):
        return ArmEvidence(0.0, None, None, findings)
    total = total_reward(shared, cols.terms, cols.completion_tokens, cols.max_action_tokens, cols.termination)
    steps = np.unique(cols.step)
    third = max(1, len(steps) // 3)
    rise = float(total[cols.step >= steps[-third]].mean() - total[cols.step <= steps[third - 1]].mean())
    audited = ~np.isnan(cols.audit)
    rewarded = audited & (total >= suite.rewarded_threshold())
    gap = float((cols.audit[rewarded] == 0).mean()) if rewarded.any() else None
    return ArmEvidence(rise, float(cols.audit[audited].mean()) if audited.any() else None, gap, findings)


# -- the invalid-branch rules: pure functions of findings and decisions, each with a unit test ----------------
def invalid_reasons(findings: list[Finding]) -> list[str]:
    """Why an arm's own window makes it invalid: its validity findings, as sorted `validity:NAME`. The
    control (the harness carried on) is rejected for these like a candidate would be: an exploit the
    reward pays and the audit does not back."""
    return sorted({f"validity:{f.name}" for f in findings if f.validity})


def tainted(segment_findings: list[Finding]) -> list[str]:
    """The validity findings of the segment's own window. A tainted segment is not built on: the round's
    arms fork from where the round started, so a remedy is tried on a policy the exploit never touched."""
    return sorted({f.name for f in segment_findings if f.validity})


def aa_pair_valid(control_findings: list[Finding], aa_findings: list[Finding]) -> bool:
    """Two arms that carry an exploit differ by how fast it spread in each, not by the run's noise: such
    a pair is no A-A measurement (it is taken again next round)."""
    return not invalid_reasons(control_findings) and not invalid_reasons(aa_findings)


def finalist_noise(mainline: Noise, own: Noise | None) -> tuple[Noise, str]:
    """The noise model the finalist is tested under, and whose harness measured it: the noisier of the mainline's
    A-A pairs and the finalist's own two runs (its race and confirmation runs, on different seeds from one
    checkpoint: an A-A pair of its harness; neither may carry an exploit). A harness can spread the policy more
    than the mainline's does: on benchmarks/gate_calibration.py's digits arms, a learning rate that puts the start
    on a learning transition sends runs of one harness anywhere from 0.09 to 1.0, while the mainline's pairs
    measured phi near 1; tested under the mainline's noise alone, that harness raced against itself was promoted
    in 0.7-1.3% of first rounds (nominal 1.25%) and 3-5% of runs (nominal 5%), half that under the noisier of the
    two. Where the mainline measured nothing (its control carries an exploit, so its replicate is no A-A
    measurement: aa_pair_valid; or its runs agreed on every gate task), the fix could otherwise never be promoted.
    The race picked the luckier of the finalist's seeds, which can only widen its pair's spread: the test it feeds
    is, if anything, stricter."""
    if own is None or not own.valid or (mainline.valid and own.phi <= mainline.phi):
        return mainline, "mainline"
    return own, "candidate"


def winner(decisions: list[tuple[str, float]]) -> int | None:
    """Of the candidates' (decision, delta), the 1-based index of the promoted one with the largest delta
    (the later one on a tie); None when nothing was promoted. At most one winner a round."""
    wins = [(delta, j) for j, (decision, delta) in enumerate(decisions, 1) if decision == "promote"]
    return max(wins)[1] if wins else None


def rolls_back(promoted: bool, control_invalid: list[str]) -> bool:
    """Nothing valid won and the control carries an exploit: the mainline goes back to where the round
    started (the segment and control stay in the ledger and the store as evidence)."""
    return not promoted and bool(control_invalid)


# The gate's own validity reasons besides the `validity:NAME` of a finding (validity_reasons).
INVALIDITY = ("reward_audit_gap_widened", "reward_up_audit_flat")


class Remedy(NamedTuple):
    """A raced candidate as gate.repair weighs it."""

    finding: str
    """The finding its hypothesis names."""
    reasons: list[str]
    """Its verdict's reasons."""
    runs: list[Outcomes]
    """Its gate outcomes on each of its runs: the race's where it ended, then the confirmation's."""
    harness: Harness
    """Its harness (the learning rate it trains at is what the choice weighs)."""


def repair(
    control_invalid: list[str],
    exploits: set[str],
    cands: list[Remedy],
    start: Outcomes | None,
    noise: Noise,
    level: float,
) -> int | None:
    """Nothing won and the control carries an exploit (`control_invalid`, its `validity:NAME` reasons): the 1-based
    index of the candidate whose harness the mainline adopts instead, a repair, not a promotion; None when none
    qualifies. A candidate qualifies when it was proposed for the exploit (its hypothesis names one of `exploits`,
    the validity findings of the round's segment and control: a change proposed for anything else is no remedy of
    it, however its runs read), no validity reason is against it on any run, and no run is significantly below the
    policy the arms forked from (`regression`, the guard every new head passes). Of those, the smallest step whose
    race read is not clearly behind the best race read (the race's own rule, stopping.futile's sign test at BEHIND_P);
    on equal steps the better read, then the earlier.

    Why adopt a harness that did not win: the harness it replaces pays an exploit, so the mainline cannot train on
    under it (each segment would be thrown away), and the static run under it is what the claims cells showed
    collapsing. The repaired harness earns no claim of a gain; its training is diagnosed like any segment's.

    Why the smaller step unless the larger is clearly ahead: the two steps (proposers/hedges.py) are read once
    each, after one trial's tokens, and the run trains under the one adopted to its end. A step set for the reward
    that paid the exploit is no evidence for the new one, and where the larger was taken on a better read within
    the reads' noise the run ended lower: swe_short_300k on an AVX-512 Xeon, the seeds that repaired at the naive
    5e-4 ended 0.063 below the reference and those at the halved step 0.008; on an AVX2 EPYC, 0.765 and 0.775 at
    the naive step against 0.855 and 0.805 at the halved one (HISTORY.md, "Remedies race the start")."""
    if not control_invalid or start is None:
        return None
    ok = []
    for j, c in enumerate(cands, 1):
        if c.finding not in exploits:
            continue
        if any(r.startswith("validity:") or r in INVALIDITY for r in c.reasons):
            continue
        if not c.runs or any(regression(o, start, noise, level) is not None for o in c.runs):
            continue
        ok.append(j)
    if not ok:
        return None

    def read(j: int) -> float:
        return sum(cands[j - 1].runs[0].get(t, False) for t in start) / max(1, len(start))

    top = max(ok, key=lambda j: (read(j), -j))  # the best race read, the earlier on a tie

    def behind(j: int) -> bool:
        pair = Pair.of(cands[j - 1].runs[0], cands[top - 1].runs[0])
        return sign_p(pair.losses, pair.wins) <= BEHIND_P

    step = {j: cands[j - 1].harness.optimizer.learning_rate for j in ok}
    return min((j for j in ok if not behind(j)), key=lambda j: (step[j], -read(j), j))


def regression(head: Outcomes, start: Outcomes | None, noise: Noise, level: float) -> Regression | None:
    """The regression guard: the round's new head (the winner or the control) significantly below the policy the
    round's arms forked from on the gate tasks, paired, under the run's noise model (never below the exact sign
    test's p) at the gate's level; None when it is not (or there is no start read). Such a head is rolled back:
    a mainline that fell and stays down is what the claims cells showed without it."""
    if start is None:
        return None
    p = p_value(Pair.of(start, head), noise)
    if p > 1 - level:
        return None
    pair = Pair.of(head, start)
    n = max(1, pair.n)
    return Regression(
        **pair_figures(pair),
        p=p,
        phi=noise.phi,
        level=level,
        # On the tasks both read (a guard's read of gate.checkpoint_tasks against an arm's of them all).
        head_accuracy=sum(head[t] for t in start if t in head) / n,
        start_accuracy=sum(v for t, v in start.items() if t in head) / n,
    )


def fell(
    start: Outcomes | None,
    control: Outcomes,
    runs: list[tuple[Outcomes, dict[str, str], str, int]],
    noise: Noise,
    level: float,
    exploit: bool,
) -> list[Finding]:
    """What the gate saw on a candidate besides its window: a `heldout_regression` finding where one of its runs is
    significantly below the policy the arms forked from on the gate tasks (`regression`, at the regression guard's
    gate.level, not a raced round's share of the run's error rate: it promotes nothing) while the control did not
    fall (or fell to the exploit it carries, `exploit`), naming the learning rate: a change that leaves the start's
    skills behind within a trial took steps too large for it (SWE's regrade at the naive 5e-4, where the hand-tuned
    reference runs 2e-4). Each run is (its gate outcomes, its held-out rollout id by gate task, its branch, its last
    step); the evidence is the rollouts of tasks the start solved and the run lost. proposers/
    pairs.py reads it as a finding the change's own trial carried, and pairs the change with a smaller step."""
    if start is None or (not exploit and regression(control, start, noise, level) is not None):
        return []
    for outcomes, ids, branch, last in runs:
        if (reg := regression(outcomes, start, noise, level)) is None:
            continue
        where = f"where the arms forked ({reg.wins} won, {reg.losses} lost, p {reg.p:.3g}): the change's steps"
        return [regression_finding(reg, start, outcomes, ids, branch, last, where)]
    return []


def regression_finding(
    reg: Regression, start: Outcomes, head: Outcomes, ids: dict[str, str], branch: str, last: int, where: str
) -> Finding:
    """A head significantly below a read it is held against (`reg`: gate.regression of `head` against `start`) as a
    `heldout_regression` finding naming the learning rate; its evidence, the head's rollouts (`ids`, by task) of
    tasks the start solved and the head lost. `where` says what the start was, and what left it behind."""
    lost = [ids[t] for t in start if start[t] and t in head and not head[t] and t in ids]
    return Finding(
        name="heldout_regression",
        severity="critical",
        value=reg.head_accuracy - reg.start_accuracy,
        threshold=1.0 - reg.level,
        evidence=tuple(lost[:5]),
        knobs=("optimizer.learning_rate",),
        message=f"{branch} read {reg.head_accuracy:.3f} on the gate tasks against {reg.start_accuracy:.3f} {where} "
        "left what the policy knew behind",
        branch=branch,
        last_step=last,
    )
