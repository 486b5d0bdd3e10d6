"""The trial share paced over the run (loop.trial_phases): a race takes at most what falls to the part of
the token budget it starts in, a part that spends less leaves it to the later ones, a confirmation is never
paced, and one part is the unpaced share."""

from __future__ import annotations

import functools

import pytest

from evotrainer.config import RunConfig
from evotrainer.stages.race import race_size
from evotrainer.stages.spend import race_allowance

SHARE, BUDGET = 250_000.0, 1_000_000


def _fits(discarded: int, spent: int, phases: int, race: int, confirm: int) -> bool:
    return race <= race_allowance(SHARE, discarded, confirm, spent, BUDGET, phases)


def test_one_part_is_the_whole_share_less_the_discarded_and_the_confirmation():
    for spent in (0, 16_000, 500_000, 999_999):
        assert race_allowance(SHARE, 97_000, 81_000, spent, BUDGET, 1) == pytest.approx(SHARE - 97_000 - 81_000)


def test_a_part_takes_its_portion_of_what_is_left_and_the_last_part_takes_it_all():
    pool = SHARE - 81_000
    # At the start of the run the first of three parts may take a third of the pool ...
    assert race_allowance(SHARE, 0, 81_000, 0, BUDGET, 3) == pytest.approx(pool / 3)
    # ... and less of it as the part goes by, so a part cannot spend the later parts' portions.
    mid = race_allowance(SHARE, 0, 81_000, 200_000, BUDGET, 3)
    assert mid == pytest.approx(pool * (BUDGET / 3 - 200_000) / (BUDGET - 200_000)) and mid < pool / 3
    # Nothing spent in the first part: the second starts with half of all of it, the third with all of it.
    assert race_allowance(SHARE, 0, 81_000, BUDGET // 3 + 1, BUDGET, 3) == pytest.approx(pool / 2, rel=1e-4)
    assert race_allowance(SHARE, 0, 81_000, 2 * BUDGET // 3 + 1, BUDGET, 3) == pytest.approx(pool)
    # Past the budget (a trial stage that still runs) there is nothing to pace.
    assert race_allowance(SHARE, 0, 81_000, BUDGET + 5, BUDGET, 3) == pytest.approx(pool)


def test_a_spent_share_leaves_nothing_to_race_in_any_part():
    for phases in (1, 3):
        assert race_allowance(SHARE, 200_000, 81_000, 700_000, BUDGET, phases) < 0
        assert race_allowance(SHARE, 169_000, 81_000, 700_000, BUDGET, phases) == pytest.approx(0.0)


def test_paced_rounds_race_in_every_third_where_the_unpaced_share_runs_out_early():
    # Costs as in the README main job's ledger: a 20-step arm is ~27k tokens, a round trains ~43k on
    # the mainline, round 1 races two candidates and confirms the winner (97k discarded), a lost race
    # leaves ~8k a candidate.
    full, seg = 27_000, 43_000

    def run(phases: int) -> list[int]:
        spent, discarded, raced = 15_000, 0, []
        while spent + seg < BUDGET:
            k = race_size(2, full, True, False, True, functools.partial(_fits, discarded, spent, phases))
            cost = (97_000 if not raced else 8_000 * k) if k else 0
            if k:
                raced.append(spent * 3 // BUDGET)
            discarded, spent = discarded + cost, spent + seg + cost
        return raced

    assert set(run(3)) == {0, 1, 2}
    assert 2 not in run(1)  # unpaced, the share is gone before the last third


def test_trial_phases_must_be_a_positive_count():
    RunConfig.model_validate({"loop": {"trial_phases": 3}})
    with pytest.raises(ValueError, match="trial_phases"):
        RunConfig.model_validate({"loop": {"trial_phases": 0}})
