"""The co-evolution loop end to end on a tiny real model: ledger, verdicts, budget, report, CLI."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys

import pytest
from rich.console import Console
from typer.testing import CliRunner

from conftest import small_config, started_with
from evotrainer.diagnostics.detector import Finding, Window, finding
from evotrainer.diagnostics.suite import Suite
from evotrainer.envs.registry import make_domain
from evotrainer.errors import ConfigError
from evotrainer.evaluation import evaluate, evaluator_hash
from evotrainer.harness.interventions import Intervention
from evotrainer.ids import EVAL, TRAIN, branch_id, parse_shard, rollout_id, shard_id, trial_id
from evotrainer.loop import run_loop, run_round
from evotrainer.policies.hf import HFPolicy
from evotrainer.proposers.proposer import intervention_key
from evotrainer.skills.library import model_name
from evotrainer.stages import race
from evotrainer.stages.context import split_heldout
from evotrainer.stages.results import read_stage
from evotrainer.store.ledger import STAGES, Ledger
from evotrainer.store.rollouts import RolloutStore


def loop_config(tmp, **sections):
    # No token budget here: the trial share cap is off, so the rounds race both candidates.
    loop = {
        "segment_steps": 3,
        "trial_steps": 4,
        "candidates": 2,
        "max_rounds": 2,
        "skills_dir": str(tmp / "skills"),
        "max_trial_share": 1.0,
    }
    loop.update(sections.pop("loop", {}))
    return small_config(tmp, loop=loop, **sections)


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory, math_setup):
    tmp = tmp_path_factory.mktemp("loop")
    cfg = loop_config(tmp, loop={"skills_dir": None})  # the default library: the project's, beside its runs
    summary = run_loop(cfg, quiet())
    return cfg, tmp / "runs" / "t", summary


def test_a_round_runs_every_stage_and_records_it(loop_run):
    cfg, run_dir, summary = loop_run
    ledger = Ledger(run_dir / "ledger.sqlite")
    done = {(r["round"], r["stage"]) for r in ledger.rows("SELECT round, stage FROM stages")}
    for rnd in (1, 2):
        assert {(rnd, s) for s in STAGES} <= done
    assert {(0, "start"), (0, "final")} <= done
    assert summary["rounds"] == 2 and summary["stop_reason"] == "loop.max_rounds=2"
    assert summary["cut_by_seconds"] is False  # the round cap ended it, not a seconds cap
    assert summary["past_budget"] == {}  # no cap set (or none passed): nothing to say
    branches = {b["id"]: b for b in ledger.branches()}
    # The race's arms fork from the round's segment, on the same first step (from where the round started
    # instead when the segment carries a validity finding), each on its own seeds; a loser stopped early;
    # a finalist was confirmed beside a control replicate.
    for rnd in (1, 2):
        seg = branches[read_stage(ledger, rnd, "train").branch]  # round 1's again where it carried an exploit
        tainted = any(f.validity for st in ("diagnose", "revise") for f in read_stage(ledger, rnd, st).findings)
        arms = [b for b in branches.values() if b["round"] == rnd and b["kind"] != "segment"]
        assert {b["kind"] for b in arms} >= {"control"}
        assert len({b["first_step"] for b in arms}) == 1 and len({b["seed"] for b in arms}) == len(arms)
        for b in arms:
            assert (b["parent"], b["first_step"]) == (
                (seg["parent"], seg["first_step"]) if tainted else (seg["id"], seg["last_step"] + 1)
            )
        tried = read_stage(ledger, rnd, "trial")
        # loop.trial_unit tokens: an arm that was not stopped trained to the tokens trial_steps of the segment's
        # steps generated (or to its cap of 4 x trial_steps steps); one that lost the race stopped short.
        segment = read_stage(ledger, rnd, "train")
        target = segment.generated_tokens // segment.steps_trained * cfg.loop.trial_steps
        for a in tried.arms:
            reached = a.generated_tokens >= target or a.steps_trained == 4 * cfg.loop.trial_steps
            assert reached != bool(a.stopped)
        if tried.finalist:
            assert {branch_id(rnd, "replicate", tried.finalist), branch_id(rnd, "control_replicate")} <= set(branches)


def test_verdicts_carry_statistic_noise_findings_budget_and_evaluator_hash(loop_run):
    cfg, run_dir, summary = loop_run
    ledger = Ledger(run_dir / "ledger.sqlite")
    domain = make_domain(cfg)
    gate_ids, final_ids = split_heldout([t.id for t in domain.tasks("heldout")], cfg.gate.final_fraction, cfg.run.seed)
    assert not set(gate_ids) & set(final_ids)
    by_id = {t.id: t for t in domain.tasks("heldout")}
    expected = evaluator_hash(domain, [by_id[i] for i in gate_ids], cfg.eval)
    verdicts = ledger.verdicts()
    assert verdicts, "two rounds with two candidates each must leave verdicts"
    for v in verdicts:
        assert v["decision"] in ("promote", "reject")
        assert v["evaluator_hash"] == expected
        s = v["statistic"]
        assert s["test"] in ("race", "two_stage") and s["candidates"] >= 1
        if s["test"] == "race":  # stopped, or not the race's best: the race's own comparison is on record
            assert s["delta"] == pytest.approx(s["candidate_accuracy"] - s["control_accuracy"])
            assert ("stopped" in s) == ("stopped_early" in v["reasons"])
        else:  # the finalist: both stages, and the effect on record is the confirmation's
            assert s["delta"] == s["stage2"]["delta"] and s["selected_delta"] == s["stage1"]["delta"]
        assert {"phi", "pairs_used", "valid"} <= set(v["noise"])
        assert v["budget"]["candidate"]["generated_tokens"] > 0
        assert (v["decision"] == "promote") == (not v["reasons"])
        if v["decision"] == "promote":
            assert s["p"] <= 1 - cfg.gate.level and v["noise"]["valid"]
    store = RolloutStore(run_dir / "store")
    ids = {r["id"] for r in store.sql("SELECT id FROM rollouts")}
    for v in verdicts:
        for side in v["statistic"]["evidence"].values():
            assert set(side) <= ids  # verdicts cite rollouts that exist
    for f in store.sql("SELECT evidence FROM findings"):
        assert set(f["evidence"]) <= ids


def test_the_trial_stops_benchmark_reads_each_verdict_of_a_finished_run(loop_run, tmp_path):
    from benchmarks.trial_stops import main as trial_stops

    _, run_dir, _ = loop_run
    trial_stops(["--out", str(tmp_path / "stops.json"), str(run_dir)])
    out = json.loads((tmp_path / "stops.json").read_text())
    assert (tmp_path / "stops.manifest.json").is_file()
    records = {r["trial"]: r for r in out["runs"][run_dir.name]["trials"]}
    verdicts = Ledger(run_dir / "ledger.sqlite").verdicts()
    assert set(records) == {v["trial"] for v in verdicts}
    for v in verdicts:
        r = records[v["trial"]]
        assert (r["decision"], r["reasons"], r["wins"]) == (v["decision"], v["reasons"], v["statistic"].get("wins"))
        assert bool(r["stopped"]) == ("stopped_early" in v["reasons"])
    first = [v for v in verdicts if "at the first checkpoint" in v["statistic"].get("stopped", "")]
    assert out["all"]["trials"] == len(verdicts) and out["all"]["stopped_at_first_checkpoint"] == len(first)
    level = [v for v in first if v["statistic"]["wins"] == v["statistic"]["losses"] == 0]
    assert out["all"]["level_on_every_gate_task"] == len(level)
    tested = [v["statistic"] for v in verdicts if v["statistic"].get("p") is not None]  # test_benchmarks plants some
    for v in verdicts:
        st, r = v["statistic"], records[v["trial"]]
        assert r["p"] == st.get("p") and (r["alpha"] is None) == (st.get("p") is None)
        if r["alpha"] is not None:
            assert abs(r["alpha"] - (1 - st["level"])) < 1e-9
    short = [s for s in tested if s["delta"] > 0 and s["p"] > 1 - s["level"]]
    assert out["all"]["tested_by_the_gate"] == len(tested) and out["all"]["ahead_short_of_the_level"] == len(short)


def test_the_round_spend_benchmark_accounts_for_every_charged_token_by_round(loop_run, tmp_path):
    from benchmarks.round_spend import main as round_spend
    from evotrainer.stages.spend import lineage

    _, run_dir, summary = loop_run
    round_spend(["--out", str(tmp_path / "spend.json"), str(run_dir)])
    [out] = json.loads((tmp_path / "spend.json").read_text()).values()
    ledger = Ledger(run_dir / "ledger.sqlite")
    assert out["generated_tokens"] == ledger.spent().generated_tokens == summary["spent"]["generated_tokens"]
    kept = lineage(ledger, read_stage(ledger, 0, "final").head.branch)
    charges = ledger.rows("SELECT round, item, generated_tokens AS g FROM charges")
    assert out["kept_tokens"] == sum(c["g"] for c in charges if c["item"] in kept)
    for rnd in (1, 2):
        r = out["rounds"][str(rnd)]
        seg = read_stage(ledger, rnd, "train")
        if seg.branch == branch_id(rnd, "segment"):  # a segment read again was charged in its own round
            assert r["segment"] == sum(c["g"] for c in charges if c["item"] == seg.branch)
        arms = {a.branch for a in read_stage(ledger, rnd, "trial").arms}
        assert r["trial_arms"] == sum(c["g"] for c in charges if c["item"] in arms and c["round"] == rnd)
    ledger.close()


def test_every_store_file_and_rollout_is_named_by_the_id_scheme(loop_run):
    _, run_dir, _ = loop_run
    store = RolloutStore(run_dir / "store")
    for d in (store.rollout_dir, store.metric_dir, store.finding_dir):
        for f in d.glob("*.parquet"):
            assert shard_id(*parse_shard(f.stem)) == f.stem
    for r in store.sql("SELECT id, branch, step, split FROM rollouts"):
        kind = EVAL if r["split"] == "heldout" else TRAIN
        i = int(r["id"].removeprefix(shard_id(r["branch"], r["step"], kind) + "-"))
        assert r["id"] == rollout_id(r["branch"], r["step"], i, kind)


def test_budget_is_charged_per_stage_and_the_mainline_follows_the_gate(loop_run):
    cfg, run_dir, summary = loop_run
    ledger = Ledger(run_dir / "ledger.sqlite")
    by_stage = ledger.spent_by_stage()
    assert {"start", "train", "diagnose", "trial", "gate", "final"} <= set(by_stage)
    total = ledger.spent()
    assert total.generated_tokens == sum(c.generated_tokens for c in by_stage.values())
    assert by_stage["trial"].generated_tokens > by_stage["train"].generated_tokens  # trials are charged, and cost more
    for rnd in (1, 2):
        promote, gated = read_stage(ledger, rnd, "promote"), read_stage(ledger, rnd, "gate")
        head, promoted, rejected = promote.head, promote.promoted, promote.rejected
        # A control whose own window carries a validity finding is rejected when no candidate won.
        ctl_invalid = any(f.validity for f in gated.control_findings)
        assert bool(rejected) == (ctl_invalid and not promoted)
        if rejected:  # the mainline rolled back past it, to where the round started
            assert rejected.branch == branch_id(rnd, "control")
            assert rejected.reasons == gated.control_rejected
            before = read_stage(ledger, rnd - 1, "promote" if rnd > 1 else "start").head.branch
            assert head.branch == rejected.rolled_back_to == before
        else:
            assert head.branch == (
                branch_id(rnd, "candidate", int(promoted[-1])) if promoted else branch_id(rnd, "control")
            )
    assert json.loads((run_dir / "summary.json").read_text())["final_accuracy"] == summary["final_accuracy"]


def test_report_and_status(loop_run):
    from evotrainer.cli.main import app

    cfg, run_dir, summary = loop_run
    html = (run_dir / "report.html").read_text()
    ledger = Ledger(run_dir / "ledger.sqlite")
    for v in ledger.verdicts():
        assert v["trial"] in html
    for b in ledger.branches():
        assert b["id"] in html
    # Every evidence link points at a rollout included in the file.
    import re

    links = set(re.findall(r'href="#r-([^"]+)"', html))
    anchors = set(re.findall(r'id="r-([^"]+)"', html))
    assert links and links <= anchors
    assert "<script" not in html and "http" not in html.split("<body", 1)[-1].replace("http://www.w3.org/2000/svg", "")
    res = CliRunner().invoke(app, ["status", str(run_dir)])
    # A finished run says how it ended, not "round / stage 0 / final".
    assert res.exit_code == 0 and "round / stage" not in res.output, res.output
    assert "2 round(s), stopped by loop.max_rounds=2" in res.output
    state = json.loads(CliRunner().invoke(app, ["status", str(run_dir), "--json"]).stdout)
    assert state["finished"] is True and state["state"] == "finished"
    # --watch on a finished run ends at once (it refreshed forever).
    watched = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "status", str(run_dir), "--watch"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert watched.returncode == 0 and "finished" in watched.stdout
    # The skill library the run read and wrote: the project's (run.out_dir/skills) by default, on record.
    library = str((cfg.run.out_dir / "skills").resolve())
    assert ledger.skill_libraries() == [library] and summary["skill_libraries"] == [library]
    assert library in html and library in state["skill library"]


def test_diagnose_reads_the_mainline_of_a_loop_run(loop_run, tmp_path):
    """Branch `main` does not exist in a loop run: diagnose read nothing and printed 0 findings. It reads the
    mainline, each trained branch on the path from the base to the head, as the ledger records it."""
    from evotrainer.cli.main import app
    from evotrainer.stages.spend import lineage

    cfg, src, summary = loop_run
    # A copy of what diagnose reads, without the loop's own diagnoses: this one's are written to the store.
    run_dir = tmp_path / "t"
    shutil.copytree(src / "store", run_dir / "store", ignore=shutil.ignore_patterns("findings", "diagnoses"))
    for f in [src / "config.yaml", *src.glob("ledger.sqlite*")]:
        shutil.copy(f, run_dir)
    ledger = Ledger(run_dir / "ledger.sqlite")
    head = read_stage(ledger, 0, "final").head.branch
    path = {b["id"] for b in ledger.branches() if b["id"] in lineage(ledger, head) and b["kind"] != "base"}
    ledger.close()
    res = CliRunner().invoke(app, ["diagnose", str(run_dir), "--json"])
    assert res.exit_code == 0, res.output
    findings = json.loads(res.stdout)
    assert {f["branch"] for f in findings} <= path
    diagnosed = RolloutStore(run_dir / "store").sql("SELECT DISTINCT branch FROM diagnoses")
    assert {r["branch"] for r in diagnosed} == path and "r01-seg" in path
    bad = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "diagnose", str(run_dir), "--branch", "main"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "'main'" in bad.stderr and "r01-seg" in bad.stderr


def test_config_mistakes_are_refused_before_anything_is_written(tmp_path, math_setup):
    cfg = loop_config(tmp_path, loop={"max_rounds": 0})
    with pytest.raises(ConfigError, match="budget"):
        run_loop(cfg, quiet())
    assert not (tmp_path / "runs").exists()


def test_executor_ray_without_the_ray_extra_is_refused_before_anything_is_written(tmp_path, math_setup, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an install without the extra gives: import ray fails
    monkeypatch.delitem(sys.modules, "evotrainer.backtest.ray_executor", raising=False)
    cfg = loop_config(tmp_path, loop={"executor": "ray"})
    with pytest.raises(ConfigError, match=r"loop.executor: ray needs the ray extra: pip install 'evotrainer\[ray\]'"):
        run_loop(cfg, quiet())
    assert not (tmp_path / "runs").exists()


def test_an_existing_run_is_not_overwritten(loop_run):
    cfg, run_dir, summary = loop_run
    with pytest.raises(ConfigError, match="resume"):
        run_loop(cfg, quiet())


def test_a_loop_run_is_not_written_into_a_train_runs_directory(tmp_path):
    cfg = loop_config(tmp_path, loop={"max_rounds": 0})  # no budget either: the directory is refused first
    (tmp_path / "runs" / "t").mkdir(parents=True)
    (tmp_path / "runs" / "t" / "config.yaml").write_text("{}\n")
    (tmp_path / "c.yaml").write_text(json.dumps(cfg.model_dump(mode="json")))
    out = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "run", str(tmp_path / "c.yaml")], capture_output=True, text=True
    )
    assert out.returncode == 2 and "holds an `evotrainer train` run" in out.stderr
    assert sorted(p.name for p in (tmp_path / "runs" / "t").iterdir()) == ["config.yaml"]


def test_a_trial_that_cannot_fit_is_abandoned_and_the_mainline_trains_to_the_budget(tmp_path, math_setup):
    # Enough tokens for the segment, not for five arms of trial on top of it.
    cfg = loop_config(tmp_path, loop={"max_rounds": 0}, budget={"generated_tokens": 2500})
    summary = run_loop(cfg, console := quiet())
    ledger = Ledger(tmp_path / "runs" / "t" / "ledger.sqlite")
    rounds = max(r["round"] for r in ledger.rows("SELECT round FROM stages WHERE stage = 'train'"))
    assert rounds >= 2 and ledger.verdicts() == [] and read_stage(ledger, 1, "gate") is None
    # Every round's trial was abandoned for the token budget; while tokens were left, the next round's segment
    # trained on them, continuing the last one (no segment is tainted here: nothing is thrown away).
    segs = [read_stage(ledger, r, "train") for r in range(1, rounds + 1)]
    for rnd, (a, b) in enumerate(zip(segs, segs[1:]), 1):
        trial = read_stage(ledger, rnd, "trial")
        assert trial.abandoned.startswith("budget.generated_tokens") and trial.cap == "generated_tokens"
        assert b.first_step == a.last_step + 1
    # The last segment stopped at the step that reached the budget, as a static run does: the loop spends its
    # budget and at most one step over it (a step samples at most prompts x generations x max tokens).
    h = cfg.harness.sampling
    spent = ledger.spent().generated_tokens - ledger.spent_by_stage()["final"].generated_tokens
    assert (
        cfg.budget.generated_tokens
        <= spent
        < cfg.budget.generated_tokens + (h.prompts_per_step * h.num_generations * h.max_completion_length)
    )
    assert summary["stop_reason"] == read_stage(ledger, rounds, "trial").abandoned
    assert summary["rounds"] == rounds  # the round that ended the run ran (its segment trained): it counts
    # The summary and the console say how far past the cap the run went (that step, and the final read).
    past = ledger.spent().generated_tokens - cfg.budget.generated_tokens
    assert past > 0 and summary["past_budget"] == {"generated_tokens": past}
    said = f"against budget.generated_tokens 2,500: {past:,} past it"
    assert said in console.file.getvalue() and said in (tmp_path / "runs" / "t" / "report.html").read_text()
    # The segments' training is kept: the mainline ends the last round on its last segment, and the run ends there
    # or on the mainline's best read where that segment read below it (guard.ending)
    assert _ended_on(ledger, rounds) == branch_id(rounds, "segment")


def test_process_executor_runs_arms_in_parallel_processes_with_the_same_results(tmp_path, math_setup):
    """Arms are pure functions of their spec: in worker processes they give what they give in this
    process at the same thread count (here one thread each)."""
    from evotrainer.backtest.executors import ProcessExecutor, SerialExecutor
    from evotrainer.backtest.trial import ArmSpec
    from evotrainer.training.grpo import GRPOTrainer

    cfg, domain, policy = math_setup
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"threads": 1})})
    start = tmp_path / "start"
    GRPOTrainer(policy.fork(tmp_path / "fork"), cfg.harness).save(start)
    gate_ids = tuple(sorted(t.id for t in domain.tasks("heldout"))[:20])
    hot = cfg.harness.model_copy(update={"sampling": cfg.harness.sampling.model_copy(update={"temperature": 1.3})})

    def specs(root):
        return [
            ArmSpec(
                branch=name,
                role="candidate",
                run_dir=str(root),
                config=cfg.model_dump(mode="json"),
                harness=h.model_dump(mode="json"),
                start=str(start),
                seed=0,
                first_step=1,
                steps=2,
                gate_ids=gate_ids,
            )
            for name, h in (("a", cfg.harness), ("b", hot))
        ]

    import torch

    threads = torch.get_num_threads()
    try:
        serial = SerialExecutor().run(specs(tmp_path / "serial"))
    finally:
        torch.set_num_threads(threads)
    parallel = ProcessExecutor(workers=2, threads=2).run(specs(tmp_path / "parallel"))
    assert [r.branch for r in parallel] == ["a", "b"]
    for s, p in zip(serial, parallel):
        assert (s.outcomes, s.generated_tokens, s.trained_tokens) == (p.outcomes, p.generated_tokens, p.trained_tokens)
        assert (tmp_path / "parallel" / "checkpoints" / p.branch / "arm.json").exists()


def test_a_planted_intervention_is_raced_first_under_the_same_screen_and_gate(tmp_path, math_setup):
    exploit = {
        "kind": "set_reward_weight",
        "target": "reward_weights.contains_answer",
        "value": 1.0,
        "hypothesis": {"finding": "plateau", "signal": "heldout/accuracy", "direction": "up"},
    }
    cfg = loop_config(tmp_path, loop={"max_rounds": 2, "candidates": 1, "planted": [exploit]})
    run_loop(cfg, quiet())
    ledger = Ledger(tmp_path / "runs" / "t" / "ledger.sqlite")
    first, second = (read_stage(ledger, rnd, "propose") for rnd in (1, 2))
    # Round 1: the planted one takes the only candidate slot, bound to the harness like a proposal.
    [p] = first.proposals
    assert (p.source, p.intervention.target, p.intervention.value) == ("planted", exploit["target"], 1.0)
    assert p.intervention.bound and p.intervention.before_absent
    # Round 2: the list is spent, so the proposer's own candidate is back.
    assert second.proposals and all(q.source != "planted" for q in second.proposals)
    # It went on as any proposal does: kept or dropped by the replay (then the proposer's spare replayed in its
    # place), and if raced, its trial is on record.
    replay = read_stage(ledger, 1, "replay")
    assert len(replay.kept) <= 1  # loop.candidates: a spare is replayed only in the place of one dropped
    planted_kept = [d.index for d in replay.kept] == [0]
    assert sorted(d.index for d in replay.kept + replay.dropped) == ([0] if planted_kept else [0, 1])
    raced = [t for t in ledger.trials() if t["round"] == 1]
    assert [t["source"] for t in raced] == (["planted"] if planted_kept else [first.spares[0].source])


def test_a_proposal_the_replay_drops_gives_its_slot_to_the_next_one(tmp_path, math_setup):
    """The round's only slot is taken by a change the replay shows does nothing (masking timeouts: a math rollout
    never times out); the proposer's next proposal, kept as a spare, is replayed in its place and raced, where the
    round used to race nothing (two SWE runs lost a round each so: the std filter dropped, nothing raced)."""
    no_op = {
        "kind": "add_filter",
        "target": "filters.mask_terminations",
        "value": ["timeout"],
        "hypothesis": {"finding": "plateau", "signal": "heldout/accuracy", "direction": "up"},
    }
    cfg = loop_config(tmp_path, loop={"max_rounds": 1, "candidates": 1, "planted": [no_op]})
    out = io.StringIO()
    run_loop(cfg, Console(file=out, width=400))
    ledger = Ledger(tmp_path / "runs" / "t" / "ledger.sqlite")
    proposed, replay = read_stage(ledger, 1, "propose"), read_stage(ledger, 1, "replay")
    assert [p.source for p in proposed.proposals] == ["planted"] and proposed.spares and len(proposed.spares) == 1
    [spare] = proposed.spares
    assert spare.source != "planted" and spare.key != proposed.proposals[0].key
    assert [(d.index, d.why) for d in replay.dropped] == [(0, "no effect on advantages or masks")]
    assert [d.index for d in replay.kept] == [1]
    [raced] = [t for t in ledger.trials() if t["round"] == 1]
    assert raced["source"] == spare.source
    assert intervention_key(Intervention.model_validate(raced["intervention"])) == spare.key
    assert f"in its place the spare {spare.intervention.describe()}" in " ".join(out.getvalue().split())
    html = (tmp_path / "runs" / "t" / "report.html").read_text()
    assert "in its place, the spare: " in html


@pytest.mark.parametrize("format_weight", [1.0, 0.1])
def test_a_run_that_stops_after_a_tainted_segment_ends_where_the_round_started(tmp_path, math_setup, format_weight):
    """The budget holds two segments or more but no trial arm. With `format` paid as much as a right answer, every
    well-formed wrong answer is rewarded: about half the rewarded rollouts fail the audit from the first
    step (reward_audit_gap, a validity finding; 0.49 here against its 0.1), each segment is tainted and the
    run ends on the policy it started from, not on a segment. With the usual small format weight nothing
    taints them and the run ends on the last segment."""
    cfg = loop_config(
        tmp_path,
        harness={"reward_weights": {"correct": 1.0, "format": format_weight}},
        loop={"trial_steps": 12, "max_rounds": 0},
        budget={"generated_tokens": 4000},
    )
    summary = run_loop(cfg, quiet())
    ledger = Ledger(tmp_path / "runs" / "t" / "ledger.sqlite")
    assert read_stage(ledger, 1, "trial").abandoned and "would be exceeded" in summary["stop_reason"]
    last = max(r["round"] for r in ledger.rows("SELECT round FROM stages WHERE stage = 'train'"))
    tainted = [[f.name for f in read_stage(ledger, r, "diagnose").findings if f.validity] for r in range(1, last + 1)]
    final = read_stage(ledger, 0, "final")
    if format_weight == 1.0:
        assert last >= 2 and all("reward_audit_gap" in t for t in tainted)
        assert final.head.branch == "base" and summary["final_accuracy"] == summary["baseline_accuracy"]
        # The second segment started where the first did, on other seeds (it is not the first one again).
        segs = {b["id"]: b for b in ledger.branches()}
        one, two = segs[branch_id(1, "segment")], segs[branch_id(2, "segment")]
        assert (one["parent"], one["first_step"]) == (two["parent"], two["first_step"]) and one["seed"] != two["seed"]
    elif not tainted[-1]:  # the small weight pays no wrong answer: the mainline ends on its last segment
        assert _ended_on(ledger, last) == branch_id(last, "segment")
    else:  # (not seen: a small-weight segment tainted by something else still is not ended on)
        assert read_stage(ledger, last, "guard").head.branch != branch_id(last, "segment")


def _ended_on(ledger: Ledger, last: int) -> str:
    """The branch the mainline ended the last round on, where the run ended on it or, where that head read below
    the mainline's best read on the gate tasks, on that best instead (guard.ending), saying so."""
    guarded, final = read_stage(ledger, last, "guard"), read_stage(ledger, 0, "final")
    head = guarded.head
    if final.ended_on_best is None:
        assert final.head.branch == head.branch
    else:
        assert guarded.accuracy is not None and guarded.accuracy < head.peak.accuracy
        assert (final.head.branch, final.head.step) == (head.peak.branch, head.peak.step)
    return head.branch


