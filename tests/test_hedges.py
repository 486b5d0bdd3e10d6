"""The repair's step (proposers/hedges.py): where the segment carries an exploit, the round's first remedy for it also
races paired with the learning rate lowered, one more candidate, so the repair picks the step it trains on."""

from __future__ import annotations

import pytest
from test_loop import loop_config, quiet

from conftest import started_with
from evotrainer.diagnostics.detector import Finding, Window, finding
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Hypothesis, Intervention
from evotrainer.ids import branch_id
from evotrainer.proposers.hedges import hedge
from evotrainer.proposers.proposer import Proposal, intervention_key
from evotrainer.stages import search
from evotrainer.stages.results import read_stage

LR = "optimizer.learning_rate"


def _finding(name: str, validity: bool) -> Finding:
    return Finding(name, "critical", 0.5, 0.2, ("r01-segment-000001-0",), ("sampling.temperature",), "x", validity)


def _move(target: str, value: object, name: str = "tampering") -> Proposal:
    hyp = Hypothesis(finding=name, signal="heldout/accuracy", direction="up")
    return Proposal(Intervention(kind="set_knob", target=target, value=value, hypothesis=hyp), "catalog")


def test_the_first_remedy_for_an_exploit_is_hedged_with_the_rate_lowered():
    h = Harness()
    rate = h.optimizer.learning_rate
    props = [_move("sampling.temperature", 0.9, "plateau"), _move(LR, rate * 3), _move("loss.epsilon", 0.3)]
    out = hedge(props, [_finding("plateau", False), _finding("tampering", True)], h, 0.5)
    assert out is not None and out.source == "hedge"
    iv = out.intervention
    # Not the plateau's move (no exploit), not a learning-rate move (its own step is what it changes): the third.
    assert (iv.target, iv.value, iv.hypothesis.finding) == ("loss.epsilon", 0.3, "tampering")
    assert (iv.paired.target, iv.paired.value) == (LR, pytest.approx(rate * 0.5, rel=1e-2))
    assert iv.apply(h).optimizer.learning_rate == iv.paired.value and iv.apply(h).loss.epsilon == 0.3
    assert "x0.5" in out.note


@pytest.mark.parametrize("why", ["no exploit", "step 0", "below the floor", "already paired", "planted"])
def test_no_hedge_without_an_exploit_remedy_to_hedge(why):
    h = Harness.model_validate({"optimizer": {"learning_rate": 1e-7 if why == "below the floor" else 1e-5}})
    props = [_move("loss.epsilon", 0.3)]
    if why == "already paired":
        iv = props[0].intervention
        props = [Proposal(iv.model_copy(update={"paired": _move("sampling.temperature", 0.9).intervention}), "pair")]
    if why == "planted":
        props = [Proposal(props[0].intervention, "planted")]
    found = [_finding("tampering", why != "no exploit")]
    assert hedge(props, found, h, 0.0 if why == "step 0" else 0.5) is None


def paid_wrong(w: Window) -> list[Finding]:
    """A planted validity detector: wrong answers paid half a right one or more; it names the temperature, so the
    heuristic proposes the temperature's graded moves for it (a remedy for the exploit)."""
    paid = w.rows("SELECT id FROM rollout_stats WHERE NOT audit AND reward >= 0.5 ORDER BY id")
    share = len(paid) / max(1, w.scalar("SELECT count(*) FROM rollout_stats WHERE NOT audit"))
    if share <= 0.2:
        return []
    ids = [r["id"] for r in paid[:5]]
    return [finding(w, "paid_wrong", "critical", share, 0.2, ids, ("sampling.temperature",), "paid wrong", True)]


@pytest.mark.parametrize("step", [0.5, 0.0])
def test_a_round_on_an_exploit_races_its_remedy_at_both_steps(tmp_path, math_setup, step):
    """`format` paid as much as a right answer taints the segment; the round proposes one candidate (the temperature's
    move, for the exploit) and, with loop.hedge_step, races the same move with the learning rate halved beside it,
    from the same checkpoint, each arm under its own harness; with 0 it races the one."""
    from evotrainer.loop import run_round
    from evotrainer.report.console import Narrator

    cfg = loop_config(
        tmp_path,
        harness={"reward_weights": {"correct": 1.0, "format": 1.0}},
        loop={"max_rounds": 1, "candidates": 1, "hedge_step": step},
    )
    ctx, head = started_with(cfg, {"paid_wrong": f"{__name__}:paid_wrong"})
    run_round(ctx, Narrator(quiet()), 1, head)
    props = read_stage(ctx.ledger, 1, "propose").proposals
    first = props[0].intervention
    assert first.hypothesis.finding == "paid_wrong" and first.paired is None
    arms = read_stage(ctx.ledger, 1, "trial").arms
    raced = [a for a in arms if a.role == "candidate"]
    rate = head.harness.optimizer.learning_rate
    if not step:
        assert len(props) == 1 and len(raced) == 1
        return
    assert [p.source for p in props] == ["catalog", "hedge"] and len(raced) == 2
    second = props[1].intervention
    assert (second.target, second.value) == (first.target, first.value)
    assert (second.paired.target, second.paired.value) == (LR, pytest.approx(rate * step, rel=1e-2))
    control = next(a for a in arms if a.role == "control")
    assert raced[0].first_step == raced[1].first_step == control.first_step  # one checkpoint for all three
    assert raced[1].branch == branch_id(1, "candidate", 2)
    assert [a.harness_version for a in raced] == [p.intervention.apply(head.harness).version for p in props]
    assert [v["trial"] for v in ctx.ledger.verdicts() if v["round"] == 1] == ["r01-t1", "r01-t2"]
    ctx.ledger.close()


def test_a_hedge_goes_where_its_remedy_goes_in_the_replay(tmp_path, math_setup):
    """The replay drops a remedy that changes nothing on the segment (here: a branch with no rollouts); its hedge,
    which the replay cannot score (a learning rate), is dropped with it; a pair from a rejection is not."""
    cfg = loop_config(tmp_path)
    ctx, head = started_with(cfg, {})
    remedy = Intervention(
        kind="set_reward_weight",
        target="reward_weights.format",
        value=0.05,
        hypothesis=Hypothesis(finding="paid_wrong", signal="heldout/accuracy", direction="up"),
    )
    rate = Intervention(kind="set_knob", target=LR, value=1e-5, hypothesis=remedy.hypothesis)
    both = remedy.model_copy(update={"paired": rate})
    pool = [Proposal(remedy, "catalog"), Proposal(both, "hedge"), Proposal(both, "pair")]
    out, _ = search.replay_stage(ctx, head.harness, pool, [], "nothing-here", 3)
    why = {d.index: d.why for d in out.kept + out.dropped}
    assert why == {
        0: "no effect on advantages or masks",
        1: "its remedy was dropped by the replay",
        2: "needs a trial (not replayable)",
    }
    assert intervention_key(pool[1].intervention) == intervention_key(pool[2].intervention)
    ctx.ledger.close()
