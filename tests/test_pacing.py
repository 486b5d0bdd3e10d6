"""The trial share paced over the run (loop.trial_phases): by the end of part p discarded arms, confirmations
included, have taken at most p / phases of the share; a part that spends less leaves it to the later ones; one
part is the unpaced share."""

from __future__ import annotations

import functools

import pytest

from evotrainer.config import RunConfig
from evotrainer.stages.race import race_size
from evotrainer.stages.spend import race_allowance

SHARE, BUDGET = 250_000.0, 1_000_000


def _fits(discarded: int, spent: int, phases: int, race: int, confirm: int, share: float = SHARE) -> bool:
    return race <= race_allowance(share, discarded, confirm, spent, BUDGET, phases)


def test_one_part_is_the_whole_share_less_the_discarded_and_the_confirmation():
    for spent in (0, 16_000, 500_000, 999_999):
        assert race_allowance(SHARE, 97_000, 81_000, spent, BUDGET, 1) == pytest.approx(SHARE - 97_000 - 81_000)


def test_a_part_reaches_its_portion_of_the_share_and_the_last_part_all_of_it():
    # At the start of the run the first of three parts reaches a third of the share, confirmation included ...
    assert race_allowance(SHARE, 0, 81_000, 0, BUDGET, 3) == pytest.approx(SHARE / 3 - 81_000)
    # ... and no more as the part goes by: what it discarded comes off its own portion.
    assert race_allowance(SHARE, 50_000, 0, 300_000, BUDGET, 3) == pytest.approx(SHARE / 3 - 50_000)
    # Nothing spent in the first part: the second reaches two thirds, the third all of it.
    assert race_allowance(SHARE, 0, 81_000, BUDGET // 3 + 1, BUDGET, 3) == pytest.approx(2 * SHARE / 3 - 81_000)
    assert race_allowance(SHARE, 0, 81_000, 2 * BUDGET // 3 + 1, BUDGET, 3) == pytest.approx(SHARE - 81_000)
    # Past the budget (a trial stage that still runs) there is nothing to pace.
    assert race_allowance(SHARE, 0, 81_000, BUDGET + 5, BUDGET, 3) == pytest.approx(SHARE - 81_000)


def test_a_spent_share_leaves_nothing_to_race_in_any_part():
    for phases in (1, 3):
        assert race_allowance(SHARE, 200_000, 81_000, 700_000, BUDGET, phases) < 0
        assert race_allowance(SHARE, 169_000, 81_000, 700_000, BUDGET, phases) == pytest.approx(0.0)


def _confirmed_trials(share: float, phases: int) -> list[int]:
    """The third of the run each trial starts in, when every race is confirmed. Costs as in the README main job's
    ledger: a 20-step arm is ~27k tokens, a round trains ~43k on the mainline, a race of two candidates whose
    winner is confirmed discards ~97k (rounds 1 and 7 of the main job were confirmed: with the confirmation
    unpaced, rounds 8-19 raced nothing)."""
    full, seg = 27_000, 43_000
    spent, discarded, raced = 15_000, 0, []
    while spent + seg < BUDGET:
        fits = functools.partial(_fits, discarded, spent, phases, share=share * BUDGET)
        k = race_size(2, full, True, False, True, fits)
        cost = 97_000 if k else 0
        if k:
            raced.append(spent * 3 // BUDGET)
        discarded, spent = discarded + cost, spent + seg + cost
    return raced


def test_paced_trials_confirm_in_every_third_where_the_unpaced_share_runs_out_early():
    assert _confirmed_trials(0.33, 3) == [0, 1, 2]  # one confirmed trial in each third
    assert _confirmed_trials(0.33, 1) == [0, 0, 0]  # unpaced, three in the first rounds and the share is gone
    # At a quarter of the budget the first third's portion (83k) cannot hold a confirmed trial (about 95k at
    # one candidate): the round that finds the learning rate races nothing, which is why examples/math.yaml's
    # share is a third.
    assert _confirmed_trials(0.25, 3) == [1, 2]


def test_trial_phases_must_be_a_positive_count():
    RunConfig.model_validate({"loop": {"trial_phases": 3}})
    with pytest.raises(ValueError, match="trial_phases"):
        RunConfig.model_validate({"loop": {"trial_phases": 0}})
