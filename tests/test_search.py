"""A search that does not run dry: every knob has a move, numeric knobs move in graded steps both ways,
a rejection expires once the mainline has moved on, a standing finding always gets a proposal, and the
findings' knobs (dead groups of solved prompts) reach the remedies practitioners use."""

from __future__ import annotations

from dataclasses import replace

import pytest

from evotrainer.diagnostics.detector import Finding
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Hypothesis, Intervention
from evotrainer.harness.knobs import registry
from evotrainer.proposers.heuristic import HeuristicProposer, candidates_for
from evotrainer.proposers.moves import explore, moves
from evotrainer.proposers.proposer import Brief, PastTrial, Proposal, intervention_key, screen

H = Harness(optimizer={"learning_rate": 1e-4})


def finding(name: str, knobs: tuple[str, ...], severity: str = "warning") -> Finding:
    return Finding(name=name, severity=severity, value=0.6, threshold=0.5, evidence=(), knobs=knobs, message=name)


def brief(
    findings: list[Finding],
    history: list[PastTrial] = (),
    h: Harness = H,
    step: int = 50,
    expiry: int = 60,
    limit: int = 2,
) -> Brief:
    sig = tuple(sorted({f.name for f in findings if f.severity != "info"}))
    return Brief(
        run="r",
        round=3,
        domain="math",
        harness=h,
        findings=findings,
        signature=sig,
        history=list(history),
        limit=limit,
        explore=0.5,
        step=step,
        expiry=expiry,
    )


def rejected(target: str, value, sig: tuple[str, ...], h: Harness = H, step: int = 40) -> PastTrial:
    iv = Intervention(
        kind="set_knob",
        target=target,
        value=value,
        hypothesis=Hypothesis(finding="explore", signal="x", direction="up"),
    ).bind(h)
    return PastTrial(1, iv, sig, "reject", ("no_supported_gain",), -0.01, harness=h.version, step=step)


def test_every_knob_has_a_move():
    stuck = [
        k.path
        for k in registry()
        if not moves(H, k.path) and k.path not in ("reward_weights.*", "suite_version", "curriculum.levels")
    ]
    assert stuck == [], stuck
    # curriculum.levels moves when the harness restricts them (without, the domain's levels are unknown
    # here, and the findings that would name it name the easy / hard thresholds instead).
    assert moves(Harness(curriculum={"levels": (0, 1, 2)}), "curriculum.levels") == [(1, 2), (0, 1)]


def test_numeric_knobs_move_in_graded_steps_in_both_directions():
    assert moves(H, "optimizer.learning_rate", up=True) == [1e-3, 3e-4, 3.33e-5, 1.5e-4, 6.67e-5, 1e-5]
    assert moves(H, "optimizer.learning_rate", up=False)[:3] == [1e-5, 3.33e-5, 3e-4]
    assert moves(H, "loss.entropy_coef") == [0.001, 0.01]  # from zero: first values worth trying
    assert moves(H, "filters.dynamic_sampling") == [True] and moves(H, "loss.epsilon_high") == [0.28]
    # Clipped to the knob's range, never a no-op.
    top_p = moves(Harness(sampling={"top_p": 0.5}), "sampling.top_p")
    assert top_p and all(0 < v <= 1.0 and v != 0.5 for v in top_p)


def test_after_a_decade_is_rejected_the_next_rung_comes_up():
    f = [finding("plateau", ("optimizer.learning_rate", "sampling.temperature", "loss.entropy_coef"))]
    sig = ("plateau",)
    first = HeuristicProposer().propose(brief(f, limit=1)).proposals[0].intervention
    assert (first.target, first.value) == ("optimizer.learning_rate", 3e-4)  # the catalog's x3 for a plateau
    past = [rejected("optimizer.learning_rate", 3e-4, sig)]
    again = HeuristicProposer().propose(brief(f, past, limit=1)).proposals[0].intervention
    assert (again.target, again.value) != ("optimizer.learning_rate", 3e-4)
    # With every learning-rate move above it rejected, it goes down, then to the finding's other knobs.
    past += [rejected("optimizer.learning_rate", v, sig) for v in (1e-3, 1.5e-4)]
    keys = {intervention_key(p.intervention) for p in HeuristicProposer().propose(brief(f, past, limit=3)).proposals}
    assert not keys & {intervention_key(t.intervention) for t in past}