def exploit_everywhere(w: Window) -> list[Finding]:
    """A planted validity detector (a plugin, as a user writes one): an exploit on every window."""
    return [finding(w, "planted_exploit", "critical", 1.0, 0.0, [], ("reward_weights.format",), "planted", True)]


def exploit_in_segments(w: Window) -> list[Finding]:
    """A planted exploit on the mainline's segments only."""
    return exploit_everywhere(w) if w.branch.endswith("-seg") else []


def other_exploit_in_controls(w: Window) -> list[Finding]:
    """Another planted exploit, on the controls' windows only."""
    if not w.branch.endswith("-ctl"):
        return []
    return [finding(w, "planted_other", "critical", 1.0, 0.0, [], ("reward_weights.format",), "planted", True)]


def paid_wrong_answers(w: Window) -> list[Finding]:
    """A planted validity detector with a fixed bar (the suite's revision recalibrates its own detectors, not a
    plugin): the share of rollouts the audit fails that the reward pays as much as half a right answer."""
    paid = w.rows("SELECT id FROM rollout_stats WHERE NOT audit AND reward >= 0.5 ORDER BY id")
    share = len(paid) / max(1, w.scalar("SELECT count(*) FROM rollout_stats WHERE NOT audit"))
    if share <= 0.2:
        return []
    return [
        finding(
            w,
            "paid_wrong",
            "critical",
            share,
            0.2,
            [r["id"] for r in paid[:5]],
            ("reward_weights.format",),
            f"{share:.0%} of the rollouts the audit fails are paid 0.5 or more",
            True,
        )
    ]


