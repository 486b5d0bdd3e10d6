"""Two-factor remedies (issue #28 item 5): a change rejected alone, while its trial's window carried a finding its
control's did not that names another knob, is tried again with that knob moved, as one hypothesis (pairs.py)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from conftest import small_config, started_with
from evotrainer.diagnostics.detector import Finding, Window, finding
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Hypothesis, Intervention, InterventionError, diff
from evotrainer.proposers.brief import history
from evotrainer.proposers.heuristic import HeuristicProposer, candidates_for
from evotrainer.proposers.pairs import pairs
from evotrainer.proposers.proposer import Brief, PastTrial, Proposal, intervention_key, screen
from evotrainer.skills.library import Evidence, SkillLibrary
from evotrainer.stages.results import read_stage

HYP = Hypothesis(finding="explore", signal="heldout/accuracy", direction="up")
TEMPERATURE = Intervention(kind="set_knob", target="sampling.temperature", value=0.7, hypothesis=HYP)
RATE = Intervention(kind="set_knob", target="optimizer.learning_rate", value=1e-5, hypothesis=HYP)


def test_a_pair_changes_its_two_knobs_as_one_step_and_reverts_exactly():
    h = Harness()
    pair = TEMPERATURE.model_copy(update={"paired": RATE}).bind(h)
    child = pair.apply(h)
    assert child.parent == h.version  # one step from h, not two
    assert [p for p, *_ in diff(h, child)] == ["optimizer.learning_rate", "sampling.temperature"]
    back = pair.revert(child)
    assert back.version == h.version and back.parent == h.parent
    assert " + set_knob optimizer.learning_rate: " in pair.describe()
    assert intervention_key(pair) == f"{intervention_key(TEMPERATURE)} + {intervention_key(RATE)}"
    # A single change is written as before pairs existed (its keys, so the hashes of configs that plant it).
    assert "paired" not in TEMPERATURE.model_dump() and "paired" in pair.model_dump()
    assert Intervention.model_validate(json.loads(pair.model_dump_json())) == pair


def test_a_pair_is_two_knobs_at_most_and_each_part_one():
    with pytest.raises(ValueError, match="another knob"):
        Intervention.model_validate({**TEMPERATURE.model_dump(), "paired": TEMPERATURE.model_dump()})
    chained = {**RATE.model_dump(), "paired": TEMPERATURE.model_dump()}
    with pytest.raises(ValueError, match="another knob"):
        Intervention.model_validate({**TEMPERATURE.model_dump(), "paired": chained})
    # A part that changes nothing is refused as a single change is.
    same = RATE.model_copy(update={"value": Harness().optimizer.learning_rate})
    with pytest.raises(InterventionError, match="changes nothing"):
        TEMPERATURE.model_copy(update={"paired": same}).apply(Harness())


def _past(rnd: int, iv: Intervention, harness: str, new: tuple[Finding, ...], decision: str = "reject") -> PastTrial:
    return PastTrial(rnd, iv, (), decision, ("no_supported_gain",), 0.0, harness=harness, new_findings=new)


def _finding(name: str, knobs: tuple[str, ...], severity: str = "warning") -> Finding:
    return Finding(name, severity, 1.0, 0.5, ("r01-c1-000001-0",), knobs, "planted")


def test_a_change_rejected_with_a_new_finding_on_another_knob_comes_back_paired_first():
    """kl_spike on the candidate's window (not the control's) names the learning rate: the next round's first
    proposal is the same change with the catalog's kl_spike remedy (the rate halved), as one hypothesis."""
    h = Harness()
    spike = _finding("kl_spike", ("optimizer.learning_rate", "loss.beta", "loss.epsilon"))
    on_own_knob = _finding("entropy_explosion", ("sampling.temperature",))
    past = [_past(1, TEMPERATURE, h.version, (on_own_knob, spike))]
    brief = Brief("t", 2, "math", h, [], (), history=past, limit=2, explore=0.0)
    [pair] = pairs(brief, candidates_for)
    assert (pair.target, pair.value) == (TEMPERATURE.target, TEMPERATURE.value)
    assert pair.paired.target == "optimizer.learning_rate"
    assert pair.paired.value == pytest.approx(h.optimizer.learning_rate * 0.5)  # kl_spike's first remedy
    assert "rejected alone in round 1" in pair.hypothesis.rationale and "kl_spike" in pair.hypothesis.rationale
    first = HeuristicProposer().propose(brief).proposals[0]
    assert first.source == "pair" and intervention_key(first.intervention) == intervention_key(pair)
    # Screened like any proposal: once rejected under the same signature, it is not proposed again.
    rejected = _past(2, pair.bind(h), h.version, ())
    again = Brief("t", 3, "math", h, [], (), history=[*past, rejected], limit=2, explore=0.0)
    kept, refused = screen([Proposal(p, "pair") for p in pairs(again, candidates_for)], again)
    assert not kept and "already rejected" in refused[0].reason
    assert len(pairs(again, candidates_for)) == 1  # the rejected pair is not paired again


