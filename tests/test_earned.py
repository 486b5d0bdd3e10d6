"""The earned path, end to end through run_loop: a promotion won in a real trial moves the mainline to the
candidate, the remember stage turns it into a skill, and a later run with the same library proposes that
skill first. Nothing is written into the library or the ledger by hand.

The plant: the mainline's harness warms its learning rate up towards a rate that wrecks the test-sized
policy (0.3 over 1,000 steps: 3e-4 at the segment's one step, climbing to 6e-3 in the trial), so the
segment leaves the policy where it was and the control then destroys it, while the candidate the
(scripted, over real HTTP) LLM proposes sets a learning rate that leaves it standing. On a 400-step warm
start at seed 0 the candidate keeps 0.39 of the 80 gate tasks and the control is left 0.01: the race is
30 wins to 0, the confirmation 28 to 3 (p 2e-6 combined). The candidate must win the race, be confirmed on
fresh seeds beside a control replicate, and be promoted."""

from __future__ import annotations

import io
import json
import os
import shutil

import pytest
from rich.console import Console

from conftest import small_config, started_with, swe_hedged_repair
from evotrainer.cli.loop import run_state
from evotrainer.harness.interventions import Hypothesis, Intervention
from evotrainer.loop import run_loop
from evotrainer.report import write_report
from evotrainer.skills.library import Evidence, SkillLibrary, model_name
from evotrainer.stages.results import Rollback, read_stage
from evotrainer.stages.start import held_against, open_run
from evotrainer.store.ledger import Ledger
from fake_llm import MODEL, FakeLLM, iv

QUIET = Console(file=open(os.devnull, "w"))
NOTHING = '{"interventions": [], "detectors": []}'


# Pinned, as it tests a mechanism: the tiny warm start's quality is a property of its seed (400 steps solve
# 38% of the gate tasks at seed 0 but 8% at seed 4, where a wrecked control leaves the candidate too little
# to win by), and the robustness grid found exactly that at seed 4 with the 150-step base.
EARNED_SEED = 0
WARM_START = {"steps": 400, "batch_size": 64, "learning_rate": 3e-3, "demonstrations": 4000}


def _cfg(tmp_path, name: str, skills, **loop):
    return small_config(
        tmp_path,
        run={"name": name, "out_dir": str(tmp_path / "runs"), "seed": EARNED_SEED},
        policy={"warm_start": WARM_START},
        harness={"sampling": {"num_generations": 8, "prompts_per_step": 16, "max_completion_length": 8}}
        | {"optimizer": {"learning_rate": 0.3, "warmup_steps": 1000}, "reward_weights": {"correct": 1.0}},
        # No training rollout audited: the validity rules are tested in test_gate.py, and the tiny base's
        # reward and audit disagree on a tenth of the paid answers, which would count against a wrecked arm.
        eval={"heldout_size": 100, "audit_fraction": 0.0},
        # 80 gate tasks of the 100 this one-digit dataset can hold out. A run-level error rate of 0.2 tests the first
        # raced round at 0.05: with no SIMD kernels (ATEN_CPU_CAPABILITY=default) the control's replicate kept
        # 0.175 where the control kept 0.0125, an A-A pair that puts phi at 3.8, and the win (26-1, then 18-6)
        # reached p 0.021; this tests the earned path, not the gate's power (test_gate.py, gate_simulation.py).
        gate={"final_fraction": 0.2, "level": 0.8},
        loop={
            "segment_steps": 1,
            "trial_steps": 20,
            "race_checkpoints": 1,
            "candidates": 1,
            "max_trial_share": 1.0,
            "max_rounds": 1,
            "skills_dir": str(skills),
            **loop,
        },
    )


