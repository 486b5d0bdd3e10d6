"""The gate's statistics and decisions on constructed outcomes: the exact sign test, the overdispersion
noise model, the multiple-comparison correction, the confirmation, the refusal without a noise estimate,
the race's futility rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evotrainer.backtest import gate, stopping
from evotrainer.backtest.statistics import Noise, Pair, bootstrap, combine, noise_of, p_value, sign_p


def outcomes(pattern: list[int]) -> dict[str, bool]:
    return {f"t{i:03d}": bool(v) for i, v in enumerate(pattern)}


def test_bootstrap_lower_bound_separates_a_real_gain_from_a_tie():
    rng = np.random.default_rng(0)
    ctrl = (rng.random(400) < 0.5).astype(float)
    better = ctrl.copy()
    better[np.flatnonzero(ctrl == 0)[:40]] = 1.0  # 40 more tasks solved, none lost: +0.10
    s = bootstrap(better, ctrl, 0.95, 2000, seed=1)
    assert s["delta"] == pytest.approx(0.10) and s["lower"] > 0.05
    tie = ctrl.copy()
    flip = rng.permutation(400)[:60]
    tie[flip] = 1 - tie[flip]  # as many gained as lost, at random
    assert bootstrap(tie, ctrl, 0.95, 2000, seed=1)["lower"] < 0


def test_the_sign_test_is_exact_where_a_bootstrap_is_permissive():
    assert sign_p(5, 1) == pytest.approx((math.comb(6, 5) + math.comb(6, 6)) / 2**6)
    # 4 tasks gained, none lost: the percentile bootstrap's lower bound is above 0 ...
    cand, ctrl = np.array([1, 1, 1, 1] + [0] * 96, float), np.zeros(100)
    assert bootstrap(cand, ctrl, 0.95, 2000, seed=0)["lower"] > 0
    # ... while the exact test says 1/16, not significant at 5%.
    assert sign_p(4, 0) == pytest.approx(0.0625)
    assert p_value(Pair(4, 0, 100), Noise(1.0, 3, 13.0)) >= 0.0625


def test_the_noise_model_floors_at_the_binomial_and_widens_with_overdispersion_moderated_by_a_prior():
    assert noise_of([], 10.0) == Noise(1.0, 0, 10.0) and not noise_of([], 10.0).valid
    # A-A pairs that split no more unevenly than coins: phi stays at its floor of 1.
    calm = noise_of([Pair(10, 10, 250), Pair(11, 9, 250)], 10.0)
    assert calm.phi == 1.0 and calm.pairs == 2 and calm.dof == 12.0
    # Run-level shifts (one run of the pair ahead on most of its discordant tasks) raise phi ...
    wild_pairs = [Pair(16, 4, 250), Pair(3, 15, 250)]
    wild = noise_of(wild_pairs, 10.0)
    # ... pooled with the prior of 10 pseudo-pairs at phi = 1, so one or two lucky draws do not decide it ...
    assert wild.phi == pytest.approx((10 + (12**2) / 20 + (12**2) / 18) / 12)
    # ... which fades as pairs accumulate: 1,000 such pairs measure their own phi.
    assert noise_of(wild_pairs * 500, 10.0).phi == pytest.approx(((12**2) / 20 + (12**2) / 18) / 2, rel=0.02)
    # ... and the same candidate's p with it.
    win = Pair(30, 14, 250)
    assert p_value(win, wild) > p_value(win, calm) >= sign_p(30, 14)
    # A pair with nothing discordant carries no information on phi: no pair, no validity, no degree of freedom.
    assert noise_of([Pair(0, 0, 250)], 10.0) == Noise(1.0, 0, 10.0) and not noise_of([Pair(0, 0, 250)], 10.0).valid
    assert noise_of([Pair(0, 0, 250), *wild_pairs], 10.0) == wild


def test_the_combination_needs_both_stages_and_is_monotone():
    assert combine(0.01, 0.01, 0.8) < 0.01  # two independent pieces of evidence add up
    assert combine(0.01, 0.6, 0.8) > 0.05  # a confirmation that does not confirm sinks it
    assert combine(0.02, 0.02, 0.8) < combine(0.02, 0.05, 0.8) < combine(0.05, 0.05, 0.8)


def test_the_finalist_is_the_race_winner_and_the_screen_counts_the_round_s_candidates():
    noise = Noise(1.0, 1, 11.0)
    strong, mild, behind = Pair(40, 15, 250), Pair(25, 15, 250), Pair(10, 20, 250)
    assert gate.finalist([mild, None, strong], noise) == (3, "")
    assert gate.finalist([behind, None], noise)[0] is None  # nobody finished ahead
    # The stage-1 p is Bonferroni-adjusted by K before the screen: the same race result is worth a
    # confirmation among 2 candidates and not among 16.
    weak = Pair(28, 17, 250)
    assert gate.finalist([weak, None], noise)[0] == 1
    assert gate.finalist([weak] + [None] * 15, noise)[0] is None


def test_multiple_comparisons_are_corrected_in_both_tests():
    noise = Noise(1.0, 2, 12.0)
    race, confirm = Pair(30, 14, 250), Pair(26, 14, 250)
    one, _ = gate.two_stage(race, confirm, 1, noise, 0.95)
    four, reasons = gate.two_stage(race, confirm, 4, noise, 0.95)
    assert one.stage1.p_adjusted * 4 == pytest.approx(four.stage1.p_adjusted)
    assert four.p > one.p
    # Holm in the one-stage test: the same p passes alone and fails beside three others.
    borderline = Pair(25, 12, 250)
    p = p_value(borderline, noise)
    assert 0.0125 < p < 0.05
    assert gate.single_stage([borderline], noise, 0.95)[0][1] == []
    assert (
        "no_supported_gain"
        in gate.single_stage([borderline, Pair(1, 5, 250), Pair(2, 6, 250), Pair(0, 3, 250)], noise, 0.95)[0][1]
    )


def test_no_promotion_without_a_valid_noise_estimate():
    race, confirm = Pair(60, 10, 250), Pair(55, 10, 250)
    stat, reasons = gate.two_stage(race, confirm, 1, Noise(1.0, 0, 10.0), 0.95)
    assert reasons == ["no_valid_noise_estimate"] and stat.noise_pairs == 0
    stat, reasons = gate.two_stage(race, confirm, 1, Noise(1.0, 1, 11.0), 0.95)
    assert reasons == [] and stat.delta == confirm.delta and stat.selected_delta == race.delta


def test_the_recorded_effect_is_the_confirmation_s_not_the_selected_one():
    stat, reasons = gate.two_stage(Pair(50, 10, 250), Pair(30, 20, 250), 2, Noise(1.0, 1, 11.0), 0.95)
    # A strong race and a confirmation that leans the same way promote, with the effect the confirmation
    # measured (the race's 0.16 is the best of K, inflated by its selection).
    assert reasons == [] and stat.selected_delta == pytest.approx(0.16) and stat.delta == pytest.approx(0.04)
    stat, reasons = gate.two_stage(Pair(50, 10, 250), Pair(20, 22, 250), 1, Noise(1.0, 1, 11.0), 0.95)
    assert "no_supported_gain" in reasons  # a confirmation that goes the other way sinks any race


def test_the_race_stops_a_candidate_that_is_not_ahead_at_first_and_behind_later():
    ctrl = outcomes([1] * 60 + [0] * 40)
    tie = outcomes([1] * 60 + [0] * 40)
    ahead = outcomes([1] * 62 + [0] * 38)
    slightly_behind = outcomes([1] * 59 + [0] * 41)
    far_behind = outcomes([1] * 50 + [0] * 50)
    assert stopping.futile(tie, ctrl, first=True) and not stopping.futile(ahead, ctrl, first=True)
    # Later, trailing by one task goes on (a real gain can trail for a while); by ten it stops.
    assert not stopping.futile(slightly_behind, ctrl, first=False) and not stopping.futile(tie, ctrl, first=False)
    assert "behind" in stopping.futile(far_behind, ctrl, first=False)
    assert stopping.futile(far_behind, None, first=True) == ""  # the control itself never races
    # Against the start (a remedy beside a segment that carries an exploit): level or a task behind goes on at the
    # first checkpoint too; only clearly behind stops, and the reason names the start.
    start = ctrl
    assert not stopping.futile(tie, start, True, "start") and not stopping.futile(
        slightly_behind, start, True, "start"
    )
    assert stopping.futile(far_behind, start, True, "start").startswith("behind the start")
    assert stopping.futile(far_behind, start, False, "start").startswith("behind the start")


def test_the_noise_prior_is_centred_on_measured_dispersion_not_the_binomial_floor():
    # With no informative pair the model sits at the prior's centre (and is not valid: nothing measured it) ...
    empty = gate.moderated([])
    assert empty.phi == gate.PRIOR_PHI > 1.0 and not empty.valid
    # ... one pair at the binomial floor pulls it down by its weight only ...
    coin = gate.moderated([Pair(10, 10, 250)])
    assert coin.phi == pytest.approx((gate.BASE_DOF * gate.PRIOR_PHI) / (gate.BASE_DOF + 1))
    # ... and a harness whose pairs keep splitting like coins is measured at the floor in the end.
    assert gate.moderated([Pair(10, 10, 250)] * 2000).phi == pytest.approx(1.0, abs=0.01)
    # A win that clears a binomial prior can fail the measured one: the prior is what the gate spends.
    win = Pair(32, 14, 250)
    assert p_value(win, noise_of([Pair(10, 10, 250)], gate.BASE_DOF)) < p_value(win, coin)


def test_the_run_spends_its_error_rate_over_raced_rounds_and_earns_it_back_on_promotion():
    alpha = 0.05
    spent = [gate.round_alpha(alpha, t, []) for t in range(1, 2001)]
    # Half the initial wealth (alpha / 2) on the first raced round, less on each later one, and never more
    # than the initial wealth over a run that promotes nothing: the run's chance of a false promotion under
    # the null is bounded by what it spent.
    assert spent[0] == pytest.approx(alpha / 4) and all(a >= b for a, b in zip(spent, spent[1:], strict=False))
    assert sum(spent) <= alpha / 2 + 1e-12
    # A promotion in raced round 1 earns wealth: round 2 may spend more than without it; a second earns more.
    assert gate.round_alpha(alpha, 2, [1]) > gate.round_alpha(alpha, 2, []) > 0
    assert gate.round_alpha(alpha, 3, [1, 2]) > gate.round_alpha(alpha, 3, [1])
    # Only promotions before the round count (its own decision is not known when its level is set).
    assert gate.round_alpha(alpha, 2, [2, 5]) == gate.round_alpha(alpha, 2, [])


def test_a_win_near_the_boundary_promotes_at_the_round_level_but_not_at_the_run_s_first_share():
    """The gate near its decision boundary, not against a wrecked control: a confirmed win whose combined p
    lies between the run's first share (alpha / 4) and the per-round alpha."""
    noise = gate.moderated([Pair(12, 9, 250)])
    first = 1 - gate.round_alpha(0.05, 1, [])
    found = None
    for w in range(14, 40):
        stat, reasons = gate.two_stage(Pair(w, 12, 250), Pair(w, 12, 250), 1, noise, 0.95)
        if not reasons:
            found = w
            break
    assert found is not None
    stat, reasons = gate.two_stage(Pair(found, 12, 250), Pair(found, 12, 250), 1, noise, 0.95)
    assert 1 - first < stat.p <= 0.05 and reasons == []
    _, reasons = gate.two_stage(Pair(found, 12, 250), Pair(found, 12, 250), 1, noise, first)
    assert reasons == ["no_supported_gain"]
