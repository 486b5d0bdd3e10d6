"""Resume: a real loop run killed with SIGKILL during training, during a trial and inside a verdict
write continues without lost or duplicated records and reaches the decisions of an uninterrupted run;
one stopped by SIGTERM or SIGINT stops at a stage boundary and resumes to the same decisions."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from conftest import small_config
from evotrainer.config import dump_config
from evotrainer.loop import run_loop
from evotrainer.store.ledger import Ledger
from evotrainer.store.rollouts import RolloutStore


def _cfg(tmp: Path, name: str):
    return small_config(
        tmp,
        run={"name": name, "out_dir": str(tmp / "runs"), "seed": 0},
        loop={
            "segment_steps": 3,
            "trial_steps": 3,
            "candidates": 1,
            "max_rounds": 2,
            "skills_dir": str(tmp / name / "skills"),
        },
    )


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "evotrainer.cli", *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _signal_when(proc: subprocess.Popen, ready, sig: int) -> str:
    """Send `sig` once `ready()`; the run's stderr after it exits."""
    # No clock: a run that passes the moment without reaching it ends, and that is the failure.
    while not ready():
        assert proc.poll() is None, f"the run ended before the signal's moment: {proc.stderr.read()[-2000:]}"
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    return err


def _kill_when(proc: subprocess.Popen, ready) -> None:
    _signal_when(proc, ready, signal.SIGKILL)


def _resume_to_the_end_and_match(run_dir: Path, expected: dict) -> None:
    proc = _cli("resume", str(run_dir))
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    got = _record(run_dir)
    for key in expected:
        assert got[key] == expected[key], key


def _written(tmp_path: Path, name: str) -> tuple[Path, Path, Path]:
    """A small loop config written to a file, as a user runs it: (config file, run directory, shards)."""
    cfg_file = tmp_path / f"{name}.yaml"
    cfg_file.write_text(dump_config(_cfg(tmp_path, name)))
    run_dir = tmp_path / "runs" / name
    return cfg_file, run_dir, run_dir / "store" / "rollouts"


def _record(run_dir: Path) -> dict:
    ledger = Ledger(run_dir / "ledger.sqlite")
    store = RolloutStore(run_dir / "store")
    rollouts = store.sql("SELECT id, reward, audit FROM rollouts ORDER BY id")
    ids = [r["id"] for r in rollouts]
    assert len(ids) == len(set(ids)), "duplicated rollouts"
    return {
        "stages": sorted((r["round"], r["stage"]) for r in ledger.rows("SELECT round, stage FROM stages")),
        "branches": [
            (b["id"], b["parent"], b["first_step"], b["last_step"], b["harness_version"], b["heldout_accuracy"])
            for b in ledger.branches()
        ],
        "trials": [
            (t["id"], t["candidate"], t["intervention"]["target"], t["intervention"]["value"]) for t in ledger.trials()
        ],
        "verdicts": [
            (v["trial"], v["decision"], v["reasons"], round(v["statistic"]["delta"], 9)) for v in ledger.verdicts()
        ],
        "generated": ledger.spent().generated_tokens,
        "rollouts": [(r["id"], round(r["reward"], 9), r["audit"]) for r in rollouts],
        "findings": store.sql("SELECT count(*) AS n FROM findings")[0]["n"],
    }


@pytest.fixture(scope="module")
def expected(tmp_path_factory, math_setup) -> dict:
    """The record of one uninterrupted run, which every interrupted one must reach."""
    tmp = tmp_path_factory.mktemp("ref")
    run_loop(_cfg(tmp, "ref"), Console(file=io.StringIO()))
    return _record(tmp / "runs" / "ref")


def test_sigkill_at_several_points_then_resume_matches_an_uninterrupted_run(tmp_path, expected):
    cfg_file, run_dir, shards = _written(tmp_path, "k")

    # 1. during training: the segment has written two of its three steps
    _kill_when(_cli("run", str(cfg_file)), lambda: (shards / "r01-seg-s000002.parquet").exists())
    assert Ledger(run_dir / "ledger.sqlite").stage_result(1, "train") is None
    # 2. during a trial: the control arm is done, the candidate is training
    _kill_when(
        _cli("resume", str(run_dir)),
        lambda: (run_dir / "checkpoints" / "r01-ctl" / "arm.json").exists() and any(shards.glob("r01-c1-s*.parquet")),
    )
    # 3. inside the verdict write: killed after the inserts, before the commit
    proc = _cli("resume", str(run_dir), env={"EVOTRAINER_KILL_AT": "1:gate"})
    proc.wait(timeout=600)
    assert proc.returncode == -signal.SIGKILL
    ledger = Ledger(run_dir / "ledger.sqlite")
    assert ledger.verdicts() == [] and ledger.trials() == [] and ledger.stage_result(1, "gate") is None
    assert ledger.stage_result(1, "trial") is not None
    # 4. in round 2's skill update, then to the end
    proc = _cli("resume", str(run_dir), env={"EVOTRAINER_KILL_AT": "2:remember"})
    proc.wait(timeout=600)
    assert proc.returncode == -signal.SIGKILL
    _resume_to_the_end_and_match(run_dir, expected)
    assert expected["verdicts"], "the runs must have decided something"


def test_sigterm_and_sigint_stop_at_a_stage_boundary_then_resume_matches(tmp_path, expected):
    cfg_file, run_dir, shards = _written(tmp_path, "s")
    # SIGTERM mid-segment: the segment finishes and commits, then the run stops, with no traceback
    proc = _cli("run", str(cfg_file))
    err = _signal_when(proc, lambda: (shards / "r01-seg-s000002.parquet").exists(), signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert f"stopped at a stage boundary after round 1 stage train; `evotrainer resume {run_dir}` continues" in err
    assert "Traceback" not in err
    ledger = Ledger(run_dir / "ledger.sqlite")
    assert ledger.last_finished() == (1, "train") and ledger.stage_result(1, "diagnose") is None
    # SIGINT (Ctrl-C) mid-trial: the trial's arms finish, the stage commits, the run stops
    proc = _cli("resume", str(run_dir))
    err = _signal_when(proc, lambda: any(shards.glob("r01-c1-s*.parquet")), signal.SIGINT)
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    assert "stopped at a stage boundary after round 1 stage trial" in err and "Traceback" not in err
    assert Ledger(run_dir / "ledger.sqlite").last_finished() == (1, "trial")
    _resume_to_the_end_and_match(run_dir, expected)


def test_an_arms_result_key_survives_a_moved_or_renamed_run_and_not_a_changed_spec(tmp_path):
    from dataclasses import replace

    from evotrainer.backtest.trial import ArmSpec, spec_key

    def spec(run_dir: Path, **changes) -> ArmSpec:
        cfg = small_config(tmp_path, run={"name": run_dir.name, "out_dir": str(run_dir.parent), "seed": 0})
        return replace(
            ArmSpec(
                branch="r01-ctl",
                role="control",
                run_dir=str(run_dir),
                config=cfg.model_dump(mode="json"),
                harness=cfg.harness.model_dump(mode="json"),
                start=str(run_dir / "checkpoints" / "r01-seg"),
                seed=7,
                first_step=11,
                steps=20,
            ),
            **changes,
        )

    a = spec(tmp_path / "runs" / "a")
    assert spec_key(a, None, None) == spec_key(spec(tmp_path / "elsewhere" / "b"), None, None)
    for change in ({"seed": 8}, {"steps": 21}, {"start": str(tmp_path / "runs" / "a" / "checkpoints" / "base")}):
        assert spec_key(replace(a, **change), None, None) != spec_key(a, None, None), change