@pytest.mark.parametrize("revised", [False, True])
def test_a_round_after_a_tainted_one_tries_its_remedy_on_that_segment_and_trains_none(tmp_path, math_setup, revised):
    """Round 1's segment carries an exploit (a planted detector finds one on every window), so the mainline stays
    where it started, and the planted learning rate, which carries it too, is rejected. Round 2 trains no segment
    (it would be the same exploit on other seeds, thrown away again): it reads round 1's to the same findings,
    charges nothing for it, and spends its tokens on its own remedy, forked from the same checkpoint on seeds of its
    own. `revised`: round 2's suite no longer has the detector (as a revision could drop a finding); the segment
    was thrown away all the same, and no arm forks from it."""
    from evotrainer.report import write_report
    from evotrainer.report.console import Narrator
    from evotrainer.stages import start
    from evotrainer.stages.context import run_stage
    from evotrainer.stages.results import StartResult

    moves = [
        {
            "kind": "set_knob",
            "target": "optimizer.learning_rate",
            "value": v,
            "hypothesis": {"finding": "explore", "signal": "heldout/accuracy", "direction": "up"},
        }
        for v in (1e-3, 3e-3)
    ]
    cfg = loop_config(tmp_path, loop={"max_rounds": 2, "candidates": 1, "planted": moves})
    ctx, head = started_with(cfg, {"planted_exploit": f"{__name__}:exploit_everywhere"})
    tell = Narrator(quiet())
    one, _ = run_round(ctx, tell, 1, head)
    assert one.branch == "base" and one.exploited.branch == branch_id(1, "segment")
    if revised:
        kept = {k: v for k, v in one.suite.detectors.items() if k != "planted_exploit"}
        one = one.model_copy(update={"suite": Suite(detectors=kept)})
    two, _ = run_round(ctx, tell, 2, one)
    ledger = ctx.ledger
    assert read_stage(ledger, 2, "train") == read_stage(ledger, 1, "train")
    branches = {b["id"]: b for b in ledger.branches()}
    assert branch_id(2, "segment") not in branches
    assert not ledger.rows("SELECT item FROM charges WHERE round = 2 AND stage = 'train' AND item != 'stage'")

    def found(rnd: int) -> list[str]:
        return sorted(f.name for f in read_stage(ledger, rnd, "diagnose").findings)

    assert "planted_exploit" in found(1) and ("planted_exploit" in found(2)) != revised
    raced = [[t["intervention"]["value"] for t in ledger.trials() if t["round"] == r] for r in (1, 2)]
    assert raced == [[1e-3], [3e-3]]
    arms = [[b for b in branches.values() if b["round"] == r and b["kind"] != "segment"] for r in (1, 2)]
    assert {(b["parent"], b["first_step"]) for b in arms[0] + arms[1]} == {("base", 1)}
    assert not {b["seed"] for b in arms[0]} & {b["seed"] for b in arms[1]}
    if revised:  # round 2's control, read by a suite without the detector, carried no exploit: nothing to read again
        assert two.exploited is None
        ledger.close()
        return
    # Beside the segment read again, round 2's control trained no step (a third sample of the exploit): it read the
    # policy the arms fork from, and the gate weighed the remedy against that read and the segment's window.
    ctl = read_stage(ledger, 2, "trial").arm(branch_id(2, "control"))
    assert ctl.steps_trained == 0 and ctl.generated_tokens == 0 and ctl.outcomes == ctl.checkpoint_outcomes["0"]
    assert read_stage(ledger, 2, "trial").arm(branch_id(2, "control_replicate")) is None
    assert not ctx.store.sql(f"SELECT id FROM rollouts WHERE branch = '{ctl.branch}' AND split = 'train'")
    assert read_stage(ledger, 2, "gate").control_rejected == ["validity:planted_exploit"]
    assert ctl.branch in write_report(ctx.run_dir).read_text()  # the report shows an arm that trained no step
    # Round 2's control carried the exploit again. Where no remedy is left to race next, the trial trains nothing (a
    # control would be a third sample of the exploit) and says why; the loop then ends the run where the round
    # started (its cap is no budget's).
    spent = ledger.spent().generated_tokens
    seg, taint = read_stage(ledger, 2, "train"), ["planted_exploit"]
    tried, records = race.trial(ctx, 3, two, seg, [], taint, two.suite)
    assert two.exploited == seg and not tried.arms and not records.branches and not tried.cap
    assert (
        tried.abandoned
        == "no remedy is left to try, and the harness carries planted_exploit in its segment and its control"
    )
    assert ledger.spent().generated_tokens == spent
    ledger.close()
    # Resumed, the run reads both rounds back from the ledger and reaches the same mainline, the segment to read
    # again included, without training anything.
    again = start.open_run(cfg, resume=True)
    back = run_stage(again, 0, "start", StartResult, lambda: start.start(again, lambda *_: None)).head
    back = back.model_copy(update={"suite": head.suite})
    for rnd in (1, 2):
        back, _ = run_round(again, tell, rnd, back)
    assert back == two and again.ledger.spent().generated_tokens == spent
    again.ledger.close()


