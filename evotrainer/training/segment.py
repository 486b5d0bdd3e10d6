"""One RL step and a segment of steps: pick tasks, roll out groups, score under the harness, compute
advantages and masks, update the policy, record rollouts and step metrics in the store."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np
import torch

from evotrainer.envs.env import Domain
from evotrainer.harness.filters import trainable
from evotrainer.harness.harness import Curriculum, Harness
from evotrainer.harness.rewards import term_values, total_reward
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.grpo import ZERO_STD, GRPOTrainer, advantages
from evotrainer.training.rollout import Episode, run_episodes
from evotrainer.types import Rollout, Task


@dataclass(frozen=True)
class StepContext:
    """Where a step's records belong. Seeds derive from (seed, step) only, never from the branch,
    so a candidate and its control see the same tasks in the same order with the same sampling noise."""

    run: str
    branch: str
    seed: int


def step_tasks(
    pool: list[Task],
    n: int,
    seed: int,
    step: int,
    curriculum: Curriculum | None = None,
    pass_rates: dict[str, float] | None = None,
) -> list[Task]:
    """The step's prompts: seeded by (seed, step), restricted by the curriculum's levels and by its
    easy / hard thresholds on each task's last observed pass rate."""
    rng = random.Random(seed * 1_000_003 + step)
    if curriculum is not None:
        c, rates = curriculum, pass_rates or {}
        eligible = [
            t
            for t in pool
            if (c.levels is None or t.difficulty in c.levels)
            and not (c.easy_threshold is not None and rates.get(t.id, -1.0) >= c.easy_threshold)
            and not (c.hard_threshold is not None and rates.get(t.id, 2.0) <= c.hard_threshold)
        ]
        pool = eligible or pool  # never starve the step: an empty selection falls back to the pool
    return rng.sample(pool, n) if n <= len(pool) else [rng.choice(pool) for _ in range(n)]


def audit_sample(n: int, fraction: float, seed: int, step: int) -> list[int]:
    """Which train rollouts the evaluator audits this step (seeded; independent of the harness)."""
    if fraction <= 0:
        return []
    rng = random.Random(seed * 31 + step)
    return sorted(rng.sample(range(n), max(1, round(n * fraction))))


def to_rollouts(
    episodes: list[Episode],
    terms: list[dict[str, float]],
    totals: list[float],
    *,
    ctx: StepContext,
    step: int,
    harness_version: str,
    group_size: int,
    kind: str = "s",
    audits: list[bool | None] | None = None,
) -> list[Rollout]:
    out = []
    for i, (ep, t, r) in enumerate(zip(episodes, terms, totals)):
        out.append(
            Rollout(
                id=f"{ctx.branch}-{kind}{step:06d}-{i:04d}",
                run=ctx.run,
                branch=ctx.branch,
                step=step,
                harness_version=harness_version,
                task_id=ep.task.id,
                split=ep.task.split,
                group_id=f"{ctx.branch}-{kind}{step:06d}-g{i // group_size:03d}",
                prompt=ep.task.prompt,
                turns=ep.turns,
                termination=ep.termination,
                rewards=t,
                reward=r,
                audit=audits[i] if audits else None,
                difficulty=ep.task.difficulty,
                info=ep.info,
                gen_seconds=ep.gen_seconds,
                env_seconds=ep.env_seconds,
            )
        )
    return out