def test_a_rejection_expires_once_the_mainline_has_moved_on():
    sig = ("plateau",)
    past = [rejected("sampling.temperature", 1.3, sig, step=40)]
    iv = Intervention(
        kind="set_knob",
        target="sampling.temperature",
        value=1.3,
        hypothesis=Hypothesis(finding="plateau", signal="x", direction="up"),
    )

    def kept(b: Brief) -> bool:
        return bool(screen([Proposal(iv, "catalog")], b)[0])

    f = [finding("plateau", ("sampling.temperature",))]
    assert not kept(brief(f, past, step=50, expiry=60))  # 10 steps later, same harness: still blocked
    assert kept(brief(f, past, step=101, expiry=60))  # 61 steps later: the policy has moved on
    assert not kept(brief(f, past, step=500, expiry=0))  # expiry 0: only a promotion lifts it ...
    promoted = H.model_copy(update={"loss": H.loss.model_copy(update={"entropy_coef": 0.001}), "parent": H.version})
    assert kept(brief(f, past, h=promoted, step=51))  # ... and a promotion does
    assert kept(brief([finding("truncation", ("sampling.temperature",))], past, step=50))  # another signature


def test_a_standing_finding_always_gets_a_proposal():
    """Even when every catalog remedy and every exploration move of the first rungs was rejected, the
    finding's knobs still move."""
    f = [
        finding(
            "zero_variance_groups",
            (
                "filters.dynamic_sampling",
                "curriculum.easy_threshold",
                "sampling.temperature",
                "sampling.num_generations",
                "filters.zero_std_threshold",
            ),
        )
    ]
    sig = ("zero_variance_groups",)
    past: list[PastTrial] = []
    for _ in range(12):
        out = HeuristicProposer().propose(brief(f, past, limit=2)).proposals
        assert out, f"nothing proposed after {len(past)} rejections"
        past += [PastTrial(1, p.intervention, sig, "reject", (), 0.0, harness=H.version, step=40) for p in out]
    assert len({intervention_key(t.intervention) for t in past}) == len(past)  # never the same move twice


def test_dead_groups_of_solved_prompts_call_for_dynamic_sampling_and_skipping_them():
    f = [
        finding(
            "zero_variance_groups",
            (
                "filters.dynamic_sampling",
                "curriculum.easy_threshold",
                "sampling.temperature",
                "sampling.num_generations",
                "filters.zero_std_threshold",
            ),
        )
    ]
    out = HeuristicProposer().propose(brief(f, limit=2, h=Harness())).proposals
    assert [(p.intervention.target, p.intervention.value) for p in out][:1] == [("filters.dynamic_sampling", True)]
    assert ("curriculum.easy_threshold", 1.0) in [
        (p.intervention.target, p.intervention.value)
        for p in HeuristicProposer().propose(brief(f, limit=4, h=Harness())).proposals
    ]


def test_the_finding_that_names_the_exploit_channel_is_remedied_first():
    """The findings of an SWE segment whose reward pays edited tests (knobs as the run reported them): the
    generic reward_audit_gap sorts first by name, but its remedies only drop or reweight terms (the 0.1
    format weight first); test_tampering's regrade to `tests_restored` closes the channel and is the one
    candidate a round with one slot tries."""
    h = Harness(reward_weights={"tests": 1.0, "format": 0.1}, multi_turn={"max_turns": 6})
    found = [
        finding("reward_hacking", ("reward_weights.tests",), "critical"),
        finding("turn_cap", ("multi_turn.max_turns", "multi_turn.tool_error")),
        finding("reward_audit_gap", ("reward_weights.format", "reward_weights.tests"), "critical"),
        finding(
            "test_tampering",
            ("reward_weights.tests", "reward_weights.correct", "reward_weights.tests_restored"),
            "critical",
        ),
    ]
    found = [f.__class__(**{**f.__dict__, "validity": f.severity == "critical"}) for f in found]
    [first] = HeuristicProposer().propose(brief(found, h=h, limit=1)).proposals
    iv = first.intervention
    assert (iv.kind, iv.target, iv.value) == ("replace_reward_term", "reward_weights.tests", "tests_restored")
    # Without the channel's own finding the generic remedies still come up.
    [other] = HeuristicProposer().propose(brief(found[:3], h=h, limit=1)).proposals
    assert other.intervention.kind != "replace_reward_term"