def test_a_control_with_another_exploit_is_no_second_sample_of_the_segment_s(tmp_path, math_setup):
    """The segment carries one exploit, its control (on seeds of its own) another: the control is rejected and the
    mainline stays where it started, but nothing says the segment's exploit recurs, so round 2 trains a segment of
    its own rather than read round 1's again. The control trains here because no remedy races (the trial share holds
    none: race.trial); it forks from where the round started, not from the segment, on seeds of its own (on the
    segment's it would replay the segment step for step)."""
    from evotrainer.report.console import Narrator

    cfg = loop_config(
        tmp_path, loop={"max_rounds": 2, "candidates": 1, "max_trial_share": 1e-6}, budget={"generated_tokens": 10**7}
    )
    ctx, head = started_with(
        cfg,
        {
            "planted_exploit": f"{__name__}:exploit_in_segments",
            "planted_other": f"{__name__}:other_exploit_in_controls",
        },
    )
    tell = Narrator(quiet())
    one, _ = run_round(ctx, tell, 1, head)
    ledger = ctx.ledger
    assert read_stage(ledger, 1, "gate").control_rejected == ["validity:planted_other"]
    assert one.branch == "base" and one.exploited is None
    tried = read_stage(ledger, 1, "trial")
    assert [a.role for a in tried.arms] == ["control"]
    control = tried.arm(branch_id(1, "control"))
    assert control.first_step == 1 and control.steps_trained > 0  # forked from the base, not from the segment
    seeds = {b["id"]: b["seed"] for b in ledger.branches()}
    assert seeds[control.branch] != seeds[branch_id(1, "segment")]
    drawn = {
        arm: [
            r["task_id"]
            for r in ctx.store.sql(f"SELECT task_id FROM rollouts WHERE branch = '{arm}' AND step = 1 ORDER BY id")
        ]
        for arm in (control.branch, branch_id(1, "segment"))
    }
    assert drawn[control.branch] and drawn[control.branch] != drawn[branch_id(1, "segment")]
    run_round(ctx, tell, 2, one)
    assert read_stage(ledger, 2, "train").branch == branch_id(2, "segment")
    ledger.close()


