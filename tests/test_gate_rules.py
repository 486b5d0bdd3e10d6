"""The invalid-branch rules of the gate, one unit test each, on constructed findings and decisions: a
control rejected for an exploit, a tainted segment not built on, an A-A pair that carries an exploit not
taken as noise, at most one winner, and a rollback when nothing valid won and the control is invalid."""

from __future__ import annotations

import numpy as np
import pytest

from evotrainer.backtest import gate
from evotrainer.backtest.statistics import Noise, Pair
from evotrainer.diagnostics.detector import Finding
from evotrainer.harness.harness import Harness
from evotrainer.ids import branch_id, trial_id
from evotrainer.stages.results import Rollback


def finding(name: str, validity: bool, severity: str = "critical") -> Finding:
    return Finding(
        name=name,
        severity=severity,
        value=1.0,
        threshold=0.5,
        evidence=("r-1",),
        knobs=("reward_weights.x",),
        message=name,
        validity=validity,
    )


def test_a_control_is_invalid_for_its_validity_findings_only():
    assert gate.invalid_reasons([]) == []
    assert gate.invalid_reasons([finding("plateau", False, "warning")]) == []
    found = [
        finding("test_tampering", True),
        finding("plateau", False),
        finding("reward_audit_gap", True),
        finding("test_tampering", True),
    ]
    assert gate.invalid_reasons(found) == ["validity:reward_audit_gap", "validity:test_tampering"]


def test_a_segment_with_a_validity_finding_is_tainted():
    assert gate.tainted([finding("truncation", False)]) == []
    assert gate.tainted([finding("hardcoded_examples", True), finding("truncation", False)]) == ["hardcoded_examples"]


def test_an_aa_pair_is_noise_only_when_neither_arm_carries_an_exploit():
    clean, dirty = [finding("plateau", False)], [finding("reward_hacking", True)]
    assert gate.aa_pair_valid(clean, clean) and gate.aa_pair_valid([], [])
    assert not gate.aa_pair_valid(dirty, clean)
    assert not gate.aa_pair_valid(clean, dirty)


def test_at_most_one_winner_the_largest_promoted_delta():
    assert gate.winner([]) is None
    assert gate.winner([("reject", 0.3), ("reject", 0.1)]) is None
    assert gate.winner([("reject", 0.30), ("promote", 0.05), ("promote", 0.08)]) == 3
    assert gate.winner([("promote", 0.08), ("promote", 0.08)]) == 2  # a tie goes to the later candidate


def test_rollback_when_nothing_valid_won_and_the_control_is_invalid():
    assert gate.rolls_back(promoted=False, control_invalid=["validity:test_tampering"])
    assert not gate.rolls_back(promoted=True, control_invalid=["validity:test_tampering"])
    assert not gate.rolls_back(promoted=False, control_invalid=[])


def test_branch_and_trial_ids_are_one_scheme():
    assert branch_id(0, "base") == "base"
    assert [branch_id(3, r) for r in ("segment", "control", "aa")] == ["r03-seg", "r03-ctl", "r03-aa"]
    assert branch_id(12, "candidate", 2) == "r12-c2" and trial_id(12, 2) == "r12-t2"
    assert [branch_id(12, r, 2) for r in ("replicate", "second_replicate")] == ["r12-c2r", "r12-c2r2"]


