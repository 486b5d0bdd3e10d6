"""The skill library and the heuristic proposer: quarantine, evidence, retrieval, export/import, and
a second run that proposes the first run's skill first when the signature appears again."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from conftest import small_config, swe_hedged_repair
from evotrainer.cli.main import app
from evotrainer.diagnostics.detector import Finding
from evotrainer.envs.domains import variants_of
from evotrainer.errors import ConfigError, UserError
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Hypothesis, Intervention, diff
from evotrainer.loop import run_loop
from evotrainer.proposers.heuristic import HeuristicProposer
from evotrainer.proposers.proposer import Brief, PastTrial, intervention_key
from evotrainer.skills.exchange import export_file, import_file
from evotrainer.skills.library import GLOBAL_LIBRARY, Evidence, SkillLibrary, library_dir, model_name
from evotrainer.stages.results import read_stage
from evotrainer.store.ledger import Ledger

LR_UP = Intervention(
    kind="set_knob",
    target="optimizer.learning_rate",
    value=3e-4,
    hypothesis=Hypothesis(finding="plateau", signal="heldout/accuracy", direction="up"),
)


def _ev(trial: str, decision: str = "promote", run: str = "r1", sig=("plateau",)) -> Evidence:
    return Evidence(run=run, round=1, trial=trial, decision=decision, effect=0.05, domain="math", signature=list(sig))


def test_a_skill_is_quarantined_until_it_wins_twice_and_evidence_is_not_counted_twice(tmp_path):
    lib = SkillLibrary(tmp_path)
    iv = LR_UP.bind(Harness(optimizer={"learning_rate": 1e-4}))
    assert lib.record(iv, _ev("t1", "reject"), source="catalog", create=False) is None  # a loss creates nothing
    s = lib.record(iv, _ev("t1"), source="catalog", create=True)
    assert s.quarantined and s.wins == 1 and s.value == 3e-4 and s.factor is None
    assert lib.record(iv, _ev("t1"), source="catalog", create=True).wins == 1  # the same trial again (a resume)
    s = lib.record(iv, _ev("t2", run="r2"), source="catalog", create=True)
    assert not s.quarantined and s.wins == 2
    s = lib.record(iv, _ev("t3", "reject", run="r2"), source="catalog", create=False)
    assert (s.wins, s.losses) == (2, 1)
    # The skill is what the remedy set, on whatever learning rate the next harness has; where the harness already
    # holds it there is nothing to remedy.
    assert s.instantiate(Harness(optimizer={"learning_rate": 2e-5})).value == 3e-4
    with pytest.raises(ValueError, match="already"):
        s.instantiate(Harness(optimizer={"learning_rate": 3e-4}))


def test_export_import_round_trip_merges_evidence_and_carries_the_losses(tmp_path):
    a, b = SkillLibrary(tmp_path / "a"), SkillLibrary(tmp_path / "b")
    iv = LR_UP.bind(Harness(optimizer={"learning_rate": 1e-4}))
    a.record(iv, _ev("t1"), source="catalog", create=True)
    b.record(iv, _ev("t9", run="other"), source="catalog", create=True)
    lost = LR_UP.model_copy(update={"value": 1e-3}).bind(Harness(optimizer={"learning_rate": 1e-4}))
    a.record_loss(lost, _ev("t2", "reject"))
    assert export_file(a, tmp_path / "a.json") == (1, 1)
    assert import_file(b, tmp_path / "a.json") == 2
    import_file(b, tmp_path / "a.json")  # twice: nothing doubles
    [s] = b.all()
    assert s.wins == 2 and not s.quarantined
    # The loss came with it: a run in its context does not race that change again, and the record paces trials.
    [(again, ev)] = b.losses_in("math", "", "")
    assert again == lost.unbound() and ev.trial == "t2"
    assert b.record_in("math", "", "") == (2, 1)
    # An export of earlier versions (a list of skills alone) still loads.
    c = SkillLibrary(tmp_path / "c")
    (tmp_path / "old.json").write_text(json.dumps([s.model_dump(mode="json")]))
    assert import_file(c, tmp_path / "old.json") == 1 and c.all()[0].wins == 2 and not c.all_losses()
    for text in ("{not json", '{"losses": []}', "3"):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ConfigError, match="skills export"):
            import_file(c, tmp_path / "bad.json")
    assert len(c.all()) == 1 and not c.all_losses()  # refused before anything was written


def test_the_library_is_the_projects_unless_a_shared_one_is_asked_for(tmp_path, monkeypatch):
    """A toy run elsewhere must not write into the library real work reads: by default each project has its
    own, beside its runs; ~/.evotrainer/skills is read and written only where loop.skills_dir names it."""
    from evotrainer.config import LoopSection, parse_config

    assert LoopSection().skills_dir is None
    assert library_dir(None, tmp_path / "runs") == tmp_path / "runs" / "skills"
    assert library_dir("~/.evotrainer/skills", tmp_path / "runs") == GLOBAL_LIBRARY.expanduser()
    assert parse_config({"loop": {"skills_dir": "~/.evotrainer/skills"}}).loop.skills_dir == GLOBAL_LIBRARY
    # `skills list` reads the project's library (runs/skills from the project's directory) by default.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    iv = LR_UP.bind(Harness(optimizer={"learning_rate": 1e-4}))
    SkillLibrary(tmp_path / "runs" / "skills").record(iv, _ev("t1"), source="catalog", create=True)
    SkillLibrary(GLOBAL_LIBRARY).record(iv, _ev("t1", run="toy"), source="catalog", create=True)
    SkillLibrary(GLOBAL_LIBRARY).record(iv, _ev("t2", run="toy"), source="catalog", create=True)
    runner = CliRunner()
    [project] = json.loads(runner.invoke(app, ["skills", "list", "--json"]).stdout)
    [shared] = json.loads(runner.invoke(app, ["skills", "list", "--global", "--json"]).stdout)
    assert (project["wins"], shared["wins"]) == (1, 2) and project["quarantined"] and not shared["quarantined"]
    # A library that is not there is said to be missing, not listed as empty (a mistyped --dir).
    for command in (["list"], ["losses"], ["show", project["id"]], ["export", "out.json"]):
        missing = runner.invoke(app, ["skills", *command, "--dir", "elsewhere"])
        assert isinstance(missing.exception, UserError), (command, missing.output)
        assert "no skill library at elsewhere" in str(missing.exception)
    assert not (tmp_path / "out.json").exists()
    table = runner.invoke(app, ["skills", "list"])
    assert table.exit_code == 0 and project["id"] in table.stdout


def test_retrieval_ranks_by_signature_similarity(tmp_path):
    lib = SkillLibrary(tmp_path)
    h = Harness(optimizer={"learning_rate": 1e-4}, sampling={"temperature": 0.5})
    lib.record(LR_UP.bind(h), _ev("t1", sig=("plateau",)), source="catalog", create=True)
    temp = Intervention(
        kind="set_knob",
        target="sampling.temperature",
        value=0.8,
        hypothesis=Hypothesis(finding="zero_variance_groups", signal="frac_reward_zero_std", direction="down"),
    )
    lib.record(temp.bind(h), _ev("t2", sig=("zero_variance_groups", "truncation")), source="catalog", create=True)
    m = lib.match(("zero_variance_groups",), "math", h)
    assert [x.intervention.target for x in m] == ["sampling.temperature"]
    assert m[0].similarity == pytest.approx(0.5)
    assert lib.match(("entropy_collapse",), "math", h) == []


def test_a_skill_is_offered_in_another_domain_where_its_signature_matches_and_not_where_the_harness_holds_it(
    tmp_path,
):
    """The paper's filter found on SWE and reused on coding: a skill is a value with the context it won in, offered
    wherever its trigger signature appears, the same domain's (and model's) first on equal similarity, and not
    where the harness already holds its value (a step on the knob would apply again and again)."""
    lib = SkillLibrary(tmp_path)
    h = Harness()
    keep = Intervention(
        kind="set_knob",
        target="filters.std_keep_ratio",
        value=0.9,
        hypothesis=Hypothesis(finding="dead_outcome_groups", signal="frac_outcome_zero_std", direction="down"),
    )
    temp = Intervention(
        kind="set_knob",
        target="sampling.temperature",
        value=1.2,
        hypothesis=Hypothesis(finding="dead_outcome_groups", signal="frac_outcome_zero_std", direction="down"),
    )
    swe = Evidence(run="s", round=2, trial="r02-t1", decision="promote", effect=0.04, domain="swe", model="tiny")
    lib.record(keep.bind(h), swe.model_copy(update={"signature": ["dead_outcome_groups"]}), source="llm", create=True)
    code = swe.model_copy(update={"domain": "code", "trial": "r03-t1", "signature": ["dead_outcome_groups"]})
    lib.record(temp.bind(h), code, source="catalog", create=True)
    m = lib.match(("dead_outcome_groups",), "code", h, "tiny")
    assert [(x.intervention.target, x.domains) for x in m] == [
        ("sampling.temperature", ("code",)),  # won here: first on equal similarity
        ("filters.std_keep_ratio", ("swe",)),  # won on SWE, offered on code
    ]
    assert m[1].intervention.value == 0.9
    # In a third domain both are offered (neither won there).
    assert {x.intervention.target for x in lib.match(("dead_outcome_groups",), "math", h)} == {
        "filters.std_keep_ratio",
        "sampling.temperature",
    }
    held = h.model_copy(update={"filters": h.filters.model_copy(update={"std_keep_ratio": 0.9})})
    assert [x.intervention.target for x in lib.match(("dead_outcome_groups",), "code", held)] == [
        "sampling.temperature"
    ]


def _finding(name: str, knobs=("optimizer.learning_rate",), severity="warning", validity=False) -> Finding:
    return Finding(name, severity, 1.0, 0.5, ("x-s000001-0000",), knobs, "m", validity)


def test_heuristic_proposes_skills_first_then_remedies_and_never_repeats_a_rejection(tmp_path):
    h = Harness(optimizer={"learning_rate": 1e-4})
    lib = SkillLibrary(tmp_path)
    lib.record(LR_UP.bind(h), _ev("t1"), source="catalog", create=True)
    findings = [_finding("plateau", ("curriculum.levels", "optimizer.learning_rate", "sampling.temperature"))]
    brief = Brief(
        run="r",
        round=1,
        domain="math",
        harness=h,
        findings=findings,
        signature=("plateau",),
        skills=lib.match(("plateau",), "math", h),
        limit=3,
        explore=0.34,
    )
    out = HeuristicProposer().propose(brief).proposals
    assert out[0].source == "skill" and out[0].intervention.target == "optimizer.learning_rate"
    assert len(out) == 3 and len({intervention_key(p.intervention) for p in out}) == 3
    for p in out:  # every proposal is one change that applies
        assert len(diff(h, p.intervention.apply(h))) == 1 and p.intervention.bound
    # A rejection under the same signature is not proposed again, nor for the same finding under another; where
    # another finding motivated it, this one may.
    rejected = out[1].intervention
    past = [PastTrial(1, rejected, ("plateau",), "reject", ("no_supported_gain",), -0.01)]
    again = HeuristicProposer().propose(Brief(**{**brief.__dict__, "history": past})).proposals
    assert intervention_key(rejected) not in {intervention_key(p.intervention) for p in again}

    def proposed_after(iv: Intervention) -> set[str]:
        history = [PastTrial(1, iv, ("truncation",), "reject", (), None)]
        return {
            intervention_key(p.intervention)
            for p in HeuristicProposer().propose(replace(brief, history=history)).proposals
        }

    assert intervention_key(rejected) not in proposed_after(rejected)
    elsewhere = rejected.hypothesis.model_copy(update={"finding": "truncation"})
    assert intervention_key(rejected) in proposed_after(rejected.model_copy(update={"hypothesis": elsewhere}))


def test_exploration_keeps_a_share_of_untried_knobs():
    h = Harness(reward_weights={"correct": 1.0, "contains_answer": 0.5})
    findings = [_finding("reward_hacking", ("reward_weights.contains_answer",), "critical", True)]
    out = (
        HeuristicProposer()
        .propose(
            Brief(
                run="r",
                round=1,
                domain="math",
                harness=h,
                findings=findings,
                signature=("reward_hacking",),
                limit=3,
                explore=0.34,
            )
        )
        .proposals
    )
    assert [p.source for p in out].count("explore") == 1
    assert (
        out[0].intervention.kind == "remove_reward_term" and out[0].intervention.hypothesis.finding == "reward_hacking"
    )


def test_a_second_run_proposes_the_first_runs_skill_first(tmp_path, math_setup):
    """Two real loop runs sharing one skill library, same seed, so run 2's first round sees run 1's
    signature again. The remember stage turns run 1's promotions into skills; the test-sized model
    is too noisy to promote reproducibly in one short round, so the win of run 1's first proposal is
    recorded through the library (as the remember stage does for a promote verdict). Run 2 must then
    propose that skill before anything else, trial it, and add its verdict to the skill's evidence.
    (tests/test_earned.py runs the same path with a promotion the gate earned, nothing written by hand.)"""
    skills = tmp_path / "skills"

    def cfg(name: str):
        return small_config(
            tmp_path,
            run={"name": name, "out_dir": str(tmp_path / "runs"), "seed": 0},
            loop={"segment_steps": 3, "trial_steps": 3, "candidates": 2, "max_rounds": 1, "skills_dir": str(skills)},
        )

    run_loop(cfg("first"), Console(file=io.StringIO()))
    first = Ledger(tmp_path / "runs" / "first" / "ledger.sqlite")
    lib = SkillLibrary(skills)
    promoted = {v["trial"] for v in first.verdicts() if v["decision"] == "promote"}
    assert {e.trial for s in lib.all() for e in s.evidence if e.decision == "promote"} == promoted
    trial = first.trials()[0]
    if trial["id"] not in promoted:
        v = next(v for v in first.verdicts() if v["trial"] == trial["id"])
        lib.record(
            Intervention.model_validate(trial["intervention"]),
            Evidence(
                run="first",
                round=1,
                trial=trial["id"],
                decision="promote",
                effect=v["statistic"]["delta"],
                domain="math",
                signature=trial["signature"],
                # the context the remember stage records: a win there outweighs run 1's loss of the same change
                model=model_name(cfg("first").policy),
                harness=next(b["harness_version"] for b in first.branches() if b["id"] == trial["control"]),
            ),
            source=trial["source"],
            create=True,
        )
    [skill] = [s for s in lib.all() if any(e.trial == trial["id"] for e in s.evidence)]

    run_loop(cfg("second"), Console(file=io.StringIO()))
    second = Ledger(tmp_path / "runs" / "second" / "ledger.sqlite")
    proposed = read_stage(second, 1, "propose")
    assert proposed.signature == trial["signature"]
    assert proposed.proposals[0].source == "skill" and proposed.proposals[0].skill_id == skill.id
    assert second.trials()[0]["skill_id"] == skill.id
    evidence = {(e.run, e.trial) for e in lib.get(skill.id).evidence}
    assert ("second", "r01-t1") in evidence and ("first", trial["id"]) in evidence
    assert json.loads(lib.get(skill.id).model_dump_json())["lineage"]["run"] == "first"


def test_exploit_findings_get_the_remedy_that_closes_the_channel_first():
    # SWE: the naive test reward is regraded with the original tests restored (one factor: the weight moves).
    h = Harness(reward_weights={"tests": 1.0, "format": 0.1})
    swe = [
        _finding(
            "test_tampering",
            ("reward_weights.tests", "reward_weights.correct", "reward_weights.tests_restored"),
            "critical",
            True,
        )
    ]
    out = (
        HeuristicProposer()
        .propose(
            Brief(
                run="r",
                round=1,
                domain="swe",
                harness=h,
                findings=swe,
                signature=("test_tampering",),
                limit=2,
                explore=0.0,
            )
        )
        .proposals
    )
    first = out[0].intervention
    assert (first.kind, first.target, first.value) == ("replace_reward_term", "reward_weights.tests", "tests_restored")
    assert first.apply(h).reward_weights == {"tests_restored": 1.0, "format": 0.1}
    assert [p.intervention.kind for p in out] == ["replace_reward_term", "remove_reward_term"]
    # Already regraded: no replacement is proposed again (the harness pays tests_restored, not tests).
    done = Harness(reward_weights={"tests_restored": 1.0, "format": 0.1})
    assert all(
        p.intervention.kind != "replace_reward_term"
        for p in HeuristicProposer()
        .propose(
            Brief(
                run="r",
                round=1,
                domain="swe",
                harness=done,
                findings=swe,
                signature=("test_tampering",),
                limit=3,
                explore=0.0,
            )
        )
        .proposals
    )
    # Code: hard-coding the visible examples: `correct` is regraded so that keyed completions earn nothing.
    h = Harness(reward_weights={"correct": 1.0, "format": 0.1})
    code = [
        _finding(
            "hardcoded_examples",
            ("reward_weights.correct", "reward_weights.visible", "reward_weights.correct_not_hardcoded"),
            "critical",
            True,
        )
    ]
    first = (
        HeuristicProposer()
        .propose(
            Brief(
                run="r",
                round=1,
                domain="code",
                harness=h,
                findings=code,
                signature=("hardcoded_examples",),
                limit=2,
                explore=0.0,
            )
        )
        .proposals[0]
        .intervention
    )
    assert (first.kind, first.target, first.value) == (
        "replace_reward_term",
        "reward_weights.correct",
        "correct_not_hardcoded",
    )


def test_truncation_in_a_multi_turn_harness_may_cut_observations():
    finding = _finding(
        "truncation", ("sampling.max_completion_length", "multi_turn.max_observation_tokens"), "warning", False
    )

    def proposals(h: Harness) -> list[tuple[str, object]]:
        brief = Brief(
            run="r", round=1, domain="swe", harness=h, findings=[finding], signature=("truncation",), limit=4,
            explore=0.0,
        )  # fmt: skip
        return [(p.intervention.target, p.intervention.value) for p in HeuristicProposer().propose(brief).proposals]

    single = proposals(Harness())
    assert single and all(t != "multi_turn.max_observation_tokens" for t, _ in single)  # one turn: no observations
    multi = proposals(Harness(multi_turn={"max_turns": 8}))
    assert ("multi_turn.max_observation_tokens", 64) in multi
    halved = proposals(Harness(multi_turn={"max_turns": 8, "max_observation_tokens": 64}))
    assert ("multi_turn.max_observation_tokens", 32) in halved


def test_only_a_skill_won_in_this_very_context_is_adopted_and_a_chain_is_adopted_in_order(tmp_path):
    """SkillLibrary.adoptable: the same domain, model and harness version, more wins than losses there."""
    lib, h = SkillLibrary(tmp_path), Harness(optimizer={"learning_rate": 1e-4})

    def won(trial: str, iv: Intervention, at: Harness, decision="promote", domain="math", model="tiny"):
        ev = Evidence(
            run="r1", round=1, trial=trial, decision=decision, domain=domain, model=model, harness=at.version
        )
        lib.record(iv.bind(at), ev, source="catalog", create=True)

    other = Harness(optimizer={"learning_rate": 1e-4}, sampling={"temperature": 0.7})
    won("t1", LR_UP, other)  # won from another harness
    won("t2", LR_UP, h, domain="code")  # in another domain
    won("t3", LR_UP, h, model="Qwen2.5-0.5B")  # with another model
    assert lib.adoptable("math", "tiny", h) is None
    won("t4", LR_UP, h)
    assert lib.adoptable("math", "tiny", h).target == "optimizer.learning_rate"
    won("t5", LR_UP, h, decision="reject")  # as many losses as wins here: not proven
    assert lib.adoptable("math", "tiny", h) is None
    won("t6", LR_UP, h)
    child = lib.adoptable("math", "tiny", h).instantiate(h).bind(h).apply(h)
    assert lib.adoptable("math", "tiny", child) is None  # it holds the value now, and nothing won from it
    # The next link of a chain: a skill won from the harness the first one made.
    temp = Intervention(kind="set_knob", target="sampling.temperature", value=0.7, hypothesis=LR_UP.hypothesis)
    won("t7", temp, child)
    assert lib.adoptable("math", "tiny", child).target == "sampling.temperature"
    assert lib.adoptable("math", "tiny", h).target == "optimizer.learning_rate"


def test_a_repair_makes_a_skill_that_is_adopted_from_its_harness_but_is_no_win(tmp_path):
    """A repair (the gate took a rejected remedy's harness in place of one whose control paid an exploit) creates
    the skill and counts towards adoption from that very harness, but not as a win: it stays quarantined, and a
    loss there cancels it as a loss cancels a win."""
    lib, h = SkillLibrary(tmp_path), Harness(optimizer={"learning_rate": 1e-4})

    def seen(trial: str, decision: str):
        ev = Evidence(run="r1", round=1, trial=trial, decision=decision, domain="swe", model="tiny", harness=h.version)
        return lib.record(LR_UP.bind(h), ev, source="catalog", create=decision in ("promote", "repair"))

    assert seen("t1", "reject") is None  # a plain rejection creates nothing
    skill = seen("t2", "repair")
    assert (skill.wins, skill.losses, skill.quarantined) == (0, 0, True)
    assert lib.adoptable("swe", "tiny", h).id == skill.id
    assert lib.adoptable("code", "tiny", h) is None  # only where it repaired
    [listed] = json.loads(CliRunner().invoke(app, ["skills", "list", "--dir", str(tmp_path), "--json"]).stdout)
    assert (listed["wins"], listed["losses"], listed["repairs"]) == (0, 0, 1)
    seen("t3", "reject")
    assert lib.adoptable("swe", "tiny", h) is None


def test_a_regrade_learned_in_one_domain_is_adopted_in_another_as_the_term_it_plays_there(tmp_path):
    """SkillLibrary.adoptable_across: SWE's repair `tests` -> `tests_restored` (paired with a learning rate) maps onto
    code's exposed term, `correct` -> `correct_not_hardcoded`, by the domain's declared audited variants; its paired
    rate does not cross. Not where the harness pays no exposed term, not once it has lost more than it won in the
    domain it would be adopted in, and not where its standing over all its contexts is not positive."""
    code = variants_of("code")
    lib = SkillLibrary(tmp_path)
    swe_h, regrade = swe_hedged_repair()

    def seen(trial: str, decision: str, domain: str = "swe", iv=regrade, at=swe_h, sid=None):
        ev = Evidence(
            run="r1",
            round=1,
            trial=trial,
            decision=decision,
            domain=domain,
            model="tiny",
            harness=at.version,
            signature=["reward_audit_gap", "test_tampering"],
        )
        return lib.record(iv, ev, source="hedge", create=decision in ("promote", "repair"), sid=sid)

    code_h = Harness(reward_weights={"correct": 1.0, "format": 0.1}, optimizer={"learning_rate": 1e-4})
    assert lib.adoptable_across("code", "tiny", code_h, code) is None  # an empty library
    skill = seen("t1", "repair")
    found = lib.adoptable_across("code", "tiny", code_h, code)
    assert found is not None and found[0].id == skill.id
    iv = found[1]
    assert (iv.kind, iv.target, iv.value, iv.paired) == (
        "replace_reward_term",
        "reward_weights.correct",
        "correct_not_hardcoded",
        None,
    )
    child = iv.bind(code_h).apply(code_h)
    assert child.reward_weights == {"correct_not_hardcoded": 1.0, "format": 0.1}
    assert child.optimizer.learning_rate == 1e-4  # SWE's 2.5e-4 stays SWE's
    assert iv.hypothesis.finding == "reward_audit_gap" and skill.id in iv.hypothesis.rationale
    # Offered where its signature overlaps, as the term it plays here; not by its own names, which code lacks.
    [offered] = lib.match(("hardcoded_examples", "reward_audit_gap"), "code", code_h, "tiny", code)
    assert (offered.skill_id, offered.intervention) == (skill.id, iv)
    assert lib.match(("hardcoded_examples", "reward_audit_gap"), "code", code_h, "tiny") == []
    # Nothing exposed left to regrade once it pays the audited variant; nothing where the domain declares none.
    assert lib.adoptable_across("code", "tiny", child, code) is None
    assert lib.adoptable_across("math", "tiny", Harness(reward_weights={"correct": 1.0}), {}) is None
    # Held against it in code (start.held_against records such a loss): it is not adopted in code again, but
    # still where it has not lost, since its standing over all its contexts stays positive.
    seen("t2", "repair")
    seen("t3", "reject", domain="code", iv=iv.bind(code_h), at=code_h, sid=skill.id)
    assert lib.adoptable_across("code", "tiny", code_h, code) is None
    assert lib.adoptable_across("code", "Qwen2.5-0.5B", code_h, code) is not None
    # Its standing over all contexts no longer positive: offered nowhere.
    seen("t4", "reject")
    assert lib.adoptable_across("code", "Qwen2.5-0.5B", code_h, code) is None
