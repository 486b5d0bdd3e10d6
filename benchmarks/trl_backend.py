"""Our backend against the TRL backend (`train.backend: trl`) in one process: the same tiny policy, seed,
config and steps, each an `evotrainer train` run. Prints each backend's reward trend (mean of the first and
last five steps), held-out accuracy before and after, and seconds per step.

    python -m benchmarks.trl_backend [--config examples/math.yaml] [--steps 20]
        [--set harness.optimizer.learning_rate=0.001]
"""

from __future__ import annotations

import argparse
import io
import tempfile
from pathlib import Path

import yaml
from rich.console import Console

from benchmarks.tables import markdown_table
from evotrainer.config import load_config
from evotrainer.store.rollouts import RolloutStore
from evotrainer.testing import ONE_DIGIT_SUMS, SMALL_SAMPLING, TINY_POLICY, WARM_START
from evotrainer.training.run import train_run

# Sized for a shared 2-core CPU: the tests' tiny policy (its warm start takes seconds) on one-digit sums.
SMALL = {
    "policy.tiny": TINY_POLICY,
    "policy.warm_start": WARM_START,
    "env.datasets": ONE_DIGIT_SUMS,
    "env.train_size": 400,
    "harness.sampling": SMALL_SAMPLING,
    "harness.optimizer.learning_rate": 5e-4,
    "eval.heldout_size": 100,
    "eval.max_new_tokens": 8,
}


def one(config: str, backend: str, steps: int, out: Path, sets: dict) -> dict:
    overrides = {
        "run.out_dir": str(out),
        "run.name": backend,
        "train.steps": steps,
        "train.max_seconds": 3600,
        "train.eval_every": 0,
        "train.backend": backend,
        **sets,
    }
    cfg = load_config(config, overrides)
    summary = train_run(cfg, Console(file=io.StringIO()))
    m = RolloutStore(out / backend / "store").metrics("main")
    steps_run = sorted(m)
    k = min(5, len(steps_run))

    def mean(name: str, which: list[int]) -> float:
        return sum(m[s][name] for s in which) / len(which)

    return {
        "backend": backend,
        "steps": summary["steps"],
        "reward_first5": mean("reward", steps_run[:k]),
        "reward_last5": mean("reward", steps_run[-k:]),
        "correct_first5": mean("rewards/correct/mean", steps_run[:k]),
        "correct_last5": mean("rewards/correct/mean", steps_run[-k:]),
        "acc_before": summary["accuracy_before"],
        "acc_after": summary["accuracy_after"],
        "s_per_step": mean("seconds", steps_run),
        "s_per_step_after_first": mean("seconds", steps_run[1:]) if len(steps_run) > 1 else float("nan"),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.trl_backend", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="examples/math.yaml")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE over the small defaults below")
    a = ap.parse_args(argv)
    sets = SMALL | {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in a.set)}
    with tempfile.TemporaryDirectory() as d:
        rows = [one(a.config, b, a.steps, Path(d), sets) for b in ("ours", "trl")]
    header = ["backend", "steps", "reward first 5 -> last 5", "correct first 5 -> last 5", "held-out acc", "s/step"]
    lines = [
        [
            r["backend"],
            r["steps"],
            f"{r['reward_first5']:.3f} -> {r['reward_last5']:.3f}",
            f"{r['correct_first5']:.3f} -> {r['correct_last5']:.3f}",
            f"{r['acc_before']:.3f} -> {r['acc_after']:.3f}",
            f"{r['s_per_step']:.2f} ({r['s_per_step_after_first']:.2f} after step 1)",
        ]
        for r in rows
    ]
    print(markdown_table(header, lines))


if __name__ == "__main__":
    main()