def test_a_promotion_earned_in_a_trial_moves_the_mainline_becomes_a_skill_and_is_reused(tmp_path, math_setup):
    skills = tmp_path / "skills"
    fake = FakeLLM([json.dumps({"interventions": [iv("optimizer.learning_rate", 1e-4)], "detectors": []}), NOTHING])
    try:
        first = _cfg(tmp_path, "first", skills, proposer="llm")
        first = first.model_copy(update={"llm": first.llm.model_copy(update={"base_url": fake.url, "model": MODEL})})
        run_loop(first, QUIET)
    finally:
        fake.close()
    ledger = Ledger(tmp_path / "runs" / "first" / "ledger.sqlite")
    try:
        [trial] = ledger.trials()
        [v] = ledger.verdicts()
        assert trial["source"] == "llm" and v["decision"] == "promote", v["reasons"]
        s = v["statistic"]
        # Won in the race and again on fresh seeds: the effect on record is the confirmation's.
        assert s["test"] == "two_stage" and s["stage1"]["wins"] > s["stage1"]["losses"] and s["delta"] > 0
        promoted = read_stage(ledger, 1, "promote")
        # The mainline continues from the candidate, under the candidate's harness.
        assert promoted.promoted == trial["id"] and promoted.head.branch == "r01-c1"
        assert promoted.head.harness.optimizer.learning_rate == 1e-4
        applied_to = read_stage(ledger, 1, "trial").arm("r01-ctl").harness_version  # the harness it changed
    finally:
        ledger.close()
    [skill] = SkillLibrary(skills).all()
    # What the remedy set (the value, not a step from the old one) and the context it won in.
    assert skill.target == "optimizer.learning_rate" and skill.value == 1e-4 and skill.factor is None
    [won] = skill.evidence
    assert (won.run, won.decision, won.domain, won.model, won.before, won.reused) == (
        "first",
        "promote",
        "math",
        "tiny",
        0.3,
        False,
    )
    assert won.harness == applied_to
    assert skill.lineage["run"] == "first" and skill.lineage["source"] == "llm"

    shutil.copytree(skills, tmp_path / "skills-adopt")  # the library as the first run left it, for the third

    # A second run with the same library and the heuristic proposer: same seed, same round-1 signature, so
    # the earned skill is proposed before anything else, trialled, and its verdict added to its evidence.
    run_loop(_cfg(tmp_path, "second", skills), QUIET)
    second = Ledger(tmp_path / "runs" / "second" / "ledger.sqlite")
    try:
        proposed = read_stage(second, 1, "propose")
        first_proposal = proposed.proposals[0]
        assert first_proposal.source == "skill" and first_proposal.skill_id == skill.id
        assert first_proposal.intervention.value == pytest.approx(1e-4, rel=1e-3)
        assert second.trials()[0]["skill_id"] == skill.id
    finally:
        second.close()
    again = SkillLibrary(skills).get(skill.id)
    assert {e.run for e in again.evidence} == {"first", "second"}
    # Its record says where it was reused and what it bought there.
    [reuse] = again.reuses
    assert reuse.run == "second" and reuse.effect is not None

    # A third run with the first run's library and loop.adopt_skills: the skill won from this very harness, in this
    # domain with this model, so the run starts under it without a trial. The harness it starts under is the one the
    # first run promoted, version for version (the same content, the same parent).
    run_loop(_cfg(tmp_path, "third", tmp_path / "skills-adopt", adopt_skills=True), QUIET)
    third = Ledger(tmp_path / "runs" / "third" / "ledger.sqlite")
    try:
        started = read_stage(third, 0, "start")
        [adopted] = started.adopted
        assert adopted.skill == skill.id and adopted.won == [f"first/{trial['id']}"]
        assert (adopted.harness_from, adopted.harness_to) == (applied_to, promoted.head.harness.version)
        [base] = [b for b in third.branches() if b["id"] == started.head.branch]
        assert base["harness_version"] == promoted.head.harness.version
        # The round's segment trained under it, and the skill is not proposed again: the harness holds its value.
        assert read_stage(third, 1, "train").harness_version == promoted.head.harness.version
        assert skill.id not in [p.skill_id for p in read_stage(third, 1, "propose").proposals]
    finally:
        third.close()
    [record] = [e for e in SkillLibrary(tmp_path / "skills-adopt").get(skill.id).evidence if e.run == "third"]
    assert (record.decision, record.reused, record.harness, record.before) == ("adopt", True, applied_to, 0.3)
    summary = json.loads((tmp_path / "runs" / "third" / "summary.json").read_text())
    assert summary["adopted"] == [f"{skill.id}: {adopted.intervention.describe()}"]
    assert run_state(tmp_path / "runs" / "third").rows["adopted skills"].startswith(skill.id)
    assert run_state(tmp_path / "runs" / "first").rows["adopted skills"] == "-"  # off by default


