"""Checkpoint retention (run.keep_checkpoints): once a round is decided, the weights and optimizer state of
the arms that ended discarded are deleted and their results kept; the mainline's lineage (or, under `heads`,
the base and the head) stays; a prune killed half way is finished on resume without counting twice; `all`
deletes nothing; status, the report and summary.json give the run's disk use."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from conftest import small_config
from evotrainer.backtest.trial import RESULT, ArmSpec, run_arm
from evotrainer.loop import run_loop
from evotrainer.stages import retention
from evotrainer.stages.results import read_stage
from evotrainer.stages.spend import lineage
from evotrainer.store.checkpoints import has_weights, tree_bytes, weight_files
from evotrainer.store.ledger import Ledger
from evotrainer.training.grpo import GRPOTrainer


def _cfg(tmp: Path, keep: str):
    return small_config(
        tmp,
        run={"name": "t", "out_dir": str(tmp / "runs"), "keep_checkpoints": keep},
        loop={
            "segment_steps": 2,
            "trial_steps": 2,
            "candidates": 2,
            "max_rounds": 2,
            "skills_dir": str(tmp / "skills"),
            "max_trial_share": 1.0,
        },
    )


def _quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def _mainline(ledger: Ledger):
    """Where the mainline was when the last round (2) was decided, which is what retention keeps: the run may then
    end on an earlier best read (guard.ending), which retention does not act on."""
    return read_stage(ledger, 2, "guard").head


def _arms(run_dir: Path) -> dict[str, dict]:
    """Each branch's saved arm result (the base has none), by branch."""
    return {
        p.parent.name: json.loads(p.read_text()) for p in (run_dir / "checkpoints").glob(f"*/{RESULT}") if p.is_file()
    }


@pytest.fixture(scope="module")
def lineage_run(tmp_path_factory, math_setup):
    """A lineage run killed half way through its first prune (one file deleted, then the process dies), then
    resumed: the resume finishes that prune, trains round 2 from the kept head and ends."""
    tmp = tmp_path_factory.mktemp("retention")
    cfg = _cfg(tmp, "lineage")
    real = retention.prune
    seen: dict = {}

    def dies_mid_prune(ledger, run_dir, mode, rnd, head, peak=None):
        ckpts, keep = Path(run_dir) / "checkpoints", retention.retained(ledger, mode, head, peak)
        doomed = {b["id"]: weight_files(ckpts / b["id"]) for b in ledger.branches() if b["id"] not in keep}
        seen["recorded"] = {b: sum(f.stat().st_size for f in fs) for b, fs in doomed.items() if fs}
        # As prune does: record first; then delete one file and die.
        ledger.set_meta(retention.PRUNED, json.dumps(seen["recorded"]))
        for f in [f for fs in doomed.values() for f in fs][:1]:
            f.unlink()
        seen["doomed"] = list(doomed)
        raise KeyboardInterrupt("killed mid-prune")

    retention.prune = dies_mid_prune
    try:
        with pytest.raises(KeyboardInterrupt):
            run_loop(cfg, _quiet())
    finally:
        retention.prune = real
    run_dir = tmp / "runs" / "t"
    assert read_stage(Ledger(run_dir / "ledger.sqlite"), 2, "train") is None, "killed before round 2"
    summary = run_loop(cfg, _quiet(), resume=True)
    return cfg, run_dir, summary, seen


def test_lineage_keeps_the_mainline_and_prunes_the_weights_of_discarded_arms(lineage_run):
    _, run_dir, summary, _ = lineage_run
    ledger = Ledger(run_dir / "ledger.sqlite")
    main = _mainline(ledger)
    head, peak = main.branch, main.peak.branch
    kept = lineage(ledger, head)
    arms = _arms(run_dir)
    assert {"base", head} <= kept
    discarded = {b["id"] for b in ledger.branches()} - kept
    assert discarded, "a two-candidate round discards arms"
    for b in kept:
        assert has_weights(run_dir / "checkpoints" / b), f"lineage checkpoint {b} lost its weights"
        # Only the head is forked from again, or the mainline's best read (the guard stage may go back to it): the
        # lineage behind them keeps its weights, not its optimizer state.
        assert (run_dir / "checkpoints" / b / "optimizer.pt").is_file() == (b in (head, peak)), b
    for b in discarded:
        assert weight_files(run_dir / "checkpoints" / b) == [], f"discarded arm {b} kept its weights"
        assert b in arms, f"discarded arm {b} lost its result file"
    # What was deleted is recorded: the discarded arms that had weights (race losers never saved any), and the
    # optimizer state of the segments the mainline passed through.
    pruned = retention.pruned(ledger)
    arms_gone = {k for k in pruned if not k.endswith("/optimizer.pt")}
    assert arms_gone == {b for b in discarded if not arms[b].get("stopped")}
    behind = {k.removesuffix("/optimizer.pt") for k in set(pruned) - arms_gone}
    assert behind and behind <= kept - {head}
    assert all(n > 0 for n in pruned.values())