def test_a_sampler_mismatch_is_answered_with_truncated_importance_sampling_once():
    out = HeuristicProposer().propose(brief([finding("sampling_mismatch", ("loss.tis_cap",))])).proposals
    first = out[0].intervention
    assert (first.kind, first.target, first.value) == ("set_knob", "loss.tis_cap", 2.0)
    on = Harness(optimizer={"learning_rate": 1e-4}, loss={"tis_cap": 2.0})
    again = HeuristicProposer().propose(brief([finding("sampling_mismatch", ("loss.tis_cap",))], h=on)).proposals
    assert not any(p.intervention.target == "loss.tis_cap" and p.intervention.value == 2.0 for p in again)


def test_dead_outcome_groups_call_for_the_papers_std_filter():
    f = [finding("dead_outcome_groups", ("filters.std_keep_ratio", "curriculum.hard_threshold"))]
    out = HeuristicProposer().propose(brief(f, limit=2, h=Harness())).proposals
    iv = out[0].intervention
    assert (iv.kind, iv.target, iv.value) == ("add_filter", "filters.std_keep_ratio", 0.9)
    assert iv.apply(Harness()).filters.std_ema_decay == 0.95


def test_collapse_findings_get_the_spread_remedies_aimed_at_their_signal():
    f = [finding("solution_collapse", ("sampling.temperature", "loss.entropy_coef", "loss.epsilon_high"))]
    [first, *_] = HeuristicProposer().propose(brief(f, limit=3, h=Harness())).proposals
    assert first.intervention.target == "sampling.temperature"
    assert first.intervention.hypothesis.signal == "completions/distinct_per_group"
    g = [finding("logprob_collapse", ("loss.entropy_coef", "loss.epsilon_high", "sampling.temperature"))]
    [first, *_] = HeuristicProposer().propose(brief(g, limit=3, h=Harness())).proposals
    assert (first.intervention.target, first.intervention.value) == ("loss.entropy_coef", 0.001)


@pytest.mark.parametrize(
    ("stored", "paid", "term"),
    [
        ("tests_fixed", {"correct": 1.0, "format": 0.1}, "tests_fixed"),
        ("visible_not_hardcoded", {"correct_not_hardcoded": 1.0, "format": 0.1}, "visible_not_hardcoded"),
    ],
)
def test_dead_outcome_groups_get_the_domains_partial_credit(stored, paid, term):
    h = Harness(reward_weights=paid)
    f = finding("dead_outcome_groups", ("filters.std_keep_ratio", f"reward_weights.{stored}"))
    got = [(iv.kind, iv.target, iv.value) for iv in candidates_for(f, h)]
    assert ("add_reward_term", f"reward_weights.{term}", 0.5) in got
    # A run whose domain stores no such term (math), or a harness that pays no all-or-nothing outcome: none.
    assert not any(iv.target == f"reward_weights.{term}" for iv in candidates_for(finding(f.name, f.knobs[:1]), h))
    h2 = Harness(reward_weights={"tests_restored": 1.0})
    assert not any(iv.target == f"reward_weights.{term}" for iv in candidates_for(f, h2))


def test_an_exploratory_move_rejected_under_one_signature_is_not_explored_again_under_another():
    """One SWE run raced the learning rate x10 three times in four rounds: alone with no finding, then paired, and
    the pair again once the findings had changed, since a rejection blocked only under its own signature. An
    exploratory move answers no finding, so its rejection holds under any; a remedy a new finding motivates, the
    same change included, still gets its trial, and the rejection still expires."""

    past = [rejected("optimizer.learning_rate", 1e-3, ("tool_errors",))]  # H's rate x10, explored and rejected
    explored = past[0].intervention
    motivated = explored.model_copy(update={"hypothesis": Hypothesis(finding="plateau", signal="x", direction="up")})
    later = brief([], past, limit=1)  # no finding now: another signature
    kept, refused = screen([Proposal(explored, "explore"), Proposal(motivated, "catalog")], later)
    assert [p.source for p in kept] == ["catalog"]
    assert "as an exploratory move" in refused[0].reason
    # The proposer explores the next move (rung-major: the temperature's), where before this it explored the same
    # x10 again.
    first = HeuristicProposer().propose(later).proposals[0].intervention
    assert (first.target, first.value) != ("optimizer.learning_rate", 1e-3) and first.hypothesis.finding == "explore"
    # A pair built from the exploratory move keeps its hypothesis: rejected under one signature, blocked under all.
    pair = explored.model_copy(
        update={
            "paired": Intervention(
                kind="set_knob", target="multi_turn.tool_error", value="end", hypothesis=explored.hypothesis
            )
        }
    ).bind(H)
    paired = [PastTrial(2, pair, ("dead_outcome_groups",), "reject", (), 0.0, harness=H.version, step=45)]
    assert not screen([Proposal(pair, "pair")], brief([], paired))[0]
    assert screen([Proposal(pair, "pair")], brief([], paired, step=106))[0]  # 61 steps later: expired


