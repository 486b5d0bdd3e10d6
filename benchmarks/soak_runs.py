"""How the soak (benchmarks/soak.py) starts, strikes and reads loop runs: the run's config, the CLI in a
subprocess, a SIGKILL at a moment of a run's life, what a run committed and how it compares with the
reference, and resumable cells."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.paths import ROOT
from evotrainer.config import dump_config, parse_config
from evotrainer.store.ledger import Ledger
from evotrainer.store.rollouts import RolloutStore
from evotrainer.testing import small_raw

ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(ROOT)}


# -- runs ------------------------------------------------------------------------------------------------
def write_config(out_dir: Path, cache: Path) -> Path:
    """The soak's loop run: tests/conftest.py's small config, 2 rounds of 3-step arms, one candidate. Every
    run is named `soak` (rollout ids hold no run directory), with its own directory and skill library."""
    raw = small_raw(out_dir, cache, seed=0, name="soak")
    raw["run"]["threads"] = 1
    raw["loop"] = {
        "segment_steps": 3,
        "trial_steps": 3,
        "candidates": 1,
        "max_rounds": 2,
        "skills_dir": str(out_dir / "skills"),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "soak.yaml"
    path.write_text(dump_config(parse_config(raw)))
    return path


def cli(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`evotrainer ARGS` in a subprocess at low priority, its output appended to `log`."""
    with open(log, "a") as f:
        f.write(f"\n$ evotrainer {' '.join(args)}\n")
        f.flush()
        return subprocess.Popen(
            ["nice", "-n", "10", sys.executable, "-m", "evotrainer.cli", *args],
            env={**ENV, **(env or {})},
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
        )


def next_command(cfg: Path, run_dir: Path) -> list[str]:
    """What a user does after a run died: resume it, or start it again if it died before its ledger."""
    return ["resume", str(run_dir)] if (run_dir / "ledger.sqlite").exists() else ["run", str(cfg)]


def finish(cfg: Path, run_dir: Path, log: Path, tries: int = 3) -> int:
    """Resume until the run exits (0 when it finished); the last exit code."""
    rc = 1
    for _ in range(tries):
        rc = cli(next_command(cfg, run_dir), log).wait()
        if rc == 0:
            break
    return rc


def tail(log: Path, n: int = 600) -> str:
    return log.read_text()[-n:] if log.exists() else ""


# -- records -----------------------------------------------------------------------------------------------
def record(run_dir: Path) -> dict:
    """What a run committed, as lists (duplicates kept, so they can be counted): tests/test_resume.py's
    _record, plus the final held-out accuracy."""
    ledger = Ledger(run_dir / "ledger.sqlite")
    try:
        rollouts = RolloutStore(run_dir / "store").sql("SELECT id, reward, audit FROM rollouts ORDER BY id")
        summary = run_dir / "summary.json"
        return {
            "rollouts": [[r["id"], round(r["reward"], 9), r["audit"]] for r in rollouts],
            "stages": sorted([r["round"], r["stage"]] for r in ledger.rows("SELECT round, stage FROM stages")),
            "branches": [
                [b["id"], b["parent"], b["first_step"], b["last_step"], b["harness_version"], b["heldout_accuracy"]]
                for b in ledger.branches()
            ],
            "trials": [[t["id"], t["candidate"], t["intervention"]["target"]] for t in ledger.trials()],
            "verdicts": [
                [v["trial"], v["decision"], v["reasons"], round(v["statistic"]["delta"], 9)] for v in ledger.verdicts()
            ],
            "final_accuracy": json.loads(summary.read_text())["final_accuracy"] if summary.exists() else None,
        }
    finally:
        ledger.close()


def compare(ref: dict, got: dict) -> dict:
    """Records lost (in the reference, not here), duplicated (here twice) and extra (here only), by id;
    and whether every decision is the reference's."""
    lost = dup = extra = 0
    for key in ("rollouts", "stages", "branches", "trials", "verdicts"):
        ids = [json.dumps(r[:2] if key == "stages" else r[0]) for r in got[key]]
        want = {json.dumps(r[:2] if key == "stages" else r[0]) for r in ref[key]}
        lost += len(want - set(ids))
        dup += len(ids) - len(set(ids))
        extra += len(set(ids) - want)
    same = all(got[k] == ref[k] for k in ("branches", "trials", "verdicts", "final_accuracy"))
    return {
        "lost": lost,
        "duplicated": dup,
        "extra": extra,
        "same_decisions": same,
        "same_rollouts": got["rollouts"] == ref["rollouts"],
    }


# -- cells -------------------------------------------------------------------------------------------------
def cell(path: Path, work):
    """A finished cell's result, or run `work` and keep its result (written once it is whole)."""
    if path.exists():
        return json.loads(path.read_text())
    result = work()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.rename(path)
    return result


def at_work(run_dir: Path, pid: int) -> bool:
    """Whether process `pid` has begun a stage (the ledger's status row is its). Read-only: no lock taken."""
    try:
        con = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True, timeout=5)
        try:
            row = con.execute("SELECT pid FROM status").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return bool(row) and row[0] == pid


def strike(proc: subprocess.Popen, run_dir: Path, delay: float) -> int | None:
    """SIGKILL `proc` `delay` seconds after it begins its first stage; its exit code if it ended first."""
    while not at_work(run_dir, proc.pid):
        if proc.poll() is not None:
            return proc.returncode
        time.sleep(0.05)
    try:
        return proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return None


def where(run_dir: Path) -> str:
    """The stage a killed run was in (its ledger's status row), or where it was before it had a ledger."""
    if not (run_dir / "ledger.sqlite").exists():
        return "before the ledger"
    ledger = Ledger(run_dir / "ledger.sqlite")
    try:
        st = ledger.status() or {}
        done = ledger.stage_result(st.get("round", -1), st.get("stage", "")) is not None
        return f"{st.get('round')}:{st.get('stage')}" + (" (done)" if done else "") if st else "opening"
    finally:
        ledger.close()


def aggregate(runs: list[dict], injected: int, how: str) -> dict:
    ok = [r for r in runs if r["survived"]]
    same = [r["same_decisions"] for r in runs if "same_decisions" in r]  # runs that finished (not refused)
    return {
        "injected": injected,
        "survived": sum(r.get("kills", r.get("signals", 1)) for r in ok),
        "lost": sum(r.get("lost", 0) for r in runs),
        "duplicated": sum(r.get("duplicated", 0) for r in runs),
        "same_decisions": bool(same) and all(same) and len(ok) == len(runs),
        "notes": how,
        "runs": runs,
    }
