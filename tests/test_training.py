"""End to end: seeded determinism, and short real RL runs that must improve, single- and multi-turn."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from rich.console import Console

from evotrainer.errors import ConfigError
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.run import claim_run_dir, train_run
from tests.conftest import SEED, small_config

QUIET = Console(file=open("/dev/null", "w"))


def _rollouts(run_dir):
    rows = RolloutStore(run_dir / "store").query(where="split = 'train'")
    return [(r["id"], r["task_id"], [t["action"] for t in r["turns"]], r["reward"], r["termination"]) for r in rows]


def test_same_config_same_rollouts(tmp_path, math_setup):
    runs = []
    for name in ("a", "b"):
        cfg = small_config(tmp_path, run={"name": name, "out_dir": str(tmp_path), "seed": SEED}, train={"steps": 3})
        train_run(cfg, QUIET)
        runs.append(_rollouts(tmp_path / name))
    assert runs[0] == runs[1] and len(runs[0]) == 3 * 16 * 8
    cfg = small_config(tmp_path, run={"name": "c", "out_dir": str(tmp_path), "seed": SEED + 1}, train={"steps": 1})
    train_run(cfg, QUIET)
    assert _rollouts(tmp_path / "c")[0][2] != runs[0][0][2] or _rollouts(tmp_path / "c")[0][1] != runs[0][0][1]


def _reward_trend(run_dir, first=5, last=5):
    m = RolloutStore(run_dir / "store").metrics("main")
    steps = sorted(m)
    head = sum(m[s]["rewards/correct/mean"] for s in steps[:first]) / first
    tail = sum(m[s]["rewards/correct/mean"] for s in steps[-last:]) / last
    return head, tail


def test_math_rl_improves(tmp_path, math_setup):
    cfg = small_config(
        tmp_path,
        train={"steps": 80, "max_seconds": 3600},
        harness={
            "sampling": {"num_generations": 8, "prompts_per_step": 32, "max_completion_length": 8},
            "optimizer": {"learning_rate": 5e-4},
        },
    )
    summary = train_run(cfg, QUIET)
    head, tail = _reward_trend(tmp_path / "runs" / "t", 16, 16)
    assert tail > head + 0.05, (head, tail)
    assert summary["steps"] == 80
    # Held-out rollouts are stored with their audit outcomes, before and after.
    store = RolloutStore(tmp_path / "runs" / "t" / "store")
    assert store.count("split = 'heldout' AND audit IS NOT NULL") == 2 * cfg.eval.heldout_size


def test_multi_turn_rl_improves(tmp_path, digits_setup):
    cfg = small_config(
        tmp_path,
        "digits",
        train={"steps": 40, "max_seconds": 3600},
        harness={
            "sampling": {"num_generations": 8, "prompts_per_step": 16, "max_completion_length": 6},
            "multi_turn": {"max_turns": 5},
            "optimizer": {"learning_rate": 5e-4},
        },
    )
    train_run(cfg, QUIET)
    head, tail = _reward_trend(tmp_path / "runs" / "t", 8, 8)
    assert tail > head + 0.1, (head, tail)
    turns = RolloutStore(tmp_path / "runs" / "t" / "store").sql(
        "SELECT max(num_turns) AS n FROM rollouts WHERE split='train'"
    )
    assert turns[0]["n"] >= 3


def test_cli_train_then_eval(tmp_path, math_setup):
    cfg = small_config(tmp_path, train={"steps": 2})
    f = tmp_path / "c.yaml"
    f.write_text(json.dumps(cfg.model_dump(mode="json")))
    out = subprocess.run([sys.executable, "-m", "evotrainer.cli", "train", str(f)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "held-out accuracy before RL" in out.stdout and "held-out accuracy after 2 RL steps" in out.stdout
    # Off a terminal: plain progress lines as it goes (a bar draws nothing until it ends), no line folded at 80
    # columns (the run directory's line is longer than that here).
    lines = out.stdout.splitlines()
    assert any(line.startswith("RL ") and "2/2 (" in line for line in lines), out.stdout
    assert any(line.startswith("held-out eval") and "/60 (" in line for line in lines), out.stdout
    assert any(line.startswith("run ") and line.endswith("domain math") and len(line) > 80 for line in lines), lines
    # The same run name again is refused (it silently mixed the two runs' stores and summaries) ...
    again = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "train", str(f), "--set", "train.steps=1"],
        capture_output=True,
        text=True,
    )
    assert again.returncode == 2 and "run.name" in again.stderr and "--overwrite" in again.stderr
    store = RolloutStore(tmp_path / "runs" / "t" / "store")
    assert store.sql("SELECT max(step) AS s FROM rollouts WHERE split = 'train'")[0]["s"] == 2
    # ... unless told: --overwrite clears it first, so the store and the summary are the second run's alone.
    over = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "train", str(f), "--set", "train.steps=1", "--overwrite"],
        capture_output=True,
        text=True,
    )
    assert over.returncode == 0, over.stderr
    assert json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())["steps"] == 1
    assert store.sql("SELECT max(step) AS s FROM rollouts WHERE split = 'train'")[0]["s"] == 1
    ev = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "eval", str(tmp_path / "runs" / "t")], capture_output=True, text=True
    )
    assert ev.returncode == 0, ev.stderr
    summary = json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())
    assert f"held-out accuracy: {summary['accuracy_after']:.3f}" in ev.stdout


def test_overwrite_clears_a_run_directory_and_nothing_else(tmp_path):
    used = tmp_path / "mine"
    used.mkdir()
    (used / "notes.txt").write_text("not a run")
    claim_run_dir(tmp_path / "new", overwrite=False)  # absent or empty: nothing to refuse
    with pytest.raises(ConfigError, match=r"run\.name: .*mine already holds a run.*--overwrite"):
        claim_run_dir(used, overwrite=False)
    with pytest.raises(ConfigError, match="not a run directory"):
        claim_run_dir(used, overwrite=True)
    assert (used / "notes.txt").exists()
    (used / "config.yaml").write_text("{}\n")
    (used / "ledger.sqlite").write_text("")
    with pytest.raises(ConfigError, match="loop run.*evotrainer resume"):
        claim_run_dir(used, overwrite=False)
    claim_run_dir(used, overwrite=True)
    assert not used.exists()


def test_std_filter_threshold_is_the_ema_of_each_steps_quantile(tmp_path, math_setup):
    cfg = small_config(
        tmp_path, train={"steps": 3}, harness={"filters": {"std_keep_ratio": 0.5, "std_ema_decay": 0.5}}
    )
    train_run(cfg, QUIET)
    store = RolloutStore(tmp_path / "runs" / "t" / "store")
    m = store.metrics("main")
    ema = None
    for step in sorted(m):
        rows = store.query(where=f"split = 'train' AND step = {step}")
        by_group: dict[str, list[float]] = {}
        for r in rows:
            by_group.setdefault(r["group_id"], []).append(r["reward"])
        q = float(np.quantile([np.std(v, ddof=1) for v in by_group.values()], 0.5))
        ema = q if ema is None else 0.5 * ema + 0.5 * q
        assert m[step]["filters/std_threshold"] == pytest.approx(ema, abs=1e-6)
        dead = sum(np.std(v) < 1e-6 for v in by_group.values()) / len(by_group)
        assert m[step]["frac_trainable"] <= 1 - dead + 1e-9