def test_a_prune_killed_half_way_is_finished_on_resume_without_counting_twice(lineage_run):
    _, run_dir, summary, seen = lineage_run
    ledger = Ledger(run_dir / "ledger.sqlite")
    pruned = retention.pruned(ledger)
    # The round-1 record written before the kill stands as it was (the file deleted before the kill is not
    # counted again, nor are those the resume deleted), and round 1's doomed arms are all gone.
    assert {b: pruned[b] for b in seen["recorded"]} == seen["recorded"]
    for b in seen["doomed"]:
        assert weight_files(run_dir / "checkpoints" / b) == []
    # Idempotent: pruning the decided rounds again deletes nothing and records nothing.
    main = _mainline(ledger)
    for rnd in (1, 2):
        assert retention.prune(ledger, run_dir, "lineage", rnd, main.branch, main.peak.branch) == {}
    assert retention.pruned(ledger) == pruned
    assert summary["rounds"] == 2 and summary["stop_reason"] == "loop.max_rounds=2"


def test_status_summary_and_report_give_disk_use(lineage_run):
    from evotrainer.cli.main import app

    _, run_dir, summary, _ = lineage_run
    ledger = Ledger(run_dir / "ledger.sqlite")
    assert summary["pruned_bytes"] == sum(retention.pruned(ledger).values()) > 0
    assert summary["checkpoint_bytes"] == tree_bytes(run_dir / "checkpoints") > 0
    assert json.loads((run_dir / "summary.json").read_text())["pruned_bytes"] == summary["pruned_bytes"]
    res = CliRunner().invoke(app, ["status", str(run_dir)])
    words = res.output.split()  # the table wraps its cells at the terminal's width
    assert res.exit_code == 0 and {"disk", "pruning", "freed", "(run.keep_checkpoints=lineage)"} <= set(words)
    html = (run_dir / "report.html").read_text()
    assert "pruning the weights of discarded arms" in html and "freed" in html


def test_heads_keeps_only_the_base_the_head_and_the_best_read(lineage_run, tmp_path):
    """Pruned as the loop prunes, with the mainline's best read (`peak`, where the guard may send it back): on some
    CPUs' kernels that read is the base's own, whose optimizer state the lineage mode then kept."""
    _, run_dir, _, _ = lineage_run
    copy = tmp_path / "t"
    shutil.copytree(run_dir, copy)
    ledger = Ledger(copy / "ledger.sqlite")
    main = _mainline(ledger)
    head, peak = main.branch, main.peak.branch
    before = retention.pruned(ledger)
    freed = retention.prune(ledger, copy, "heads", 2, head, peak)
    assert set(freed) == lineage(ledger, head) - {"base", head, peak}
    for b in lineage(ledger, head):
        assert has_weights(copy / "checkpoints" / b) == (b in ("base", head, peak))
    assert retention.pruned(ledger) == {**before, **freed}
    assert retention.prune(ledger, copy, "heads", 2, head, peak) == {}


def test_an_undecided_round_is_never_pruned(lineage_run, tmp_path):
    """Branches of rounds after the one decided (a round in flight on resume) keep their weights."""
    _, run_dir, _, _ = lineage_run
    copy = tmp_path / "t"
    shutil.copytree(run_dir, copy)
    ledger = Ledger(copy / "ledger.sqlite")
    head1 = read_stage(ledger, 1, "promote").head.branch
    round2 = [b["id"] for b in ledger.branches() if b["round"] == 2 and has_weights(copy / "checkpoints" / b["id"])]
    assert round2
    retention.prune(ledger, copy, "heads", 1, head1)
    assert all(has_weights(copy / "checkpoints" / b) for b in round2)
    assert has_weights(copy / "checkpoints" / head1)


def test_keep_all_deletes_nothing(tmp_path, math_setup):
    cfg = _cfg(tmp_path, "all")
    summary = run_loop(cfg, _quiet())
    run_dir = tmp_path / "runs" / "t"
    ledger = Ledger(run_dir / "ledger.sqlite")
    arms = _arms(run_dir)
    assert retention.pruned(ledger) == {} and summary["pruned_bytes"] == 0
    for b in ledger.branches():
        if not arms.get(b["id"], {}).get("stopped"):
            assert has_weights(run_dir / "checkpoints" / b["id"]), b["id"]
    assert summary["checkpoint_bytes"] == tree_bytes(run_dir / "checkpoints")


def test_an_arm_whose_weights_were_pruned_is_redone_not_reused(tmp_path, math_setup):
    cfg, _, policy = math_setup
    start = tmp_path / "start"
    GRPOTrainer(policy.fork(tmp_path / "fork"), cfg.harness).save(start)
    spec = ArmSpec(
        branch="arm",
        role="control",
        run_dir=str(tmp_path),
        config=cfg.model_dump(mode="json"),
        harness=cfg.harness.model_dump(mode="json"),
        start=str(start),
        seed=1,
        first_step=1,
        steps=1,
    )
    first = run_arm(spec)
    ckpt = Path(spec.checkpoint)
    for f in weight_files(ckpt):
        f.unlink()
    again = run_arm(spec)
    assert has_weights(ckpt) and (ckpt / "optimizer.pt").is_file()
    assert again.last_step == first.last_step and again.generated_tokens == first.generated_tokens