def test_a_valid_remedy_for_the_controls_exploit_repairs_the_mainline_harness(tmp_path, math_setup):
    """`format` paid as much as a right answer taints every segment and control (paid wrong answers from the first
    step; a planted detector with a fixed bar says so, as the suite's revision would recalibrate its own detector's
    bar between a right answer's 2.0 and a wrong one's 1.0). The planted remedy, `format` back to 0.1 with that
    finding as its hypothesis, trains too little to win or to fall (the learning rate is tiny), so nothing is
    promoted; but rather than go back to the harness that pays the exploit, the mainline takes the remedy's
    (gate.repair): round 2 trains under it on a window the suite finds clean. (An unrelated move leaves the
    rollback as it was: the rules' test.) The temperature is high so that some completions miss the format on
    every machine: where a base formatted every rollout (an AMX Xeon's kernels), `format` was constant within each
    group, the replay found the remedy moved no advantage and dropped it, and nothing was left to repair with.
    128 prompts a step: the candidate's reward rise is held against the 3-step segment's (the control only reads),
    and at 32 their difference, sampling noise alone, crossed gate.REWARD_RISE under AVX2 kernels (0.108)."""
    fix = {
        "kind": "set_reward_weight",
        "target": "reward_weights.format",
        "value": 0.1,
        "hypothesis": {"finding": "paid_wrong", "signal": "heldout/accuracy", "direction": "up"},
    }
    cfg = loop_config(
        tmp_path,
        harness={
            "reward_weights": {"correct": 1.0, "format": 1.0},
            "optimizer": {"learning_rate": 1e-7},
            "sampling": {"temperature": 1.5, "prompts_per_step": 128},
        },
        loop={"max_rounds": 2, "candidates": 1, "planted": [fix]},
    )
    from evotrainer.report.console import Narrator

    ctx, head = started_with(cfg, {"paid_wrong": f"{__name__}:paid_wrong_answers"})
    console = quiet()
    tell = Narrator(console)
    one, stop = run_round(ctx, tell, 1, head)
    assert not stop.reason
    run_round(ctx, tell, 2, one)
    ledger = ctx.ledger
    assert "validity:paid_wrong" in read_stage(ledger, 1, "gate").control_rejected
    assert [v["decision"] for v in ledger.verdicts() if v["round"] == 1] == ["reject"]
    promoted = read_stage(ledger, 1, "promote")
    fixed = promoted.repaired
    assert promoted.rejected is None and fixed is not None and fixed.trial == trial_id(1, 1)
    assert promoted.head.harness.version == fixed.harness and promoted.head.harness.reward_weights["format"] == 0.1
    cand = read_stage(ledger, 1, "trial").arm(branch_id(1, "candidate", 1))
    assert fixed.continues_from == promoted.head.branch == ("base" if cand.stopped else cand.branch)
    seg = read_stage(ledger, 2, "train")
    assert seg.harness_version == fixed.harness and seg.first_step == promoted.head.step + 1
    assert not [f.name for f in read_stage(ledger, 2, "diagnose").findings if f.validity]
    assert "repaired: the control pays validity:paid_wrong, so the mainline takes r01-t1's" in console.file.getvalue()
    # The repair is remembered: a skill (no win) that a later run starting under this harness adopts.
    remembered = read_stage(ledger, 1, "remember").skills
    assert [(s["trial"], s["wins"], s["losses"]) for s in remembered] == [(trial_id(1, 1), 0, 0)]
    skill = ctx.skills.adoptable(cfg.env.domain, model_name(cfg.policy), head.harness)
    assert skill is not None and skill.id == remembered[0]["skill"]
    assert [e.decision for e in skill.evidence] == ["repair"]
    assert skill.instantiate(head.harness).apply(head.harness).reward_weights["format"] == 0.1
    ledger.close()
    from evotrainer.cli.main import app
    from evotrainer.report import write_report

    state = json.loads(CliRunner().invoke(app, ["status", str(tmp_path / "runs" / "t"), "--json"]).stdout)
    assert state["repairs"] == f"r01-t1: harness {fixed.harness}"
    assert f"the mainline takes r01-t1's harness {fixed.harness}" in write_report(tmp_path / "runs" / "t").read_text()


