"""Replay backtest throughput: rollouts re-scored per second under a reward-reweighting intervention,
(a) end to end from a store of Parquet shards (DuckDB scan + re-score + report) and (b) the re-score
alone on columns already in memory. Uses the synthetic store of benchmarks/suite_scale.py.

    python -m benchmarks.replay [--steps 1000] [--per-step 256] [--root DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.suite_scale import write_store
from benchmarks.tables import markdown_table
from evotrainer.backtest.replay import load_columns, replay
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Intervention
from evotrainer.store.rollouts import RolloutStore


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--per-step", type=int, default=256)
    ap.add_argument("--root", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    root = args.root or Path(tempfile.mkdtemp(prefix="evotrainer-replay-"))
    t0 = time.perf_counter()
    write_store(root, args.steps, args.per_step)
    print(
        f"store: {args.steps * args.per_step:,} rollouts in {args.steps} shards at {root} "
        f"({time.perf_counter() - t0:.1f}s to write)"
    )
    store = RolloutStore(root)
    old = Harness(reward_weights={"correct": 1.0, "format": 0.1}, sampling={"num_generations": 8})
    iv = Intervention(
        kind="set_reward_weight",
        target="reward_weights.format",
        value=0.5,
        hypothesis={"finding": "reward_hacking", "signal": "reward_audit_auc", "direction": "up"},
    ).bind(old)
    end_to_end, compute = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        cols = load_columns(store, ["correct", "format"])
        flagged = ~np.isnan(cols.audit) & (cols.audit == 0) & (cols.reward > 0)
        t1 = time.perf_counter()
        report = replay(old, iv, cols, flagged)
        t2 = time.perf_counter()
        end_to_end.append(len(cols) / (t2 - t0))
        compute.append(len(cols) / (t2 - t1))
    n = len(cols)
    print(
        f"replayed {n:,} rollouts ({report.groups:,} groups); sign flips {report.frac_advantage_sign_flipped:.3f}, "
        f"AUC {report.reward_audit_auc_before:.3f} -> {report.reward_audit_auc_after:.3f}"
    )
    rows = [
        [
            f"end to end (DuckDB scan of {args.steps} shards + re-score + report)",
            f"{statistics.median(end_to_end):,.0f} rollouts/s",
        ],
        ["re-score + report on loaded columns", f"{statistics.median(compute):,.0f} rollouts/s"],
    ]
    print(markdown_table([f"replay of `{iv.describe()}`", f"median of {args.repeats}"], rows))


if __name__ == "__main__":
    main()
