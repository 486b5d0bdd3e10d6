"""Disk of the README's main job under each checkpoint retention, and a resume after pruning.

    python -m benchmarks.retention [--work DIR] [--kill-after-round 3]

Cells (each resumable: a finished one is read back, not rerun):
  all      `evotrainer run examples/math.yaml` keeping every checkpoint: the disk without retention;
  pruned   a copy of that run directory pruned as `lineage` and as `heads` would have, round by round (the
           decisions do not depend on retention, so this is the same run's disk under each mode);
  resumed  the same job under the default `lineage`, SIGKILLed once round N is decided and pruned, then
           `evotrainer resume`d: its decisions against the uninterrupted run's, and its disk.
`budget.seconds=0` in every cell, so that the decisions depend on tokens only and not on machine load.
Writes benchmarks/results/retention.json with its manifest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.manifest import write_result
from benchmarks.paths import RESULTS, ROOT, scratch
from evotrainer.stages import retention
from evotrainer.stages.results import read_stage
from evotrainer.store.checkpoints import tree_bytes
from evotrainer.store.ledger import Ledger

# The CLI of this checkout (not whichever one is installed), so a worktree measures its own code; and run
# from a copy that nobody edits meanwhile: every verdict hashes the evaluator's source files.
CLI = [sys.executable, "-m", "evotrainer.cli"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _run_args(work: Path, name: str, keep: str) -> list[str]:
    return [
        "--set", f"run.name={name}",
        "--set", f"run.out_dir={work}",
        "--set", f"run.keep_checkpoints={keep}",
        "--set", "budget.seconds=0",
        "--set", f"loop.skills_dir={work / name}-skills",
    ]  # fmt: skip


def decisions(run_dir: Path) -> dict:
    """What a run decided: rounds, promotions, the final read (resume must reproduce all of it)."""
    s = json.loads((run_dir / "summary.json").read_text())
    keys = ("rounds", "stop_reason", "promoted", "rejected", "final_accuracy", "training_steps", "harness_version")
    return {k: s[k] for k in keys}


def disk(run_dir: Path) -> dict:
    return {"run_bytes": tree_bytes(run_dir), "checkpoint_bytes": tree_bytes(run_dir / "checkpoints")}


def cell_all(work: Path) -> dict:
    run_dir = work / "all"
    if not (run_dir / "summary.json").exists():
        cmd = [*CLI, "run", str(ROOT / "examples/math.yaml"), *_run_args(work, "all", "all")]
        subprocess.run(cmd, check=True, env=ENV)
    return {"decisions": decisions(run_dir), **disk(run_dir)}


def cell_pruned(work: Path, mode: str) -> dict:
    src, dst = work / "all", work / f"as-{mode}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    ledger = Ledger(dst / "ledger.sqlite")
    rounds = json.loads((dst / "summary.json").read_text())["rounds"]
    for rnd in range(1, rounds + 1):  # as the loop does after each round's decision
        retention.prune(ledger, dst, mode, rnd, read_stage(ledger, rnd, "promote").head.branch)
    return {**disk(dst), "pruned_bytes": sum(retention.pruned(ledger).values())}


def cell_resumed(work: Path, kill_after: int) -> dict:
    run_dir = work / "resumed"
    if not (run_dir / "summary.json").exists():
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = [*CLI, "run", str(ROOT / "examples/math.yaml"), *_run_args(work, "resumed", "lineage")]
        proc = subprocess.Popen(cmd, env=ENV)
        # Killed once round `kill_after` is decided and pruned: the next round's training has started.
        while proc.poll() is None and not _round_started(run_dir, kill_after + 1):
            time.sleep(1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        subprocess.run([*CLI, "resume", str(run_dir)], check=True, env=ENV)
    ledger = Ledger(run_dir / "ledger.sqlite")
    return {"decisions": decisions(run_dir), **disk(run_dir), "pruned_bytes": sum(retention.pruned(ledger).values())}


def _round_started(run_dir: Path, rnd: int) -> bool:
    if not (run_dir / "ledger.sqlite").exists():
        return False
    try:
        return any(b["round"] == rnd for b in Ledger(run_dir / "ledger.sqlite").branches())
    except Exception:  # the ledger is being created
        return False


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.retention", description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=scratch("evotrainer-retention"), help="run directories (scratch)")
    ap.add_argument("--kill-after-round", type=int, default=3)
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    out = {"all": cell_all(args.work)}  # the command is the manifest's
    for mode in ("lineage", "heads"):
        out[f"as_{mode}"] = cell_pruned(args.work, mode)
    out["resumed"] = {"killed_after_round": args.kill_after_round, **cell_resumed(args.work, args.kill_after_round)}
    out["resumed"]["same_decisions"] = out["resumed"]["decisions"] == out["all"]["decisions"]
    write_result(
        RESULTS / "retention.json",
        out,
        work=args.work,
        configs=[ROOT / "examples/math.yaml"],
        overrides={"budget.seconds": 0},
        note="run.keep_checkpoints all, then lineage for the resumed cell",
    )
    mb = 1024 * 1024
    for k in ("all", "as_lineage", "as_heads", "resumed"):
        print(f"{k:12s} run {out[k]['run_bytes'] / mb:8.1f} MB, checkpoints {out[k]['checkpoint_bytes'] / mb:8.1f} MB")
    print("resume after pruning, same decisions:", out["resumed"]["same_decisions"])


if __name__ == "__main__":
    main()