def test_beside_a_tainted_segment_a_raced_remedy_s_control_only_reads_the_policy_the_round_started_from(
    tmp_path, math_setup
):
    """The segment is tainted (a planted detector finds an exploit on segments' windows only), so the arms fork
    from where the round started, and the control reads that policy on the gate tasks: the alternative a remedy
    must beat where the harness pays the exploit (gate.confirmed). With a remedy to race, the
    control trains no step (a second sample of the exploit changes no decision the gate reads): the segment stands
    as the harness's run, whose findings reject the control, and nothing of the control's is trained or stored but
    its read."""
    from evotrainer.report.console import Narrator

    move = {
        "kind": "set_knob",
        "target": "optimizer.learning_rate",
        "value": 1e-3,
        "hypothesis": {"finding": "plateau", "signal": "heldout/accuracy", "direction": "up"},
    }
    cfg = loop_config(tmp_path, loop={"max_rounds": 1, "candidates": 1, "planted": [move]})
    ctx, head = started_with(cfg, {"planted_exploit": f"{__name__}:exploit_in_segments"})
    console = quiet()
    run_round(ctx, Narrator(console), 1, head)
    ledger = ctx.ledger
    assert f"{branch_id(1, 'control')} " in console.file.getvalue()
    assert "(read only: the segment stands as its run)" in console.file.getvalue()
    taint = sorted({f"validity:{f.name}" for f in read_stage(ledger, 1, "diagnose").findings if f.validity})
    assert "validity:planted_exploit" in taint
    tried = read_stage(ledger, 1, "trial")
    assert tried.raced == "start" and tried.arm(branch_id(1, "candidate", 1)) is not None
    control = tried.arm(branch_id(1, "control"))
    assert control.steps_trained == 0 and control.generated_tokens == 0
    store = ctx.store
    assert not store.sql(f"SELECT id FROM rollouts WHERE branch = '{control.branch}' AND split = 'train'")
    domain = make_domain(cfg)
    gate_ids = split_heldout([t.id for t in domain.tasks("heldout")], cfg.gate.final_fraction, cfg.run.seed)[0]
    by_id = {t.id: t for t in domain.tasks("heldout")}
    base = HFPolicy.load(str(tmp_path / "runs" / "t" / "checkpoints" / "base"))
    start = evaluate(base, domain, [by_id[i] for i in gate_ids], cfg.eval).outcomes
    assert control.checkpoint_outcomes["0"] == control.outcomes == start
    read = store.sql(
        "SELECT count(*) AS n FROM rollouts WHERE branch = ? AND step = 0 AND split = 'heldout'", [control.branch]
    )
    assert read[0]["n"] == len(gate_ids)  # the read is evidence like any other
    # The segment's window is the harness's run: the gate rejects the control for the segment's exploit.
    assert read_stage(ledger, 1, "gate").control_rejected == ["validity:planted_exploit"]
    assert not [a for a in tried.arms if a.role in ("control_replicate", "aa")]
    [verdict] = ledger.verdicts()
    if verdict["statistic"]["test"] == "two_stage" and "not_confirmed" not in verdict["reasons"]:
        assert verdict["statistic"]["against"].startswith("the round's starting policy")
    ledger.close()


