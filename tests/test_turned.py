"""A knob move whose trial fell significantly below its control turns the search away from it (moves.turned,
pairs.py): on swe_short_300k every seed raced the exploratory learning rate x10 (0.06-0.25 on the gate tasks against
a control near 0.8), then spent its next trial round on x10 again, paired with a remedy for the dead groups that the
collapse itself made."""

from __future__ import annotations

import pytest

from evotrainer.backtest.verdict import RaceResult, TwoStage
from evotrainer.diagnostics.detector import Finding
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Hypothesis, Intervention
from evotrainer.proposers.brief import fell
from evotrainer.proposers.heuristic import HeuristicProposer, candidates_for, explore
from evotrainer.proposers.pairs import pairs
from evotrainer.proposers.proposer import Brief, PastTrial, fallen

LR = "optimizer.learning_rate"
EXPLORE = Hypothesis(finding="explore", signal="heldout/accuracy", direction="up")
# A finding the collapsed window carried and the control's did not, naming another knob the catalog can move.
ERRORS = Finding("tool_errors", "warning", 1.0, 0.5, ("r03-c1-000001-0",), ("multi_turn.tool_error",), "planted")


def _trial(iv: Intervention, h: Harness, down: bool, harness: str | None = None) -> PastTrial:
    return PastTrial(
        3, iv.bind(h), (), "reject", ("stopped_early",), -0.73 if down else -0.02,
        harness=h.version if harness is None else harness, new_findings=(ERRORS,), fell=down,
    )  # fmt: skip


def _lr_moves(brief: Brief) -> list[float]:
    return [iv.value for iv in explore(brief.harness, [], fallen(brief)) if iv.target == LR]


def test_an_exploratory_step_that_fell_turns_the_knob_the_other_way_and_is_not_paired():
    h = Harness()
    v = h.optimizer.learning_rate
    up = Intervention(kind="set_knob", target=LR, value=v * 10, hypothesis=EXPLORE)
    # Rejected without falling (too little good): paired with the catalog's tool_errors remedy, and the ladder goes on
    # up (x10 itself is screened out as an exploratory move already rejected).
    calm = Brief("t", 4, "swe", h, [], (), history=[_trial(up, h, down=False)], limit=1, explore=0.34)
    assert [p.paired.target for p in pairs(calm, candidates_for)] == ["multi_turn.tool_error"]
    assert HeuristicProposer().propose(calm).proposals[0].source == "pair"
    assert _lr_moves(calm)[:2] == [pytest.approx(v * 10), pytest.approx(v * 3)]
    # Fell (the policy collapsed): no pair, no step at least as far up, the finer rung down first, the decade last.
    hurt = Brief("t", 4, "swe", h, [], (), history=[_trial(up, h, down=True)], limit=1, explore=0.34)
    assert pairs(hurt, candidates_for) == []
    moves = _lr_moves(hurt)
    assert moves[0] == pytest.approx(v / 3) and moves[-1] == pytest.approx(v / 10)
    assert all(x < v * 10 for x in moves) and any(x > v for x in moves)  # x3 up is still tried, after x0.3
    [first] = HeuristicProposer().propose(hurt).proposals
    assert (first.source, first.intervention.target, first.intervention.value) == ("explore", LR, moves[0])
    # Only from the harness it fell on: a mainline that has moved on explores afresh.
    elsewhere = Brief("t", 4, "swe", h, [], (), history=[_trial(up, h, down=True, harness="h-another")])
    assert _lr_moves(elsewhere)[0] == pytest.approx(v * 10)


def test_a_remedy_a_finding_asked_for_that_fell_is_still_paired():
    """SWE's regrade fell below the start at the naive learning rate and won with it lowered: a change a standing
    finding asked for keeps its pair; only a move no finding asked for is taken to have gone the wrong way."""
    h = Harness()
    hyp = EXPLORE.model_copy(update={"finding": "entropy_collapse"})
    hot = Intervention(kind="set_knob", target="sampling.temperature", value=1.3, hypothesis=hyp)
    collapse = Finding("entropy_collapse", "warning", 1.0, 0.5, ("r03-c1-000001-0",), ("sampling.temperature",), "x")
    brief = Brief("t", 4, "swe", h, [collapse], (), history=[_trial(hot, h, down=True)])
    assert [p.paired.target for p in pairs(brief, candidates_for)] == ["multi_turn.tool_error"]
    assert fallen(brief) == {"sampling.temperature": (1.3,)}  # and its knob turns too


@pytest.mark.parametrize(("wins", "losses", "down"), [(3, 62, True), (10, 14, False), (14, 10, False), (0, 0, False)])
def test_a_verdict_fell_where_its_sign_test_puts_the_candidate_below_at_its_level(wins, losses, down):
    race = RaceResult(level=0.95, delta=(wins - losses) / 100, candidates=1, wins=wins, losses=losses, n=100)
    assert fell(race) is down
    # A verdict with no paired figures of its own (the two-stage test's) says nothing here.
    figures = {"wins": wins, "losses": losses, "n": 100, "delta": race.delta}
    two = TwoStage(
        level=0.95, delta=race.delta, candidates=1, p=0.5, phi=1.0, noise_pairs=0, dof=1.0,
        stage1=figures | {"p_adjusted": 0.5}, stage2=figures | {"p": 0.5}, selected_delta=race.delta,
    )  # fmt: skip
    assert fell(two) is False