def test_a_remedy_for_an_exploiting_control_is_tested_under_its_own_harness_noise():
    """The control carries an exploit, so its replicate is no A-A pair and the mainline has no noise
    estimate: the finalist's own two runs (race and confirmation) measure it instead. Without that, the
    remedy for an exploit could never be promoted (the code domain's regrade won 32-0 and 33-0 and was
    rejected for `no_valid_noise_estimate`)."""
    none, measured = gate.moderated([]), gate.moderated([Pair(3, 2, 120)])
    own_pairs = [Pair(6, 3, 120)]  # the finalist's race run against its confirmation run
    own = gate.moderated(own_pairs)
    calm = gate.moderated([Pair(3, 3, 120)])  # the finalist's runs agreed better than the mainline's pair
    assert calm.valid and calm.phi < measured.phi < own.phi
    assert gate.finalist_noise(measured, calm) == (measured, "mainline")  # the noisier of the two
    assert gate.finalist_noise(measured, own) == (own, "candidate")
    assert gate.finalist_noise(none, own) == (own, "candidate")
    assert gate.finalist_noise(none, None) == (none, "mainline")  # nothing measured: still no estimate
    assert gate.finalist_noise(none, gate.moderated([])) == (none, "mainline")
    big = (Pair(32, 0, 120), Pair(33, 0, 120))
    _, reasons = gate.two_stage(*big, 1, none, 0.95)
    assert reasons == ["no_valid_noise_estimate"]
    stat, reasons = gate.two_stage(*big, 1, gate.finalist_noise(none, own)[0], 0.95)
    assert reasons == [] and stat.p < 1e-4
    # The stand-in is a noise estimate, not a pass: a small lead is still no supported gain under it, and a
    # wide spread between the finalist's own runs makes the test stricter.
    _, reasons = gate.two_stage(Pair(9, 5, 120), Pair(8, 5, 120), 1, own, 0.95)
    assert reasons == ["no_supported_gain"]
    wide = gate.moderated([Pair(30, 2, 120)])
    assert wide.phi > own.phi and gate.two_stage(Pair(20, 8, 120), Pair(18, 7, 120), 1, wide, 0.95)[0].p > (
        gate.two_stage(Pair(20, 8, 120), Pair(18, 7, 120), 1, own, 0.95)[0].p
    )


def outcomes(passed: set[int], n: int = 120) -> dict[str, bool]:
    return {f"t{i:03d}": i in passed for i in range(n)}


def test_beside_an_exploiting_control_a_remedy_must_beat_where_the_round_started():
    """Measured on the SWE claims' planted arm (seed 1): the control trained the exploit to 0.00 on the gate
    tasks, and a planted harness that trusts edited tests read 0.08 and 0.45 in its two runs, against the
    0.87 the round started from. Against the control it won (the gate promoted it: +0.45, p 0.001); against
    where the mainline would otherwise roll back to, it loses. The code domain's regrade (0.80 and 0.79,
    control 0.53, start 0.68) still passes."""
    own = gate.moderated([Pair(8, 3, 120)])
    start = outcomes(set(range(104)))  # 0.87
    dead = outcomes(set())  # the exploiting control and its replicate: 0.00
    planted = (outcomes(set(range(10))), outcomes(set(range(54))))  # 0.08, 0.45: nested in start's
    stat, reasons = gate.confirmed(planted, (dead, dead), None, 1, own, 0.95)
    assert reasons == [] and stat.delta > 0.4  # what comparing with the exploit promoted
    stat, reasons = gate.confirmed(planted, (dead, dead), start, 1, own, 0.95)
    assert "no_supported_gain" in reasons and stat.delta < 0 and stat.start_accuracy == 104 / 120
    code_start = outcomes(set(range(82)))  # 0.68
    regrade = (outcomes(set(range(96))), outcomes(set(range(95))), outcomes(set(range(94))))  # 0.80, 0.79, 0.78
    ctl = outcomes(set(range(64)))  # 0.53
    stat, reasons = gate.confirmed(regrade, (ctl, ctl), code_start, 1, own, 0.95)
    assert reasons == [] and stat.against.startswith("the round's starting policy")
    assert stat.stage2.delta == pytest.approx(12 / 120) and stat.second_stage.delta == pytest.approx(13 / 120)
    # Against the start, two runs are not enough (race._second_replicate_due trains the third).
    _, reasons = gate.confirmed(regrade[:2], (ctl, ctl), code_start, 1, own, 0.95)
    assert reasons == ["no_second_confirmation"]