def test_with_checkpoint_tasks_a_loop_reads_a_prefix_at_checkpoints_and_all_gate_tasks_to_decide(tmp_path, math_setup):
    """gate.checkpoint_tasks through whole rounds: every read at a race's checkpoint or an arm's fork point, every
    read that stopped an arm, the guard's own reads and the base's first read are of the first 10 gate tasks; an arm
    that ran its length was read on all 30, and the verdicts' tests pair those."""
    cfg = loop_config(tmp_path, gate={"checkpoint_tasks": 10}, loop={"race_checkpoints": 3})
    run_loop(cfg, quiet())
    ledger = Ledger(tmp_path / "runs" / "t" / "ledger.sqlite")
    gate_ids, _ = split_heldout([t.id for t in make_domain(cfg).tasks("heldout")], cfg.gate.final_fraction, 0)
    prefix, every = sorted(gate_ids[:10]), sorted(gate_ids)
    arms = [a for r in (1, 2) if (t := read_stage(ledger, r, "trial")) is not None for a in t.arms]
    assert arms and any(a.checkpoint_outcomes for a in arms)
    for a in arms:
        assert all(sorted(o) == prefix for o in a.checkpoint_outcomes.values()), a.branch
        assert sorted(a.outcomes) == (prefix if a.stopped else every), a.branch
    reads = [g.outcomes for r in (1, 2) if (g := read_stage(ledger, r, "guard")) is not None and g.outcomes]
    assert all(sorted(o) in (prefix, every) for o in reads)
    assert sorted(read_stage(ledger, 0, "start").head.peak.outcomes) == prefix
    # Where no arm read the head (every trial abandoned for the budget), the guard reads it itself: the prefix.
    cfg = loop_config(
        tmp_path / "b", gate={"checkpoint_tasks": 10}, loop={"max_rounds": 0}, budget={"generated_tokens": 2500}
    )
    run_loop(cfg, quiet())
    ledger = Ledger(tmp_path / "b" / "runs" / "t" / "ledger.sqlite")
    own = [g.outcomes for r in range(1, 9) if (g := read_stage(ledger, r, "guard")) is not None and g.outcomes]
    assert own and all(sorted(o) == prefix for o in own)
