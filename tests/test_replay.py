"""The replay backtest on a real run's store, and the backtest CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml
from rich.console import Console

from evotrainer.backtest.replay import NotReplayable, auc, load_columns, replay, rescore
from evotrainer.harness.interventions import Intervention
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.run import train_run
from tests.conftest import small_config

HYP = {"finding": "reward_audit_gap", "signal": "reward_audit_auc", "direction": "up"}


@pytest.fixture(scope="module")
def run(tmp_path_factory, math_setup):
    tmp = tmp_path_factory.mktemp("replay")
    cfg = small_config(
        tmp,
        train={"steps": 4},
        eval={"heldout_size": 60, "max_new_tokens": 8, "audit_fraction": 0.5},
        harness={
            "sampling": {"num_generations": 8, "prompts_per_step": 16, "max_completion_length": 8, "temperature": 1.5}
        },
    )
    train_run(cfg, Console(file=open("/dev/null", "w")))
    return cfg, tmp / "runs" / "t"


def test_replay_matches_training_and_reports(run):
    cfg, run_dir = run
    store = RolloutStore(run_dir / "store")
    cols = load_columns(store, ["correct", "format"])
    assert len(cols) == 4 * 16 * 8 and np.isnan(cols.audit).mean() == pytest.approx(0.5, abs=0.01)
    # The old harness re-scores the stored rollouts exactly as training scored them.
    assert np.abs(rescore(cfg.harness, cols).total - cols.reward).max() < 1e-9
    iv = Intervention(kind="set_reward_weight", target="reward_weights.format", value=2.0, hypothesis=HYP).bind(
        cfg.harness
    )
    flagged = ~np.isnan(cols.audit) & (cols.audit == 0) & (cols.reward > 0)
    rep = replay(cfg.harness, iv, cols, flagged)
    assert rep.rollouts == len(cols) and rep.groups == 64 and rep.audited == int((~np.isnan(cols.audit)).sum())
    assert rep.recorded_reward_mismatch < 1e-9
    # Sign flips, computed independently: an advantage's sign is its total's side of the group mean.
    old_total = sum(w * cols.terms[k] for k, w in cfg.harness.reward_weights.items())
    new_total = 1.0 * cols.terms["correct"] + 2.0 * cols.terms["format"]

    def side(total):
        means = np.array([total[cols.group == g].mean() for g in range(64)])
        d = total - means[cols.group]
        return np.where(np.abs(d) < 1e-9, 0, np.sign(d))

    sa, sb = side(old_total), side(new_total)
    moved = (sa != 0) | (sb != 0)
    assert rep.frac_advantage_sign_flipped == pytest.approx((sa[moved] != sb[moved]).mean(), abs=1e-9)
    # Checked against an independent computation: AUC of the new total for the audit outcome.
    audited = ~np.isnan(cols.audit)
    assert rep.reward_audit_auc_after == pytest.approx(auc(new_total[audited], cols.audit[audited]))
    assert rep.flagged == int(flagged.sum())


def test_filters_change_effective_samples(run):
    cfg, run_dir = run
    cols = load_columns(RolloutStore(run_dir / "store"), ["correct", "format"])
    iv = Intervention(kind="add_filter", target="filters.zero_std_threshold", value=0.3, hypothesis=HYP).bind(
        cfg.harness
    )
    rep = replay(cfg.harness, iv, cols)
    assert rep.informative_groups_after < rep.informative_groups_before
    assert rep.effective_samples_after < rep.effective_samples_before and rep.has_effect
    trunc = Intervention(
        kind="add_filter", target="filters.mask_terminations", value=["stop", "length"], hypothesis=HYP
    ).bind(cfg.harness)
    assert replay(cfg.harness, trunc, cols).effective_samples_after == 0


def test_non_replayable_interventions_need_a_trial(run):
    cfg, run_dir = run
    cols = load_columns(RolloutStore(run_dir / "store"), ["correct", "format"])
    for target, value in (
        ("loss.beta", 0.1),
        ("optimizer.learning_rate", 1e-4),
        ("sampling.temperature", 0.7),
        ("loss.epsilon_high", 0.28),
    ):
        iv = Intervention(kind="set_knob", target=target, value=value, hypothesis=HYP).bind(cfg.harness)
        with pytest.raises(NotReplayable, match="trial"):
            replay(cfg.harness, iv, cols)


def test_backtest_cli(run, tmp_path):
    cfg, run_dir = run
    f = tmp_path / "iv.yaml"
    f.write_text(
        yaml.safe_dump(
            {"kind": "set_reward_weight", "target": "reward_weights.format", "value": 0.0, "hypothesis": HYP}
        )
    )
    out = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "backtest", str(run_dir), "--intervention", str(f), "--json"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["rollouts"] == 512 and rep["intervention"] == "set_reward_weight reward_weights.format: 0.1 -> 0.0"
    f.write_text(yaml.safe_dump({"kind": "set_knob", "target": "loss.beta", "value": 0.1, "hypothesis": HYP}))
    out = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "backtest", str(run_dir), "--intervention", str(f)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 3 and "needs a trial" in out.stderr and "Traceback" not in out.stderr
    assert (run_dir / "harness" / f"{cfg.harness.version}.yaml").exists()


def test_diagnose_cli_stores_findings(run):
    cfg, run_dir = run
    out = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "diagnose", str(run_dir), "--json"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    findings = json.loads(out.stdout)  # one JSON document, not JSON lines
    store = RolloutStore(run_dir / "store")
    stored = store.sql("SELECT name, evidence, suite_version FROM findings ORDER BY name")
    assert sorted(f["name"] for f in findings) == [r["name"] for r in stored]
    ids = {r["id"] for r in store.sql("SELECT id FROM rollouts")}
    for f in findings:
        assert set(f["evidence"]) <= ids and f["first_step"] == 1 and f["last_step"] == 4
    # Diagnosing the same window again replaces its record instead of duplicating it.
    again = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "diagnose", str(run_dir)],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "COLUMNS": "200"},
    )
    assert again.returncode == 0 and "finding(s), main steps 1-4" in again.stdout
    assert store.sql("SELECT count(*) AS n FROM findings")[0]["n"] == len(stored)
    # A window with nothing in it is an empty JSON array, not no output at all.
    empty = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "diagnose", str(run_dir), "--first", "9", "--json"],
        capture_output=True,
        text=True,
    )
    assert empty.returncode == 0 and json.loads(empty.stdout) == []
    # A branch the run does not have is an error naming the ones it has (it printed "0 finding(s)").
    bad = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "diagnose", str(run_dir), "--branch", "nosuch", "--json"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "'nosuch'" in bad.stderr and "main" in bad.stderr and bad.stdout == ""


def test_std_filter_replays_step_by_step(run):
    cfg, run_dir = run
    cols = load_columns(RolloutStore(run_dir / "store"), ["correct", "format"])
    iv = Intervention(kind="add_filter", target="filters.std_keep_ratio", value=0.5, hypothesis=HYP).bind(cfg.harness)
    rep = replay(cfg.harness, iv, cols)
    assert rep.informative_groups_after < rep.informative_groups_before and rep.has_effect
    scored = rescore(iv.apply(cfg.harness), cols)
    # The window's first step: its threshold is its own median group std, so every group below it leaves the loss.
    first = cols.step == cols.step.min()
    _, one = np.unique(cols.group[first], return_index=True)
    median = np.quantile(scored.group_std[first][one], 0.5)
    assert (scored.keep[first] == (scored.group_std[first] >= max(median, 1e-6))).all()
    assert not scored.keep[scored.group_std < 1e-6].any()


def test_an_advantage_scaling_change_reweights_groups_and_reaches_its_trial(run):
    """Unscaled advantages (Dr. GRPO) flip no sign and drop no rollout, but a group's weight no longer depends on
    its reward spread: the replay measures that shift and keeps the change for a trial (the README main job's replay
    had dropped it as a no-op, so the loop could never race the reference's scaling)."""
    cfg, run_dir = run
    cols = load_columns(RolloutStore(run_dir / "store"), ["correct", "format"])
    iv = Intervention(kind="set_knob", target="loss.scale_rewards", value="none", hypothesis=HYP).bind(cfg.harness)
    rep = replay(cfg.harness, iv, cols)
    assert rep.frac_advantage_sign_flipped == 0 and rep.effective_samples_after == rep.effective_samples_before
    stds = {round(float(np.std(cols.reward[cols.group == g])), 6) for g in np.unique(cols.group)} - {0.0}
    assert len(stds) > 1, "the plant needs groups of different spread"
    assert rep.advantage_weight_shift > 0.01 and rep.has_effect