def test_against_the_start_each_of_the_finalist_s_confirmation_runs_must_pass():
    """Two runs of a harness that spreads the policy (on the digits arms at a learning transition one harness's
    runs ended anywhere from 0.09 to 1.0) can both land high above the fixed start read; a third run that lands
    low is what shows the spread, and the finalist is not promoted on its two lucky runs."""
    start = outcomes(set(range(12)))  # 0.10
    high, low = outcomes(set(range(114))), outcomes(set(range(11)))  # 0.95, 0.09
    runs = [outcomes(set(range(120))), high]  # 1.00 and 0.95: they agree, their pair measures little spread
    own = gate.moderated([Pair.of(r, runs[0]) for r in runs[1:]])
    dead = outcomes(set())
    stat, reasons = gate.confirmed((*runs, high), (dead, dead), start, 1, own, 0.95)
    assert reasons == [] and stat.second_stage is not None
    spread = gate.moderated([Pair.of(r, runs[0]) for r in (high, low)])
    assert spread.phi > 5 * own.phi  # the third run widens the finalist's own noise...
    stat, reasons = gate.confirmed((*runs, low), (dead, dead), start, 1, spread, 0.95)
    assert "no_supported_gain" in reasons and stat.stage2.delta < 0  # ...and its own test fails
    # A third run is never ignored: beside clean controls (the loop trains none there) it must pass as well.
    ctl = outcomes(set(range(12)))
    stat, reasons = gate.confirmed((*runs, low), (ctl, ctl), start, 1, spread, 0.95, exploits=(False, False))
    assert "no_supported_gain" in reasons and stat.second_stage is not None and stat.against is None
    _, reasons = gate.confirmed((*runs, high), (ctl, ctl), start, 1, own, 0.95, exploits=(False, False))
    assert reasons == []


def test_an_exploit_appearing_in_a_control_run_mid_trial_is_not_the_comparator():
    """The segment was clean, so the arms forked from its end; the exploit appeared during the trial, in the
    control replicate only. The confirmation is then compared with the policy the arms forked from (read every
    round), not with the exploiting run; the race's clean control stays the race's comparator."""
    start = outcomes(set(range(60)))  # 0.50, where the arms forked from
    control = outcomes(set(range(58)))  # clean, about where it started
    exploiting = outcomes(set())  # the replicate trained the exploit: 0.00 on the gate tasks
    cand = (outcomes(set(range(59))), outcomes(set(range(57))))  # no better than the start
    base, against_start = gate.comparators((control, exploiting), (False, True), start)
    assert base == (control, start) and against_start
    assert gate.comparators((control, exploiting), (False, False), start) == ((control, exploiting), False)
    assert gate.comparators((control, exploiting), (False, True), None) == ((control, exploiting), False)
    own = gate.moderated([Pair(8, 3, 120)])
    # Against the exploiting replicate the confirmation wins 57-0 and the finalist would be promoted.
    _, reasons = gate.confirmed(cand, (control, exploiting), None, 1, own, 0.95)
    assert reasons == []
    stat, reasons = gate.confirmed(cand, (control, exploiting), start, 1, own, 0.95, exploits=(False, True))
    assert "no_supported_gain" in reasons and stat.stage2.delta < 0 and stat.stage1.delta > 0
    assert stat.start_accuracy == 0.5 and stat.against


def test_a_head_significantly_below_the_rounds_start_rolls_back():
    """The regression guard (math seed 3's claims cell fell 0.123 -> 0.063 and stayed down): a head that lost
    tasks the start solved, well past the run's noise, is a regression with its statistic; a head within the
    noise of the start, or a run without a start read, is not. promote() rolls back on it (stages/decide.py),
    and the Rollback record carries the statistic, written only when there is one."""
    noise = gate.moderated([Pair(6, 4, 120)])
    start = outcomes(set(range(30)))  # 0.25
    fell = outcomes(set(range(12)))  # 0.10: 18 tasks lost, none won
    reg = gate.regression(fell, start, noise, 0.95)
    assert reg is not None and reg.losses == 18 and reg.wins == 0 and reg.p < 0.01 and reg.delta < 0
    assert (reg.head_accuracy, reg.start_accuracy) == (12 / 120, 30 / 120)
    assert gate.regression(outcomes(set(range(2, 31))), start, noise, 0.95) is None  # 1 won, 2 lost: noise
    assert gate.regression(fell, None, noise, 0.95) is None
    back = Rollback(branch="r01-ctl", reasons=["regression"], rolled_back_to="r00-base", regression=reg)
    assert Rollback.model_validate_json(back.model_dump_json()).regression == reg
    assert "regression" not in Rollback(branch="b", reasons=["validity:x"], rolled_back_to="a").model_dump()