def test_the_heuristic_keeps_its_next_proposals_as_spares_for_the_replay():
    f = [finding("plateau", ("optimizer.learning_rate", "sampling.temperature", "loss.entropy_coef"))]
    out = HeuristicProposer().propose(brief(f, limit=2))
    keys = [intervention_key(p.intervention) for p in out.proposals + out.spares]
    assert len(out.proposals) == 2 and len(out.spares) == 2 and len(set(keys)) == 4
    # Screened like the proposals: a rejected move is no spare either.
    past = [rejected(p.intervention.target, p.intervention.value, ("plateau",)) for p in out.spares]
    again = HeuristicProposer().propose(brief(f, past, limit=2))
    assert not {intervention_key(t.intervention) for t in past} & {
        intervention_key(p.intervention) for p in again.proposals + again.spares
    }


def test_a_graded_move_that_repeats_a_catalog_remedy_under_another_kind_is_not_proposed_again():
    """Dead outcome groups of solved prompts on SWE: the catalog's std filter (`add_filter`, keep ratio 0.9) and
    the graded move that switches the same knob on (`set_knob`, 0.9) are one change. An SWE run's replay dropped
    both as the same no-op, the second in a spare's place; the curriculum move comes up in its place."""
    f = [
        finding(
            "dead_outcome_groups",
            (
                "filters.std_keep_ratio",
                "curriculum.easy_threshold",
                "sampling.temperature",
                "sampling.num_generations",
            ),
        )
    ]
    changes = [(iv.target, iv.value) for iv in candidates_for(f[0], Harness())]
    assert changes.count(("filters.std_keep_ratio", 0.9)) == 1 and len(changes) == len(set(changes))
    assert changes[:3] == [
        ("filters.std_keep_ratio", 0.9),
        ("sampling.temperature", 1.3),
        ("curriculum.easy_threshold", 1.0),
    ]
    out = HeuristicProposer().propose(brief(f, limit=2, h=Harness()))
    assert (out.proposals[0].intervention.kind, out.proposals[0].intervention.target) == (
        "add_filter",
        "filters.std_keep_ratio",
    )
    # The next two catalog changes are the spares (the second slot explores).
    assert [(p.intervention.target, p.intervention.value) for p in out.spares] == changes[1:3]


def test_an_expired_exploratory_rejection_comes_back_only_after_every_untried_move():
    """Its rejection has expired (the mainline moved on), so the learning rate x10 may be tried again, but the
    moves this run never tried go first; once every one of them was rejected and expired too, it leads again."""
    first = HeuristicProposer().propose(brief([], limit=1)).proposals[0].intervention
    assert (first.target, first.value) == ("optimizer.learning_rate", 1e-3)  # H's rate x10: the first rung
    past = [rejected("optimizer.learning_rate", 1e-3, (), step=0)]
    b = brief([], past, step=100, expiry=60, limit=1)
    assert screen([Proposal(past[0].intervention, "explore")], b)[0]  # expired: the screen lets it through
    again = HeuristicProposer().propose(b).proposals[0].intervention
    assert (again.target, again.value) == ("sampling.temperature", 1.3)  # the next untried move, rung-major
    # Rejected under another harness (a promotion since): no evidence about this one, so it is first again.
    other = [replace(past[0], harness="h-other")]
    assert HeuristicProposer().propose(brief([], other, step=100, limit=1)).proposals[0].intervention.value == 1e-3
    tried = [replace(past[0], intervention=iv.bind(H)) for iv in explore(H, [])]
    last = HeuristicProposer().propose(brief([], tried, step=100, limit=1)).proposals[0].intervention
    assert (last.target, last.value) == ("optimizer.learning_rate", 1e-3)


