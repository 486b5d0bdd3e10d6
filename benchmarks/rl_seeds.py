"""Does RL raise the held-out audited success rate, beyond the noise of one run? Several RL seeds from
one warm-started base, under one config's harness, read on the same held-out tasks before and after.

The warm start is shared (it is what RL improves on, and building one per seed would cost more than
the RL itself); each seed draws its own task order and samples. Every arm is the loop's own trial arm
(backtest/trial.py: run_arm), evaluated by the evaluator on all held-out tasks; the per-seed change
comes with a paired bootstrap interval over tasks.

    python -m benchmarks.rl_seeds examples/code.yaml [--seeds 0 1 2] [--steps 60] [--workers 2]
        [--set train.steps=...]

Prints a Markdown table (paste it into benchmarks/RESULTS.md) and writes
benchmarks/results/rl_seeds-NAME-STEPS.json with its manifest.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from benchmarks.manifest import write_result
from benchmarks.paths import RESULTS
from benchmarks.tables import markdown_table
from evotrainer.backtest.executors import ProcessExecutor, SerialExecutor
from evotrainer.backtest.statistics import bootstrap
from evotrainer.backtest.trial import ArmResult, ArmSpec
from evotrainer.config import RunConfig, load_config
from evotrainer.envs.registry import make_domain, warm_start_key
from evotrainer.evaluation import EvalResult, evaluate
from evotrainer.policies import load_policy
from evotrainer.training.grpo import GRPOTrainer


def train_seeds(
    cfg: RunConfig, steps: int, seeds: list[int], workers: int
) -> tuple[int, EvalResult, list[ArmResult], float]:
    """The base read on the held-out tasks, then one arm a seed from it: (held-out tasks, the base's read,
    the arms, wall seconds)."""
    # One directory per (config name, steps): a finished arm is reused (trial.py), so a rerun with other
    # steps must not find it.
    run_dir = Path(cfg.run.out_dir) / f"{cfg.run.name}-seeds-{steps}"
    run_dir.mkdir(parents=True, exist_ok=True)
    domain = make_domain(cfg)
    heldout = domain.tasks("heldout")
    base = run_dir / "checkpoints" / "base"
    policy = load_policy(cfg.policy, domain, cfg.run.seed, warm_start_key(cfg, domain))
    GRPOTrainer(policy, cfg.harness).save(base)
    before = evaluate(policy, domain, heldout, cfg.eval)
    spec = ArmSpec(
        branch="",
        role="control",
        run_dir=str(run_dir),
        config=cfg.model_dump(mode="json"),
        harness=cfg.harness.model_dump(mode="json"),
        start=str(base),
        seed=0,
        first_step=1,
        steps=steps,
        gate_ids=tuple(t.id for t in heldout),
    )
    specs = [replace(spec, branch=f"seed{s}", seed=s) for s in seeds]
    t0 = time.perf_counter()
    executor = ProcessExecutor(workers, cfg.run.threads * workers) if workers > 1 else SerialExecutor()
    arms = executor.run(specs)
    return len(heldout), before, arms, time.perf_counter() - t0


def changes(before: EvalResult, arms: list[ArmResult], seeds: list[int]) -> tuple[dict, list[list[str]]]:
    """Per seed, the change with its paired bootstrap interval over tasks, and the pooled change; and the
    table's rows."""
    out: dict = {"seeds": {}}
    rows = []
    ids = sorted(before.outcomes)
    b = np.array([before.outcomes[i] for i in ids], dtype=float)
    for s, arm in zip(seeds, arms):
        a = np.array([arm.outcomes[i] for i in ids], dtype=float)
        st = bootstrap(a, b, 0.95, 2000, s)
        out["seeds"][s] = {
            "after": arm.accuracy,
            "delta": st["delta"],
            "ci_low": st["ci_low"],
            "ci_high": st["ci_high"],
            "seconds": arm.seconds,
        }
        rows.append(
            [
                s,
                f"{before.accuracy:.3f}",
                f"{arm.accuracy:.3f}",
                f"{st['delta']:+.3f}",
                f"[{st['ci_low']:+.3f}, {st['ci_high']:+.3f}]",
            ]
        )
    out["mean_delta"] = float(np.mean([v["delta"] for v in out["seeds"].values()]))
    # Pooled: each task's success rate over the seeds against before, bootstrapped over tasks.
    pooled = np.mean([[arm.outcomes[i] for i in ids] for arm in arms], axis=0)
    out["pooled"] = bootstrap(pooled, b, 0.95, 2000, 0)
    return out, rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.rl_seeds", description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=None, help="RL steps per seed (default: the config's train.steps)")
    ap.add_argument("--workers", type=int, default=1, help="seeds trained at once (process workers)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    cfg = load_config(args.config, overrides)
    steps = args.steps or cfg.train.steps
    heldout, before, arms, wall = train_seeds(cfg, steps, args.seeds, args.workers)
    seeds, rows = changes(before, arms, args.seeds)
    out = {"config": args.config, "overrides": overrides, "steps": steps, "heldout": heldout}
    out |= {"before": before.accuracy, "seeds": seeds["seeds"], "wall_seconds": wall}
    out |= {"mean_delta": seeds["mean_delta"], "pooled": seeds["pooled"]}
    print(
        f"`{args.config}` {' '.join('--set ' + s for s in args.set)}: "
        f"{steps} RL steps per seed from one warm-started base, "
        f"{heldout} held-out tasks (audited success), {wall:.0f} s wall for {len(arms)} seeds "
        f"({args.workers} worker(s); "
        f"each arm's own time: {', '.join(f'{a.seconds:.0f} s' for a in arms)}, reused when its result file existed)\n"
    )
    header = ["RL seed", "before", "after", "change", "95% CI (paired bootstrap over tasks)"]
    print(markdown_table(header, rows))
    p = out["pooled"]
    print(
        f"\nmean change {out['mean_delta']:+.3f}, 95% CI [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}] pooled over seeds "
        f"(one-sided lower bound {p['lower']:+.3f}); seeds with a CI above 0: "
        f"{sum(v['ci_low'] > 0 for v in out['seeds'].values())}/{len(arms)}"
    )
    result = RESULTS / f"rl_seeds-{cfg.run.name}-{steps}.json"
    write_result(result, out, work=cfg.run.out_dir, configs=[args.config], overrides=overrides)


if __name__ == "__main__":
    main()