def test_a_round_rolled_back_under_an_adopted_harness_counts_against_the_skill(tmp_path, math_setup):
    """The reverse of the third run above: the library holds a skill that won once from this harness, setting the
    learning rate the plant above wrecks the policy with (0.3, warmed up over 1,000 steps). The run adopts it; the
    round's one step leaves the policy standing, then the control under the adopted harness destroys it, so the
    regression guard sends the mainline back. That is the adoption doing harm: a loss against the skill in the
    context it was adopted from, and the next run starting there adopts nothing."""
    skills = tmp_path / "skills"
    cfg = _cfg(tmp_path, "harmed", skills, adopt_skills=True)
    start = cfg.harness.model_copy(
        update={"optimizer": cfg.harness.optimizer.model_copy(update={"learning_rate": 1e-4})}
    )
    cfg = cfg.model_copy(update={"harness": start})
    plant = Intervention(
        kind="set_knob",
        target="optimizer.learning_rate",
        value=0.3,
        hypothesis=Hypothesis(finding="plateau", signal="heldout/accuracy", direction="up"),
    ).bind(start)
    won = Evidence(run="earlier", round=1, trial="r01-t1", decision="promote", domain="math", harness=start.version)
    lib = SkillLibrary(skills)
    skill = lib.record(plant, won.model_copy(update={"model": model_name(cfg.policy)}), source="catalog", create=True)
    # A candidate that cannot win: it trains under the adopted rate too.
    temp = Intervention(kind="set_knob", target="sampling.temperature", value=1.2, hypothesis=plant.hypothesis)
    cfg = cfg.model_copy(update={"loop": cfg.loop.model_copy(update={"planted": [temp]})})
    out = io.StringIO()
    run_loop(cfg, Console(file=out, width=400))
    ledger = Ledger(tmp_path / "runs" / "harmed" / "ledger.sqlite")
    try:
        [adopted] = read_stage(ledger, 0, "start").adopted
        assert adopted.skill == skill.id and adopted.harness_from == start.version
        back = read_stage(ledger, 1, "promote").rejected
        assert back is not None and (back.branch, back.reasons) == ("r01-ctl", ["regression"])
        held = [s for s in read_stage(ledger, 1, "remember").skills if s["skill"] == skill.id]
        assert held == [
            {"skill": skill.id, "trial": "adopt-1-held", "wins": 1, "losses": 1, "quarantined": True,
             "run_wins": 0, "run_losses": 1, "held": True}
        ]  # fmt: skip
    finally:
        ledger.close()
    # The win is the earlier run's, the loss this run's: the note tells the two apart.
    said = (
        f"{skill.id} (this run 0 won, 1 lost; library 1 won, 1 lost, quarantined; held against its adoption: the "
        "round rolled back under it)"
    )
    assert said in out.getvalue() and said in write_report(tmp_path / "runs" / "harmed").read_text()
    [loss] = [e for e in lib.get(skill.id).evidence if e.decision == "reject"]
    assert (loss.run, loss.harness, loss.before, loss.reused) == ("harmed", start.version, 1e-4, True)
    assert lib.adoptable("math", model_name(cfg.policy), start) is None
    # What is not held against it, read on the same run: a fall after rounds kept under the adopted harness, and
    # a control rejected for an exploit other than the one the skill's hypothesis names.
    ctx = open_run(cfg, resume=True)
    try:
        under = adopted.harness_to
        later = Rollback(branch="r02-ctl", reasons=["regression"], rolled_back_to="r01-seg")
        other = Rollback(branch="r02-ctl", reasons=["validity:paid_wrong"], rolled_back_to="base")
        assert held_against(ctx, 2, under, later, []) == held_against(ctx, 2, under, other, []) == []
        assert [
            t for t, _ in held_against(ctx, 2, under, other.model_copy(update={"reasons": ["validity:plateau"]}), [])
        ] == ["adopt-1-held"]
    finally:
        ctx.ledger.close()
    assert len([e for e in lib.get(skill.id).evidence if e.decision == "reject"]) == 1  # once a run


def test_a_regrade_repaired_in_swe_is_adopted_by_a_code_run_and_held_to_account_there(tmp_path):
    """loop.adopt_skills `across`, through the start stage of a real code run: the library holds only SWE's repair
    (`tests` -> `tests_restored`, with the learning rate it was raced at), and the code run starts under code's
    regrade of its own exposed term, its learning rate untouched, recorded as an adoption of that skill, in its
    evidence as reused in code. A control then rejected for the audit gap under it is one loss there, and the next
    code run adopts nothing; with adopt_skills true (this context only) it adopts nothing either."""
    skills = tmp_path / "skills"
    swe_h, regrade = swe_hedged_repair()
    ev = Evidence(run="swe-1", round=1, trial="r01-t2", decision="repair", domain="swe", model="tiny",
                  harness=swe_h.version)  # fmt: skip
    skill = SkillLibrary(skills).record(regrade, ev, source="hedge", create=True)

    def code_cfg(name: str, adopt):
        return small_config(tmp_path, run={"name": name}, env={"domain": "code"},
                            loop={"adopt_skills": adopt, "max_rounds": 1, "skills_dir": str(skills)})  # fmt: skip

    assert started_with(code_cfg("only-here", True), {})[1].harness.reward_weights == {"correct": 1.0, "format": 0.1}
    cfg = code_cfg("across", "across")
    ctx, head = started_with(cfg, {})
    try:
        [adopted] = read_stage(ctx.ledger, 0, "start").adopted
        assert adopted.skill == skill.id and adopted.won == ["swe-1/r01-t2 (repair, swe)"]
        assert (adopted.intervention.target, adopted.intervention.value) == (
            "reward_weights.correct",
            "correct_not_hardcoded",
        )
        assert head.harness.reward_weights == {"correct_not_hardcoded": 1.0, "format": 0.1}
        assert head.harness.optimizer.learning_rate == cfg.harness.optimizer.learning_rate
        assert head.harness.version == adopted.harness_to != cfg.harness.version
        [record] = [e for e in SkillLibrary(skills).get(skill.id).evidence if e.run == "across"]
        assert (record.decision, record.domain, record.reused, record.before) == ("adopt", "code", True, 1.0)
        gap = Rollback(branch="r01-ctl", reasons=["validity:reward_audit_gap"], rolled_back_to="base")
        assert [t for t, _ in held_against(ctx, 1, adopted.harness_to, gap, [])] == ["adopt-1-held"]
    finally:
        ctx.ledger.close()
    assert started_with(code_cfg("again", "across"), {})[1].harness.reward_weights == cfg.harness.reward_weights