def test_a_clip_range_move_is_refused_as_inert_until_a_batch_is_trained_more_than_once():
    """At loss.num_iterations 1 a clip-range change trains the same weights as its control (tests/test_grpo.py), so
    a trial of it would race two copies: refused whoever proposed it, the reason naming the knob that makes it act.
    The proposer explores the second pass instead, after which the clip-higher move is raced."""
    clip = Intervention(
        kind="set_knob",
        target="loss.epsilon_high",
        value=0.28,
        hypothesis=Hypothesis(finding="entropy_collapse", signal="entropy", direction="up"),
    )
    kept, refused = screen([Proposal(clip, "llm")], brief([]))
    assert not kept and "inert" in refused[0].reason and "loss.num_iterations" in refused[0].reason
    two = Harness(optimizer={"learning_rate": 1e-4}, loss={"num_iterations": 2})
    assert screen([Proposal(clip, "llm")], brief([], h=two))[0]
    # The catalog's clip-higher remedy for a collapse gives way to its next one, the temperature.
    f = [finding("entropy_collapse", ("loss.entropy_coef", "loss.epsilon_high", "sampling.temperature"))]
    past = [rejected("loss.entropy_coef", 0.001, ("entropy_collapse",))]
    out = HeuristicProposer().propose(brief(f, past, limit=1)).proposals
    assert [p.intervention.target for p in out] == ["sampling.temperature"]
    # Exploration: every move the proposer offers at one pass can act; the second pass is among the first rung.
    offered = HeuristicProposer().propose(brief([], limit=8))
    targets = [p.intervention.target for p in offered.proposals + offered.spares]
    assert "loss.num_iterations" in targets[:3] and not {"loss.epsilon", "loss.epsilon_high"} & set(targets)
    offered = HeuristicProposer().propose(brief([], h=two, limit=8))
    assert "loss.epsilon_high" in [p.intervention.target for p in offered.proposals + offered.spares]


def test_a_remedy_rejected_for_a_finding_is_not_raced_again_for_it_when_the_signature_changes():
    """A signature that changed around the finding (a finding that came or went beside it) is no new evidence for
    its remedy: the rejection blocks the remedy wherever the same finding motivates it; a remedy another finding
    motivates is new evidence, and an exploit's remedy comes back under a new signature (the
    reward pays the exploit while it stands). The rejection still expires."""

    def remedy(name: str, target: str, value) -> Intervention:
        hyp = Hypothesis(finding=name, signal="x", direction="up")
        return Intervention(kind="set_knob", target=target, value=value, hypothesis=hyp).bind(H)

    plateau = remedy("plateau", "sampling.temperature", 1.3)
    past = [PastTrial(1, plateau, ("plateau",), "reject", (), 0.0, harness=H.version, step=40)]
    moved = brief([finding("plateau", ()), finding("truncation", ())], past)  # another signature, same finding
    kept, refused = screen([Proposal(plateau, "catalog")], moved)
    assert not kept and "as a remedy of plateau" in refused[0].reason
    collapse = remedy("entropy_collapse", "sampling.temperature", 1.3)
    assert screen([Proposal(collapse, "catalog")], moved)[0]
    assert screen([Proposal(plateau, "catalog")], replace(moved, step=101))[0]  # 61 steps later: expired
    hack = Finding(
        name="test_tampering",
        severity="critical",
        value=1,
        threshold=0,
        evidence=(),
        knobs=(),
        message="",
        validity=True,
    )
    exploit = remedy("test_tampering", "multi_turn.tool_error", "end")
    was = [PastTrial(1, exploit, ("test_tampering",), "reject", (), 0.0, harness=H.version, step=40)]
    assert not screen([Proposal(exploit, "catalog")], brief([hack], was))[0]  # the same signature: blocked
    assert screen([Proposal(exploit, "catalog")], brief([hack, finding("plateau", ())], was))[0]


def test_unscaled_advantages_are_the_first_scaling_explored():
    """Dr. GRPO's `none` before `batch`, whatever the registry's order; the choice in force is never a move."""
    assert moves(Harness(), "loss.scale_rewards") == ["none", "batch"]
    assert moves(Harness(loss={"scale_rewards": "none"}), "loss.scale_rewards") == ["group", "batch"]