def test_a_pair_that_fell_on_its_second_knob_comes_back_with_that_knob_moved_further():
    """A pair whose second factor halved the learning rate fell below the start again (heldout_regression on its
    window, naming the learning rate): the next proposal is the same change with the rate halved once more, from
    where the pair had set it. A finding on another knob moves nothing further."""
    h = Harness()
    halved = h.optimizer.learning_rate * 0.5
    pair = TEMPERATURE.model_copy(update={"paired": RATE.model_copy(update={"value": halved})}).bind(h)
    fell = _finding("heldout_regression", ("optimizer.learning_rate",), "critical")
    brief = Brief("t", 3, "math", h, [], (), history=[_past(2, pair, h.version, (fell,))], limit=2, explore=0.0)
    [further] = pairs(brief, candidates_for)
    assert (further.target, further.value) == (TEMPERATURE.target, TEMPERATURE.value)
    assert further.paired.target == "optimizer.learning_rate"
    assert further.paired.value == pytest.approx(halved * 0.5)
    assert "rejected in round 2" in further.hypothesis.rationale and "moved further" in further.hypothesis.rationale
    first = HeuristicProposer().propose(brief).proposals[0]
    assert first.source == "pair" and intervention_key(first.intervention) == intervention_key(further)
    other = _finding("entropy_explosion", ("sampling.temperature",))
    elsewhere = Brief("t", 3, "math", h, [], (), history=[_past(2, pair, h.version, (other,))])
    assert pairs(elsewhere, candidates_for) == []
    moved_on = Brief("t", 3, "math", Harness(optimizer={"learning_rate": halved}), [], (), history=brief.history)
    assert pairs(moved_on, candidates_for) == []  # only on the harness the pair was rejected under
    # A choice has no "further": tool_errors on a pair that set tool_error to "end" proposes nothing more.
    end = Intervention(kind="set_knob", target="multi_turn.tool_error", value="end", hypothesis=HYP)
    errors = _finding("tool_errors", ("multi_turn.tool_error", "multi_turn.max_turns"))
    choice = TEMPERATURE.model_copy(update={"paired": end}).bind(h)
    assert any(r.target == end.target for r in candidates_for(errors, end.apply(h)))  # the catalog has one
    tried = Brief("t", 3, "math", h, [], (), history=[_past(2, choice, h.version, (errors,))])
    assert pairs(tried, candidates_for) == []
    # Nor a reward term the pair added (no knob of the harness it was rejected under): nothing, and no error.
    bonus = Intervention(kind="add_reward_term", target="reward_weights.format_bonus", value=0.1, hypothesis=HYP)
    added = TEMPERATURE.model_copy(update={"paired": bonus}).bind(h)
    on_term = _finding("missing_behaviour", ("reward_weights.format_bonus",))
    assert (
        pairs(Brief("t", 3, "math", h, [], (), history=[_past(2, added, h.version, (on_term,))]), candidates_for) == []
    )
    # "Further" is the way the pair moved the knob: a pair that raised the rate and fell is not sent back down.
    raised = TEMPERATURE.model_copy(update={"paired": RATE.model_copy(update={"value": halved * 4})}).bind(h)
    assert (
        pairs(Brief("t", 3, "math", h, [], (), history=[_past(2, raised, h.version, (fell,))]), candidates_for) == []
    )


@pytest.mark.parametrize(
    "why",
    ["other harness", "finding gone", "promoted", "on its own knob", "nothing new"],
)
def test_no_pair_without_the_evidence_for_one(why):
    h = Harness()
    spike = _finding("kl_spike", ("optimizer.learning_rate",))
    iv = TEMPERATURE.model_copy(update={"hypothesis": HYP.model_copy(update={"finding": "entropy_collapse"})})
    findings = [_finding("entropy_collapse", ("sampling.temperature",))]
    trial = {
        "other harness": _past(1, iv, "h-another", (spike,)),
        "finding gone": _past(1, iv, h.version, (spike,)),
        "promoted": _past(1, iv, h.version, (spike,), decision="promote"),
        "on its own knob": _past(1, iv, h.version, (_finding("kl_spike", ("sampling.temperature",)),)),
        "nothing new": _past(1, iv, h.version, ()),
    }[why]
    brief = Brief("t", 2, "math", h, [] if why == "finding gone" else findings, (), history=[trial])
    assert pairs(brief, candidates_for) == []
    # And with the evidence, the same trial does pair.
    ok = Brief("t", 2, "math", h, findings, (), history=[_past(1, iv, h.version, (spike,))])
    assert pairs(ok, candidates_for)


def test_a_won_pair_is_a_skill_with_both_values(tmp_path):
    h = Harness()
    lib = SkillLibrary(tmp_path / "skills")
    pair = TEMPERATURE.model_copy(update={"paired": RATE}).bind(h)
    ev = Evidence(run="r", round=1, trial="r01-t1", decision="promote", effect=0.1, signature=["x"], domain="math")
    skill = lib.record(pair, ev, source="pair", create=True)
    again = lib.get(skill.id).instantiate(h)
    assert intervention_key(again) == intervention_key(pair) and not again.paired.bound
    single = lib.record(TEMPERATURE.bind(h), ev, source="catalog", create=True)
    assert single.id != skill.id  # the single change is another skill


