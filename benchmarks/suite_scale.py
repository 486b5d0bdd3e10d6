"""Scale benchmark of the diagnostic suite: writes 1M synthetic rollouts (4000 step shards of 256) with
pyarrow, then times one Suite.run over the whole window and reports peak RSS.

    python -m benchmarks.suite_scale [--steps 4000] [--per-step 256] [--root DIR] [--repeats 2]

With --root DIR the store is kept (and reused when it already holds the requested shards).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from evotrainer.diagnostics.suite import Suite
from evotrainer.diagnostics.window import open_window
from evotrainer.store.rollouts import METRIC_SCHEMA, ROLLOUT_SCHEMA, RolloutStore

GROUP = 8
ACTIONS = [
    f"step {i}: {i} + {i * 3 % 17} = {i + i * 3 % 17}, so the answer is <answer>{i + i * 3 % 17}</answer>"
    for i in range(97)
]
ACTIONS += ["the the the the the the the the the the the the"] * 3  # a few repetition loops, as in real runs
PROMPTS = [f"What is {a} + {b}? Think, then answer inside <answer></answer>.\n" for a in range(13) for b in range(11)]


def shard_table(branch: str, step: int, n: int, rng: np.random.Generator) -> pa.Table:
    """One step's rollouts, built column by column (Rollout objects would take minutes at this size).
    Some failures are planted so that detectors run their full path (evidence, per-term queries),
    not only their early exits: 12% truncation, and `correct` and `format` rising while a quarter of
    the rollouts are audited at a flat 50% pass rate (reward hacking, reward-audit gap)."""
    idx = np.arange(n)
    correct = (rng.random(n) < 0.3 + 0.4 * step / 4000).astype(np.float64)
    fmt = (rng.random(n) < 0.5 + 0.5 * step / 4000).astype(np.float64)
    tokens = rng.integers(8, 64, n).astype(np.int32)
    termination = np.where(rng.random(n) < 0.12, "length", "stop")
    logprob = rng.normal(-0.6, 0.2, n)
    action_ix = rng.integers(0, len(ACTIONS), n)
    turns = pa.array(
        [
            [
                {
                    "action": ACTIONS[a],
                    "tokens": int(t),
                    "mean_logprob": float(lp),
                    "observation": "",
                    "tool_error": False,
                }
            ]
            for a, t, lp in zip(action_ix, tokens, logprob)
        ],
        type=ROLLOUT_SCHEMA.field("turns").type,
    )
    passed = rng.random(n) < 0.5
    audit = pa.array([bool(a) if k % 4 == 0 else None for k, a in zip(idx, passed)], pa.bool_())
    rewards = pa.array(
        [[("correct", c), ("format", f)] for c, f in zip(correct, fmt)], ROLLOUT_SCHEMA.field("rewards").type
    )
    cols = {
        "id": [f"{branch}-s{step:06d}-{i:04d}" for i in idx],
        "run": ["bench"] * n,
        "branch": [branch] * n,
        "step": np.full(n, step, np.int64),
        "harness_version": ["h-bench"] * n,
        "task_id": [f"t{(step * 32 + i // GROUP) % 5000}" for i in idx],
        "split": ["train"] * n,
        "group_id": [f"{branch}-s{step:06d}-g{i // GROUP:03d}" for i in idx],
        "difficulty": np.zeros(n, np.int32),
        "prompt": [PROMPTS[(step * 32 + i // GROUP) % len(PROMPTS)] for i in idx],
        "turns": turns,
        "num_turns": np.ones(n, np.int32),
        "completion_tokens": tokens,
        "termination": termination,
        "rewards": rewards,
        "reward": correct + 0.1 * fmt,
        "audit": audit,
        "info": ["{}"] * n,
        "gen_seconds": np.full(n, 0.01),
        "env_seconds": np.zeros(n),
    }
    cols["max_action_tokens"] = tokens  # dropped below if the store's schema has no such column
    return pa.Table.from_pydict({f.name: cols[f.name] for f in ROLLOUT_SCHEMA}, schema=ROLLOUT_SCHEMA)


def metric_table(branch: str, step: int, rng: np.random.Generator) -> pa.Table:
    m = {
        "reward": 0.4 + 0.4 * step / 4000,
        "entropy": float(rng.normal(0.8, 0.02)),
        "grad_norm": float(rng.normal(0.5, 0.05)),
        "kl": float("nan"),
        "clip_ratio/low_mean": 0.001,
        "clip_ratio/high_mean": 0.001,
        "nonfinite_steps": 0.0,
        "completions/clipped_ratio": 0.03,
        "frac_reward_zero_std": 0.2,
    }
    return pa.Table.from_pydict(
        {
            "run": ["bench"] * len(m),
            "branch": [branch] * len(m),
            "step": [step] * len(m),
            "name": list(m),
            "value": list(m.values()),
        },
        schema=METRIC_SCHEMA,
    )


def write_store(root: Path, steps: int, per_step: int) -> RolloutStore:
    store = RolloutStore(root)
    have = len(list(store.rollout_dir.glob("*.parquet")))
    if have == steps:
        return store
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for step in range(steps):
        # Plain write_table, not the store's fsync'ed atomic write: this is test data, and fsync x 8000 is slow.
        pq.write_table(shard_table("main", step, per_step, rng), store.rollout_dir / f"main-s{step:06d}.parquet")
        pq.write_table(metric_table("main", step, rng), store.metric_dir / f"main-s{step:06d}.parquet")
    print(f"wrote {steps * per_step:,} rollouts in {steps} shards in {time.perf_counter() - t0:.1f} s")
    return store


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.suite_scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--per-step", type=int, default=256)
    ap.add_argument("--root", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    tmp = None
    if args.root is None:
        tmp = Path(tempfile.mkdtemp(prefix="suite_scale_"))
    root = args.root or tmp
    try:
        store = write_store(root, args.steps, args.per_step)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        suite = Suite.default()
        for r in range(args.repeats):
            t0 = time.perf_counter()
            findings = suite.run(store, "main", 0, args.steps - 1)
            dt = time.perf_counter() - t0
            print(
                f"run {r}: Suite.run over {args.steps * args.per_step:,} rollouts: {dt:.2f} s, "
                f"{len(findings)} findings: " + ", ".join(sorted(f.name for f in findings))
            )
        # The same work broken down: the window (one scan that materializes rollout_stats), then each detector.
        t0 = time.perf_counter()
        w = open_window(store, "main", 0, args.steps - 1)
        parts = {"open_window": time.perf_counter() - t0}
        for name, fn, params in suite.resolved():
            w.params = params
            t0 = time.perf_counter()
            fn(w)
            parts[name] = time.perf_counter() - t0
        w.con.close()
        print("breakdown: " + ", ".join(f"{k} {v:.2f}s" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS: {peak:.0f} MiB (before the suite: {rss_before:.0f} MiB)")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