def test_an_invalid_control_is_repaired_by_a_valid_remedy_for_its_exploit_that_is_not_below_the_start():
    """Nothing won and the control pays an exploit: the mainline takes the harness of a raced candidate proposed for
    an exploit of the round (its hypothesis names one), that carries no validity reason and has no run significantly
    below the start; the best race read wins. Every other candidate leaves the rollback as it was."""
    noise = gate.moderated([Pair(6, 4, 120)])
    start = outcomes(set(range(30)))
    level, bad = 0.95, ["validity:test_tampering"]
    seen = {"test_tampering", "collection_errors"}  # the segment's and the control's validity findings
    near = outcomes(set(range(2, 31)))  # 1 won, 2 lost against the start: within the noise
    fell = outcomes(set(range(12)))  # 18 lost: a regression
    Remedy = gate.Remedy
    at = {r: Harness(optimizer={"learning_rate": r}) for r in (5e-4, 2.5e-4)}
    # The segment's exploit, not the control's: still one.
    fix = Remedy("collection_errors", ["no_supported_gain"], [near], at[5e-4])
    assert gate.repair(bad, seen, [fix], start, noise, level) == 1
    assert gate.repair([], seen, [fix], start, noise, level) is None  # a valid control needs no repair
    assert gate.repair(bad, seen, [fix], None, noise, level) is None  # no start read: nothing to compare with
    assert gate.repair(bad, seen, [fix._replace(finding="plateau")], start, noise, level) is None
    for reason in ("validity:test_tampering", "validity:tool_errors", *gate.INVALIDITY):
        assert gate.repair(bad, seen, [fix._replace(reasons=["not_confirmed", reason])], start, noise, level) is None
    assert gate.repair(bad, seen, [fix._replace(reasons=["stopped_early"], runs=[fell])], start, noise, level) is None
    assert gate.repair(bad, seen, [fix._replace(runs=[near, fell])], start, noise, level) is None  # a run fell
    assert gate.repair(bad, seen, [fix._replace(runs=[])], start, noise, level) is None
    better = Remedy("test_tampering", ["not_confirmed"], [outcomes(set(range(33)))], at[5e-4])
    assert gate.repair(bad, seen, [fix, better], start, noise, level) == 2
    assert gate.repair(bad, seen, [fix, fix], start, noise, level) == 1  # a tie goes to the earlier candidate


def test_a_repair_takes_the_smaller_step_unless_the_larger_reads_clearly_ahead():
    """The remedy raced at its step and hedged at half of it (proposers/hedges.py), each read once on the gate tasks:
    the repair takes the smaller step unless the larger one's read is clearly ahead of it (the race's sign test at
    BEHIND_P), whichever comes first and whichever reads higher within that."""
    noise = gate.moderated([Pair(6, 4, 120)])
    start = outcomes(set(range(30)))
    at = {r: Harness(optimizer={"learning_rate": r}) for r in (5e-4, 2.5e-4)}
    bad, seen = ["validity:test_tampering"], {"test_tampering"}
    naive = gate.Remedy("test_tampering", ["no_supported_gain"], [outcomes(set(range(33)))], at[5e-4])
    # Three tasks below the naive step's read (0 won, 3 lost: sign-test p 0.125): within the noise, the hedge.
    hedged = gate.Remedy("test_tampering", ["no_supported_gain"], [outcomes(set(range(30)))], at[2.5e-4])
    assert gate.repair(bad, seen, [naive, hedged], start, noise, 0.95) == 2
    assert gate.repair(bad, seen, [hedged, naive], start, noise, 0.95) == 1
    # Six below (p 0.016): the naive step is clearly ahead, and the repair takes it.
    low = hedged._replace(runs=[outcomes(set(range(27)))])
    assert gate.repair(bad, seen, [naive, low], start, noise, 0.95) == 1
    # A smaller step that does not qualify (a validity reason against it) is no choice.
    assert gate.repair(bad, seen, [naive, hedged._replace(reasons=["validity:x"])], start, noise, 0.95) == 1