def unstable_candidates(w: Window) -> list[Finding]:
    """A planted detector (a plugin, as a user writes one): a warning on candidate windows only (r01-c1, r01-c1r, ...),
    naming the learning rate: what the change did besides what it was meant to."""
    if not (w.branch[:5].endswith("-c") and w.branch[5:6].isdigit()):
        return []
    return [finding(w, "planted_instability", "warning", 1.0, 0.5, [], ("optimizer.learning_rate",), "planted")]


def unstable_everywhere(w: Window) -> list[Finding]:
    """A planted warning on every window, the control's too: nothing the candidate's change did."""
    return [finding(w, "planted_everywhere", "warning", 1.0, 0.5, [], ("optimizer.max_grad_norm",), "planted")]


def test_the_loop_trials_the_pair_the_round_after_the_single_change_failed(tmp_path, math_setup):
    """Two real rounds. Round 1 races a planted temperature change under a learning rate that wrecks every arm (1.0),
    so it is rejected whatever the CPU; a planted detector puts a finding naming the learning rate on the candidate's
    windows only, another on every window. Round 2 proposes and trials the temperature change with the learning rate
    moved, one trial of a harness two knobs from the mainline's, recorded as a pair; the finding the control shared
    pairs nothing."""
    from evotrainer.loop import run_round
    from evotrainer.report.console import Narrator

    plant = {**TEMPERATURE.model_dump(mode="json"), "value": 1.3}
    cfg = small_config(
        tmp_path,
        harness={"optimizer": {"learning_rate": 1.0}},
        run={"name": "t", "out_dir": str(tmp_path / "runs"), "seed": 0},
        loop={
            "segment_steps": 2,
            "trial_steps": 3,
            "race_checkpoints": 1,
            "candidates": 1,
            "max_rounds": 2,
            "max_trial_share": 1.0,
            "planted": [plant],
            "skills_dir": str(tmp_path / "skills"),
        },
    )
    ctx, head = started_with(
        cfg,
        {
            "planted_instability": f"{__name__}:unstable_candidates",
            "planted_everywhere": f"{__name__}:unstable_everywhere",
        },
    )
    tell = Narrator(Console(file=io.StringIO(), width=200))
    head, _ = run_round(ctx, tell, 1, head)
    [one] = ctx.ledger.verdicts()
    assert one["decision"] == "reject"
    [past] = history(ctx.ledger)
    assert [f.name for f in past.new_findings] == ["planted_instability"]  # the control's shared one is not new
    before = head.harness
    head, _ = run_round(ctx, tell, 2, head)
    [proposal] = read_stage(ctx.ledger, 2, "propose").proposals
    iv = proposal.intervention
    assert proposal.source == "pair" and (iv.target, iv.value) == ("sampling.temperature", 1.3)
    assert iv.paired.target == "optimizer.learning_rate" and iv.paired.before == 1.0 and iv.paired.value != 1.0
    [trial] = [t for t in ctx.ledger.trials() if t["round"] == 2]
    recorded = Intervention.model_validate(trial["intervention"])
    assert recorded == iv and trial["source"] == "pair"
    branches = {b["id"]: b for b in ctx.ledger.branches()}
    child = iv.apply(before)
    assert branches[trial["candidate"]]["harness_version"] == child.version and child.parent == before.version
    assert {p for p, *_ in diff(before, child)} == {"sampling.temperature", "optimizer.learning_rate"}
    assert any(v["trial"] == trial["id"] for v in ctx.ledger.verdicts())  # one verdict on the pair
    ctx.ledger.close()


def test_a_remedy_whose_run_fell_below_the_start_comes_back_with_half_the_step():
    """SWE's regrade at the naive learning rate fell below where its arms forked (gate.fell's heldout_regression
    on its verdict): while the exploit it answered stands, the next proposal is the regrade with the learning rate
    halved, the catalog's remedy for that finding, as one hypothesis."""
    h = Harness(reward_weights={"tests": 1.0, "format": 0.1}, optimizer={"learning_rate": 5e-4})
    regrade = Intervention(
        kind="replace_reward_term",
        target="reward_weights.tests",
        value="tests_restored",
        hypothesis=Hypothesis(finding="collection_errors", signal="heldout/accuracy", direction="up"),
    )
    fell = _finding("heldout_regression", ("optimizer.learning_rate",), "critical")
    exploit = _finding("collection_errors", ("reward_weights.tests",), "critical")
    brief = Brief("t", 2, "swe", h, [exploit], (), history=[_past(1, regrade, h.version, (fell,))])
    [pair] = pairs(brief, candidates_for)
    assert (pair.target, pair.value) == ("reward_weights.tests", "tests_restored")
    assert pair.paired.target == "optimizer.learning_rate" and pair.paired.value == pytest.approx(2.5e-4)
    assert "heldout_regression" in pair.hypothesis.rationale and pair.hypothesis.finding == "collection_errors"
    # Without the finding on its trial, the regrade does not come back paired.
    alone = Brief("t", 2, "swe", h, [exploit], (), history=[_past(1, regrade, h.version, ())])
    assert pairs(alone, candidates_for) == []