def train_step(
    trainer: GRPOTrainer,
    domain: Domain,
    pool: list[Task],
    ctx: StepContext,
    step: int,
    store: RolloutStore | None = None,
    audit_fraction: float = 0.0,
    pass_rates: dict[str, float] | None = None,
) -> dict[str, float]:
    """pass_rates (task id -> last group mean of `correct`) feeds the curriculum and is updated here."""
    h: Harness = trainer.harness
    s = h.sampling
    t0 = time.perf_counter()
    picked = step_tasks(pool, s.prompts_per_step, ctx.seed, step, h.curriculum, pass_rates)
    tasks = [t for t in picked for _ in range(s.num_generations)]
    gen = torch.Generator().manual_seed(ctx.seed * 7_919 + step)
    episodes = run_episodes(
        trainer.policy,
        domain,
        tasks,
        max_new_tokens=s.max_completion_length,
        max_turns=h.multi_turn.max_turns,
        temperature=s.temperature,
        top_p=s.top_p,
        tool_error=h.multi_turn.tool_error,
        generator=gen,
    )
    gen_seconds = time.perf_counter() - t0
    terms = [term_values(domain, ep.task, ep.turns, ep.info) for ep in episodes]
    termination = np.array([ep.termination for ep in episodes])
    totals = total_reward(
        h,
        {k: np.array([t[k] for t in terms]) for k in terms[0]},
        np.array([ep.action_tokens for ep in episodes]),
        np.array([max((t.tokens for t in ep.turns), default=0) for ep in episodes]),
        termination,
    )
    group = np.arange(len(episodes)) // s.num_generations
    adv, group_std = advantages(totals, group, h.loss.advantage_estimator, h.loss.scale_rewards)
    keep = trainable(h, termination, group_std)
    metrics = trainer.update(episodes, torch.tensor(adv, dtype=torch.float32), keep.tolist())
    if pass_rates is not None and "correct" in terms[0]:
        for j, task in enumerate(picked):
            pass_rates[task.id] = float(
                np.mean([terms[j * s.num_generations + k]["correct"] for k in range(s.num_generations)])
            )
    audited = audit_sample(len(episodes), audit_fraction, ctx.seed, step)
    audits: list[bool | None] = [None] * len(episodes)
    for i in audited:
        audits[i] = bool(domain.audit(episodes[i].task, episodes[i].turns, episodes[i].info))
    n_tok = sum(ep.action_tokens for ep in episodes)
    metrics.update(
        {
            "reward": float(totals.mean()),
            "reward_std": float(totals.std(ddof=1)) if len(totals) > 1 else 0.0,
            "frac_reward_zero_std": float((group_std[:: s.num_generations] < ZERO_STD).mean()),
            "frac_trainable": float(keep.mean()),
            "completions/mean_length": n_tok / len(episodes),
            "completions/max_length": float(max(ep.action_tokens for ep in episodes)),
            "completions/clipped_ratio": sum(ep.termination == "length" for ep in episodes) / len(episodes),
            "entropy": sum(ep.entropy_sum for ep in episodes) / max(n_tok, 1),
            "num_turns/mean": sum(len(ep.turns) for ep in episodes) / len(episodes),
            "tool_errors/mean": sum(t.tool_error for ep in episodes for t in ep.turns) / len(episodes),
            "turn_cap_ratio": sum(ep.termination == "turn_cap" for ep in episodes) / len(episodes),
            "tokens_generated": float(n_tok),
            "gen_seconds": gen_seconds,
            "seconds": time.perf_counter() - t0,
        }
    )
    if audited:
        metrics["audit/pass_rate"] = float(np.mean([audits[i] for i in audited]))
    for name, weight in h.reward_weights.items():
        metrics[f"reward_weights/{name}"] = float(weight)  # which terms were paid, for the detectors
    for name in terms[0]:
        vals = np.array([t[name] for t in terms])
        metrics[f"rewards/{name}/mean"] = float(vals.mean())
        metrics[f"rewards/{name}/std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
    if store is not None:
        shard = f"{ctx.branch}-s{step:06d}"
        store.append(
            to_rollouts(
                episodes,
                terms,
                totals.tolist(),
                ctx=ctx,
                step=step,
                harness_version=h.version,
                group_size=s.num_generations,
                audits=audits,
            ),
            shard,
        )
        store.append_metrics(ctx.run, ctx.branch, step, metrics, shard)
    return metrics