def test_a_candidate_run_significantly_below_the_start_is_a_finding_on_the_learning_rate():
    """gate.fell: a candidate run that lost, well past the noise, tasks the start solved, while the control held (or
    fell to its exploit), is a `heldout_regression` finding naming the learning rate, citing the held-out rollouts
    of the tasks it lost; a run within the noise, or a control that fell without an exploit, makes none."""
    noise = gate.moderated([Pair(6, 4, 120)])
    start = outcomes(set(range(30)))
    ids = {t: f"r01-c1-e000010-{i:04d}" for i, t in enumerate(start)}
    near, fell = outcomes(set(range(2, 31))), outcomes(set(range(12)))
    [f] = gate.fell(start, start, [(near, ids, "r01-c1", 10), (fell, ids, "r01-c1r", 11)], noise, 0.95, False)
    assert (f.name, f.knobs, f.validity, f.branch, f.last_step) == (
        "heldout_regression",
        ("optimizer.learning_rate",),
        False,
        "r01-c1r",
        11,
    )
    assert f.value == pytest.approx(12 / 120 - 30 / 120)
    assert f.evidence == tuple(ids[f"t{i:03d}"] for i in range(12, 17))  # the first tasks it lost, by id
    assert gate.fell(start, start, [(near, ids, "r01-c1", 10)], noise, 0.95, False) == []
    assert gate.fell(None, start, [(fell, ids, "r01-c1", 10)], noise, 0.95, False) == []
    assert gate.fell(start, fell, [(fell, ids, "r01-c1", 10)], noise, 0.95, False) == []  # the control fell too
    assert gate.fell(start, fell, [(fell, ids, "r01-c1", 10)], noise, 0.95, True)  # ... to the exploit it carries


def test_a_confirmation_runs_only_where_it_could_pass_and_its_power_is_the_gates_own_pass_rate():
    """gate.confirmation_power is the rate at which confirmation runs drawn at the race's own effect (the race's
    discordant tasks, split at its win share) pass gate.two_stage at the round's level, under the noise model with
    the pair the confirmation brings (one more degree of freedom): checked against two_stage itself on drawn runs. A
    strong race is worth its confirmation, a weak one is not (the trial skips it), and against the start two runs
    must each pass."""
    rng = np.random.default_rng(0)
    noise, level = gate.moderated([Pair(6, 4, 100)]), 1 - 0.0125
    after = Noise(noise.phi, noise.pairs + 1, noise.dof + 1)
    for race in (Pair(22, 8, 100), Pair(18, 8, 100), Pair(40, 15, 250)):
        m, n = race.discordant, 4000
        drawn = rng.binomial(m, race.wins / m, n)
        passed = sum(not gate.two_stage(race, Pair(int(w), m - int(w), race.n), 2, after, level)[1] for w in drawn)
        assert abs(passed / n - gate.confirmation_power(race, 2, noise, level)) < 0.03
    # With no pair banked yet (the prior alone) the test stands on the pair the confirmation brings: a 13-2 race
    # (swe_short_300k seed 8's round 1) is worth its confirmation, at the rate two_stage passes such runs.
    prior, race = gate.moderated([]), Pair(13, 2, 100)
    first = Noise(prior.phi, prior.pairs + 1, prior.dof + 1)
    drawn = rng.binomial(race.discordant, race.wins / race.discordant, 4000)
    passed = sum(not gate.two_stage(race, Pair(int(w), 15 - int(w), 100), 2, first, level)[1] for w in drawn)
    assert gate.confirmation_power(race, 2, prior, level) > 0.5
    assert abs(passed / 4000 - gate.confirmation_power(race, 2, prior, level)) < 0.03
    strong, weak = Pair(30, 5, 100), Pair(14, 8, 100)
    assert gate.confirmation_power(strong, 2, noise, level) > 0.95
    assert gate.confirmation_power(weak, 2, noise, level) < gate.CONFIRM_POWER_MIN
    assert gate.confirmation_power(Pair(8, 8, 100), 1, noise, level) == 0.0  # not ahead: nothing to confirm
    # Against the start two runs must each pass, and both bring a pair: each run's chance at two more degrees
    # of freedom.
    one = gate.confirmation_power(Pair(22, 8, 100), 2, after, level)
    assert 0 < gate.confirmation_power(Pair(22, 8, 100), 2, noise, level, runs=2) == pytest.approx(one**2)
    # A looser round (its level) makes the same race worth more; more candidates (the race's adjustment), less.
    assert gate.confirmation_power(Pair(18, 8, 100), 2, noise, 0.95) > gate.confirmation_power(
        Pair(18, 8, 100), 2, noise, level
    )
    assert gate.confirmation_power(Pair(18, 8, 100), 4, noise, level) < gate.confirmation_power(
        Pair(18, 8, 100), 1, noise, level
    )
