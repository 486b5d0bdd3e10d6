"""The skill library's losses: a trial one run rejected is not paid for again by a later run in the same context (the
domain, the model, the harness version it was tried on) near the step it was found at."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace

import pytest
from rich.console import Console

from conftest import small_config
from evotrainer.config import dump_config
from evotrainer.errors import UserError
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Hypothesis, Intervention
from evotrainer.loop import run_loop
from evotrainer.proposers.llm_prompt import render
from evotrainer.proposers.proposer import Brief, PastTrial, Proposal, intervention_key, screen
from evotrainer.skills.library import Evidence, SkillLibrary, model_name, run_name
from evotrainer.stages.results import read_stage
from evotrainer.stages.spend import library_share
from evotrainer.store.ledger import Ledger

# A learning rate 2,000 times the test model's: the candidate's policy collapses and the gate rejects it.
WRECK = {
    "kind": "set_knob",
    "target": "optimizer.learning_rate",
    "value": 0.1,
    "hypothesis": {"finding": "plateau", "signal": "heldout/accuracy", "direction": "up"},
}


def test_a_second_run_does_not_race_what_the_first_rejected_on_the_same_harness(tmp_path, math_setup):
    """Two real loop runs sharing a library, the same seed and harness. Run 1 races the planted wreck and rejects
    it; the remember stage keeps the loss with its context and the step it forked from. Run 2 proposes the same
    change in round 1; the screen refuses it, naming run 1, and races something else."""

    def cfg(name: str, project: str = "runs"):
        loop = {"segment_steps": 3, "trial_steps": 3, "candidates": 1, "max_rounds": 1, "max_trial_share": 1.0}
        loop |= {"skills_dir": str(tmp_path / "skills"), "planted": [WRECK]}
        return small_config(tmp_path, run={"name": name, "out_dir": str(tmp_path / project), "seed": 0}, loop=loop)

    run_loop(cfg("first"), Console(file=io.StringIO()))
    first = Ledger(tmp_path / "runs" / "first" / "ledger.sqlite")
    [trial] = first.trials()
    assert trial["source"] == "planted"
    assert next(v for v in first.verdicts() if v["trial"] == trial["id"])["decision"] == "reject"
    branches = {b["id"]: b for b in first.branches()}
    harness = branches[trial["control"]]["harness_version"]
    lib = SkillLibrary(tmp_path / "skills")
    [(iv, ev)] = lib.losses_in("math", model_name(cfg("first").policy), harness)
    assert intervention_key(iv) == intervention_key(Intervention.model_validate(WRECK))
    assert (ev.run, ev.trial, ev.step) == ("first", trial["id"], branches[trial["candidate"]]["first_step"])
    assert not lib.losses_in("math", model_name(cfg("first").policy), harness, besides="first")
    assert not lib.losses_in("math", "another-model", harness)

    run_loop(cfg("second"), Console(file=io.StringIO()))
    second = Ledger(tmp_path / "runs" / "second" / "ledger.sqlite")
    proposed = read_stage(second, 1, "propose")
    refused = [r for r in proposed.refused if r["proposal"]["source"] == "planted"]
    assert len(refused) == 1 and "already rejected in run first" in refused[0]["reason"]
    assert all(t["source"] != "planted" for t in second.trials())
    assert all(intervention_key(Intervention.model_validate(t["intervention"])) != intervention_key(iv)
               for t in second.trials())  # fmt: skip

    # Another project's run of the same name, sharing the library (a global one): its evidence is told apart, so
    # run 1's loss is another run's to it (refused, not read as its own) and its own trials add to the library.
    before = set(lib.evidence_keys())
    run_loop(cfg("first", "elsewhere"), Console(file=io.StringIO()))
    again = Ledger(tmp_path / "elsewhere" / "first" / "ledger.sqlite")
    refused = [r for r in read_stage(again, 1, "propose").refused if r["proposal"]["source"] == "planted"]
    assert len(refused) == 1 and "already rejected in run first" in refused[0]["reason"]
    assert set(lib.evidence_keys()) - before == {f"first~2/{t['id']}" for t in again.trials()}
    path = str((tmp_path / "skills").resolve())
    assert json.loads(again.get_meta("skill_library_runs")) == {path: "first~2"}
    assert json.loads(first.get_meta("skill_library_runs")) == {path: "first"}


def test_a_run_is_named_per_library_so_a_resume_under_another_library_is_named_against_it(tmp_path):
    """The name is fixed per library at the run's first open of it. Resumed under another library that holds
    another run's evidence under the same name, the run takes the next free name there, and keeps its own name
    in the first library on a later resume there. A ledger from before names were kept per library had one name,
    for its first library; that is read back for it."""
    assert run_name("x", ["y/r01-t1", "a/x/r01-t1"]) == "x" and run_name("a/x", ["a/x/r01-t1"]) == "a/x~2"
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.record_skill_library("/a")
    assert ledger.library_run("/a", lambda: run_name("x", ["y/r01-t1"])) == "x"
    ledger.record_skill_library("/b")
    assert ledger.library_run("/b", lambda: run_name("x", ["x/r01-t1", "x~2/r02-t1"])) == "x~3"
    assert ledger.library_run("/a", lambda: run_name("x", ["x/r01-t1"])) == "x"  # a resume: fixed
    assert ledger.library_run("/b", lambda: "chosen again") == "x~3"
    old = Ledger(tmp_path / "old.sqlite")
    old.record_skill_library("/a")
    old.set_meta("skill_library_run", "x~2")
    assert old.library_run("/a", lambda: "x") == "x~2"
    old.record_skill_library("/b")
    assert old.library_run("/b", lambda: "x") == "x"


def _loss(step: int, harness: Harness, run: str = "other") -> PastTrial:
    iv = Intervention(kind="set_knob", target="sampling.temperature", value=1.3,
                      hypothesis=Hypothesis(finding="explore", signal="heldout/accuracy", direction="up"))  # fmt: skip
    return PastTrial(0, iv, ("plateau",), "reject", (), -0.05, harness.version, step, run=run)


def test_another_runs_loss_blocks_only_on_its_harness_and_within_the_expiry_either_side():
    h = Harness()
    moved = Harness(sampling={**h.sampling.model_dump(), "temperature": 0.9})
    proposal = Proposal(_loss(0, h).intervention, "explore")

    def refused(step: int, loss: PastTrial, harness: Harness = h) -> list[str]:
        brief = Brief(run="r", round=1, domain="math", harness=harness, findings=[], signature=("plateau",),
                      step=step, expiry=60, losses=[loss])  # fmt: skip
        return [r.reason for r in screen([proposal], brief)[1]]

    assert refused(30, _loss(80, h)) and "in run other" in refused(30, _loss(80, h))[0]  # found later: near enough
    assert refused(130, _loss(80, h))
    assert not refused(141, _loss(80, h)) and not refused(19, _loss(80, h))  # 61 steps away either side
    assert not refused(80, _loss(80, moved), h)  # tried on another harness version: says nothing of this one


def test_a_change_whose_skill_won_here_as_often_as_it_lost_is_offered_not_blocked(tmp_path):
    lib = SkillLibrary(tmp_path)
    iv = _loss(0, Harness()).intervention
    ctx = {"domain": "math", "model": "tiny", "harness": "h-1", "signature": ["plateau"], "step": 5}
    lib.record_loss(iv, Evidence(run="a", round=1, trial="r01-t1", decision="reject", **ctx))
    lib.record_loss(iv, Evidence(run="a", round=1, trial="r01-t1", decision="reject", **ctx))  # a resumed run
    assert len(lib.losses_in("math", "tiny", "h-1")) == 1
    lib.record(
        iv, Evidence(run="b", round=1, trial="r01-t1", decision="promote", **ctx), source="explore", create=True
    )
    assert lib.losses_in("math", "tiny", "h-1") == []
    lib.record_loss(iv, Evidence(run="c", round=2, trial="r02-t1", decision="reject", **ctx))
    assert [e.run for _, e in lib.losses_in("math", "tiny", "h-1")] == ["a", "c"]
    assert lib.all()[0].id.removeprefix("k-") == next(tmp_path.glob("r-*.json")).stem.removeprefix("r-")


def test_an_llm_proposer_is_told_what_earlier_runs_lost_here():
    h = Harness()
    brief = Brief(run="r", round=1, domain="math", harness=h, findings=[], signature=("plateau",), step=30,
                  expiry=60, losses=[_loss(80, h)])  # fmt: skip
    text = " ".join(render(brief, 20_000).text.split())
    assert "sampling.temperature" in text and "in run other at step 80, effect -0.050" in text
    assert "in run other" not in " ".join(render(replace(brief, losses=[]), 20_000).text.split())


def test_a_projects_libraries_merge_into_one_skills_and_losses_and_merging_twice_changes_nothing(tmp_path):
    iv = _loss(0, Harness()).intervention
    win = iv.model_copy(update={"value": 0.7})
    ctx = {"domain": "math", "model": "tiny", "harness": "h-1", "signature": ["plateau"], "step": 5}
    a, b, into = SkillLibrary(tmp_path / "a"), SkillLibrary(tmp_path / "b"), SkillLibrary(tmp_path / "into")
    for run, lib in (("a", a), ("b", b)):
        lib.record(
            win, Evidence(run=run, round=1, trial="r01-t1", decision="promote", **ctx), source="explore", create=True
        )
        lib.record_loss(iv, Evidence(run=run, round=2, trial="r02-t1", decision="reject", **ctx))
    for _ in range(2):
        assert into.merge(a) == 2 and into.merge(b) == 2
    [skill] = into.all()
    assert sorted(e.run for e in skill.evidence) == ["a", "b"] and skill.wins == 2 and not skill.quarantined
    assert sorted(e.run for _, e in into.losses_in("math", "tiny", "h-1")) == ["a", "b"]
    assert into.merge(SkillLibrary(tmp_path / "none")) == 0


def test_the_claims_project_arm_refuses_a_seed_whose_run_makes_its_library(capsys):
    from benchmarks.claims.__main__ import parse

    with pytest.raises(SystemExit) as done:
        parse(["cell", "swe_short_300k", "loop_default_project", "2"])
    assert (
        done.value.code == 2 and "the cold runs of seeds [1, 2, 3]: run it at another seed" in capsys.readouterr().err
    )
    assert parse(["cell", "swe_short_300k", "loop_default_project", "4"])[0].args[2] == "4"


def test_the_cli_lists_a_librarys_losses_and_imports_another_librarys_directory(tmp_path):
    from typer.testing import CliRunner

    from evotrainer.cli.main import app

    iv = _loss(0, Harness()).intervention
    ctx = {"domain": "swe", "model": "tiny", "harness": "h-1", "signature": ["plateau"], "step": 21}
    SkillLibrary(tmp_path / "a").record_loss(iv, Evidence(run="a", round=2, trial="r02-t1", decision="reject", **ctx))
    runner = CliRunner()
    [listed] = json.loads(runner.invoke(app, ["skills", "losses", "--dir", str(tmp_path / "a"), "--json"]).stdout)
    assert listed["intervention"]["target"] == "sampling.temperature" and listed["evidence"][0]["step"] == 21
    table = " ".join(
        runner.invoke(app, ["skills", "losses", "--dir", str(tmp_path / "a")], terminal_width=300).stdout.split()
    )
    assert "a / r02-t1" in table and "h-1" in table and "21" in table
    done = runner.invoke(app, ["skills", "import", str(tmp_path / "a"), "--dir", str(tmp_path / "b")])
    assert done.exit_code == 0 and "merged 1 skill and loss record(s)" in done.stdout
    assert [e.run for _, e in SkillLibrary(tmp_path / "b").losses_in("swe", "tiny", "h-1")] == ["a"]
    # One file carries the losses too: a library shared that way blocks what it lost, as the directory does.
    out = runner.invoke(app, ["skills", "export", str(tmp_path / "a.json"), "--dir", str(tmp_path / "a")])
    assert out.exit_code == 0 and "exported 0 skill(s) and 1 loss record(s)" in out.stdout
    done = runner.invoke(app, ["skills", "import", str(tmp_path / "a.json"), "--dir", str(tmp_path / "c")])
    assert done.exit_code == 0 and "imported 1 skill and loss record(s)" in done.stdout
    assert [e.run for _, e in SkillLibrary(tmp_path / "c").losses_in("swe", "tiny", "h-1")] == ["a"]
    (tmp_path / "empty").mkdir()
    wrong = runner.invoke(app, ["skills", "import", str(tmp_path / "empty"), "--dir", str(tmp_path / "b")])
    # A UserError: the console script (cli.main.main) prints it without a traceback and exits 2.
    assert isinstance(wrong.exception, UserError)
    assert "holds no skills (k-*.json) or losses (r-*.json)" in str(wrong.exception)


def test_the_share_scales_by_the_chance_a_trial_wins_here_and_never_rises_past_the_users():
    assert library_share(0.6, 0, 0) == pytest.approx(0.6)  # a fresh library: the share as set
    assert library_share(0.6, 0, 4) == pytest.approx(0.6 * 2 / 6)  # posterior 1/6 against the prior's 1/2
    assert library_share(0.6, 1, 12) == pytest.approx(0.6 * 2 * 2 / 15)
    assert library_share(0.6, 3, 1) == pytest.approx(0.6)  # wins do not raise it
    assert library_share(0.6, 0, 4) > library_share(0.6, 0, 5)


def test_a_librarys_record_of_losing_trials_on_the_harness_lowers_a_later_runs_trial_share(tmp_path, math_setup):
    """Three real runs sharing a library under a token budget. Run 1 races the planted wreck in round 1 and rejects
    it. With eight more losses of other runs on that harness, run 2's share falls to 2 / 11 of what was set: its round
    1 races nothing and says why. Run 3, the same but with loop.trial_share_by_library off, races in round 1."""

    def cfg(name: str, by_library: bool = True):
        loop = {"segment_steps": 3, "trial_steps": 3, "candidates": 1, "max_rounds": 1, "max_trial_share": 0.5}
        loop |= {"skills_dir": str(tmp_path / "skills"), "planted": [WRECK], "trial_share_by_library": by_library}
        run = {"name": name, "out_dir": str(tmp_path / "runs"), "seed": 0}
        return small_config(tmp_path, run=run, loop=loop, budget={"generated_tokens": 12_000})

    def ledger(name: str) -> Ledger:
        run_loop(cfg(name, name != "third"), Console(file=io.StringIO()))
        return Ledger(tmp_path / "runs" / name / "ledger.sqlite")

    first = ledger("first")
    [trial] = first.trials()
    harness = {b["id"]: b for b in first.branches()}[trial["control"]]["harness_version"]
    lib = SkillLibrary(tmp_path / "skills")
    assert lib.record_in("math", model_name(cfg("first").policy), harness) == (0, 1)
    assert lib.record_in("math", model_name(cfg("first").policy), harness, besides="first") == (0, 0)
    iv, model = _loss(0, Harness()).intervention, model_name(cfg("first").policy)
    for i in range(8):
        ev = Evidence(run=f"earlier-{i}", round=1, trial="r01-t1", decision="reject", domain="math", model=model,
                      harness=harness, signature=["plateau"], step=3)  # fmt: skip
        lib.record_loss(iv.model_copy(update={"value": 1.0 + i / 10}), ev)
    second = ledger("second")
    assert second.trials() == []
    note = read_stage(second, 1, "trial").note
    assert "loop.max_trial_share 0.5 lowered to 0.0909 by the skill library" in note and "0 won, 9 lost" in note
    third = ledger("third")
    assert [t["round"] for t in third.trials()] == [1]


def test_a_run_reads_the_library_as_it_found_it_and_its_own_trials(tmp_path):
    lib, iv = SkillLibrary(tmp_path), _loss(0, Harness()).intervention
    ctx = {"domain": "math", "model": "tiny", "harness": "h-1", "signature": ["plateau"], "step": 3}

    def ev(run: str, decision: str = "reject") -> Evidence:
        return Evidence(run=run, round=1, trial="r01-t1", decision=decision, **ctx)

    lib.record_loss(iv, ev("a"))
    view = lib.as_found(lib.evidence_keys(), "me")
    lib.record_loss(iv, ev("b"))  # another run's loss of the same change, after the view's run started
    lib.record(iv.model_copy(update={"value": 0.5}), ev("b", "promote"), source="catalog", create=True)
    view.record_loss(iv, ev("me"))  # its own: written through the view, and read by it
    assert view.record_in("math", "tiny", "h-1") == (0, 2) and lib.record_in("math", "tiny", "h-1") == (1, 3)
    assert [e.run for _, e in view.losses_in("math", "tiny", "h-1")] == ["a", "me"]
    assert view.all() == [] and len(lib.all()) == 1
    assert len(SkillLibrary(tmp_path).all_losses()[0].evidence) == 3  # nothing the view hides is lost


def test_a_run_killed_before_its_trial_resumes_reading_the_library_as_it_found_it(tmp_path, math_setup):
    """A real run killed in round 1, before its trial, while nine losses of other runs on its harness are written to
    its library. Resumed, it reads the library as it found it at its start: it races the planted change in round 1 at
    the share it set, as the run would have uninterrupted (test above: read, the nine would cut its share to 1/11 of
    0.5 and it would race nothing). A run started after them reads them."""
    loop = {"segment_steps": 3, "trial_steps": 3, "candidates": 1, "max_rounds": 1, "max_trial_share": 0.5}
    loop |= {"skills_dir": str(tmp_path / "skills"), "planted": [WRECK]}
    run = {"name": "killed", "out_dir": str(tmp_path / "runs"), "seed": 0}
    cfg = small_config(tmp_path, run=run, loop=loop, budget={"generated_tokens": 12_000})
    (cfg_file := tmp_path / "killed.yaml").write_text(dump_config(cfg))
    env = {**os.environ, "EVOTRAINER_KILL_AT": "1:train"}
    cli = [sys.executable, "-m", "evotrainer.cli"]
    killed = subprocess.run([*cli, "run", str(cfg_file)], env=env, timeout=600, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    run_dir = tmp_path / "runs" / "killed"
    harness = {b["id"]: b for b in Ledger(run_dir / "ledger.sqlite").branches()}["base"]["harness_version"]
    lib, model = SkillLibrary(tmp_path / "skills"), model_name(cfg.policy)
    for i in range(9):
        ev = Evidence(run=f"earlier-{i}", round=1, trial="r01-t1", decision="reject", domain="math", model=model,
                      harness=harness, signature=["plateau"], step=3)  # fmt: skip
        lib.record_loss(_loss(0, Harness()).intervention.model_copy(update={"value": 1.0 + i / 10}), ev)
    resumed = subprocess.run([*cli, "resume", str(run_dir)], timeout=600, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ledger = Ledger(run_dir / "ledger.sqlite")
    assert [t["round"] for t in ledger.trials()] == [1] and "lowered" not in read_stage(ledger, 1, "trial").note
    assert lib.record_in("math", model, harness, besides="killed") == (0, 9)
