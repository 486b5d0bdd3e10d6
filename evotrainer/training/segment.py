"""One RL step and a segment of steps: pick tasks, roll out groups, score under the harness, compute
advantages and masks, update the policy, record rollouts and step metrics in the store."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from evotrainer.envs.env import Domain
from evotrainer.envs.episodes import Episode, run_episodes
from evotrainer.harness.harness import Harness
from evotrainer.harness.rewards import score
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.grpo import ZERO_STD, GRPOTrainer, advantages
from evotrainer.types import Rollout, Task


@dataclass(frozen=True)
class StepContext:
    """Where a step's records belong. Seeds derive from (seed, step) only, never from the branch,
    so a candidate and its control see the same tasks in the same order with the same sampling noise."""

    run: str
    branch: str
    seed: int


def step_tasks(pool: list[Task], n: int, seed: int, step: int) -> list[Task]:
    rng = random.Random(seed * 1_000_003 + step)
    return rng.sample(pool, n) if n <= len(pool) else [rng.choice(pool) for _ in range(n)]


def to_rollouts(episodes: list[Episode], terms: list[dict[str, float]], totals: list[float], *, ctx: StepContext,
                step: int, harness_version: str, group_size: int, kind: str = "s",
                audits: list[bool | None] | None = None) -> list[Rollout]:
    out = []
    for i, (ep, t, r) in enumerate(zip(episodes, terms, totals)):
        out.append(Rollout(
            id=f"{ctx.branch}-{kind}{step:06d}-{i:04d}", run=ctx.run, branch=ctx.branch, step=step,
            harness_version=harness_version, task_id=ep.task.id, split=ep.task.split,
            group_id=f"{ctx.branch}-{kind}{step:06d}-g{i // group_size:03d}", prompt=ep.task.prompt, turns=ep.turns,
            termination=ep.termination, rewards=t, reward=r, audit=audits[i] if audits else None,
            difficulty=ep.task.difficulty, info=ep.info, gen_seconds=ep.gen_seconds, env_seconds=ep.env_seconds,
        ))
    return out


def train_step(trainer: GRPOTrainer, domain: Domain, pool: list[Task], ctx: StepContext, step: int,
               store: RolloutStore | None = None) -> dict[str, float]:
    h: Harness = trainer.harness
    s = h.sampling
    t0 = time.perf_counter()
    tasks = [t for t in step_tasks(pool, s.prompts_per_step, ctx.seed, step) for _ in range(s.num_generations)]
    gen = torch.Generator().manual_seed(ctx.seed * 7_919 + step)
    episodes = run_episodes(trainer.policy, domain, tasks, max_new_tokens=s.max_completion_length,
                            max_turns=h.multi_turn.max_turns, temperature=s.temperature, top_p=s.top_p,
                            tool_error=h.multi_turn.tool_error, generator=gen)
    gen_seconds = time.perf_counter() - t0
    scored = [score(h, domain, ep.task, ep.turns, ep.info, ep.termination) for ep in episodes]
    terms = [t for t, _ in scored]
    totals = torch.tensor([r for _, r in scored], dtype=torch.float32)
    adv, group_std = advantages(totals, s.num_generations, h.loss.scale_rewards)
    trainable = [not (h.loss.mask_truncated_completions and ep.termination == "length")
                 and not (h.multi_turn.tool_error == "mask" and ep.termination == "tool_error") for ep in episodes]
    metrics = trainer.update(episodes, adv, trainable)
    n_tok = sum(ep.action_tokens for ep in episodes)
    metrics.update({
        "reward": totals.mean().item(),
        "reward_std": totals.std().item() if len(totals) > 1 else 0.0,
        "frac_reward_zero_std": (group_std < ZERO_STD).float().mean().item(),
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
    })
    for name in domain.reward_terms:
        vals = torch.tensor([t[name] for t in terms])
        metrics[f"rewards/{name}/mean"] = vals.mean().item()
        metrics[f"rewards/{name}/std"] = vals.std().item() if len(vals) > 1 else 0.0
    if store is not None:
        shard = f"{ctx.branch}-s{step:06d}"
        store.append(to_rollouts(episodes, terms, totals.tolist(), ctx=ctx, step=step, harness_version=h.version,
                                 group_size=s.num_generations), shard)
        store.append_metrics(ctx.run, ctx.branch, step, metrics, shard)
    return metrics
