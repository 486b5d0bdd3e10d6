"""One RL step and a segment of steps: pick tasks, roll out groups, score under the harness, compute
advantages and masks, update the policy, record rollouts and step metrics in the store."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np
import torch

from evotrainer.envs.env import Domain, audit_verdict, solution_key
from evotrainer.harness.filters import std_cuts, trainable
from evotrainer.harness.harness import Curriculum, Harness
from evotrainer.harness.rewards import term_values, total_reward
from evotrainer.ids import TRAIN, group_id, rollout_id, shard_id
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
    kind: str = TRAIN,
    audits: list[bool | None] | None = None,
) -> list[Rollout]:
    out = []
    for i, (ep, t, r) in enumerate(zip(episodes, terms, totals)):
        out.append(
            Rollout(
                id=rollout_id(ctx.branch, step, i, kind),
                run=ctx.run,
                branch=ctx.branch,
                step=step,
                harness_version=harness_version,
                task_id=ep.task.id,
                split=ep.task.split,
                group_id=group_id(ctx.branch, step, i // group_size, kind),
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


@dataclass
class Batch:
    """One step's sampled groups, scored under the harness: every episode drawn (under dynamic sampling,
    dropped groups too: they are stored as evidence) and which of them the update trains on."""

    picked: list[Task]
    episodes: list[Episode]
    terms: list[dict[str, float]]
    totals: np.ndarray
    group_std: np.ndarray
    trained: np.ndarray  # bool per episode: in the update's batch (dynamic sampling drops whole groups)
    rounds: int = 1


def sample_batch(
    trainer: GRPOTrainer,
    domain: Domain,
    pool: list[Task],
    ctx: StepContext,
    step: int,
    pass_rates: dict[str, float] | None,
) -> Batch:
    """Draw prompts_per_step prompts and roll out their groups; under dynamic sampling, draw again
    (another seeded stream per round) until prompts_per_step groups whose rewards are not all equal are
    in hand, or max_sampling_rounds draws were made (DAPO)."""
    h, s = trainer.harness, trainer.harness.sampling
    rounds = h.filters.max_sampling_rounds if h.filters.dynamic_sampling else 1
    parts: list[Batch] = []
    informative = 0
    for r in range(rounds):
        part = _draw(trainer, domain, pool, ctx, step, pass_rates, r)
        parts.append(part)
        informative += int((part.group_std[:: s.num_generations] >= ZERO_STD).sum())
        if informative >= s.prompts_per_step:
            break
    batch = Batch(
        [t for p in parts for t in p.picked],
        [e for p in parts for e in p.episodes],
        [t for p in parts for t in p.terms],
        np.concatenate([p.totals for p in parts]),
        np.concatenate([p.group_std for p in parts]),
        np.ones(sum(len(p.episodes) for p in parts), bool),
        len(parts),
    )
    if h.filters.dynamic_sampling:
        live = batch.group_std >= ZERO_STD
        # The first prompts_per_step informative groups train; all-equal groups and the surplus do not.
        group_rank = np.cumsum(live[:: s.num_generations]) * live[:: s.num_generations]
        batch.trained = np.repeat((group_rank > 0) & (group_rank <= s.prompts_per_step), s.num_generations)
    return batch


def _draw(
    trainer: GRPOTrainer,
    domain: Domain,
    pool: list[Task],
    ctx: StepContext,
    step: int,
    pass_rates: dict[str, float] | None,
    r: int,
) -> Batch:
    """One draw of prompts_per_step prompts with num_generations rollouts each, scored. Draw 0 is seeded
    by (seed, step) exactly as a step without dynamic sampling is; later draws by (seed, step, draw)."""
    h, s = trainer.harness, trainer.harness.sampling
    seed = ctx.seed if r == 0 else ctx.seed * 101 + r
    picked = step_tasks(pool, s.prompts_per_step, seed, step, h.curriculum, pass_rates)
    tasks = [t for t in picked for _ in range(s.num_generations)]
    gen = torch.Generator().manual_seed(seed * 7_919 + step)
    episodes = run_episodes(
        trainer.policy,
        domain,
        tasks,
        max_new_tokens=s.max_completion_length,
        max_turns=h.multi_turn.max_turns,
        temperature=s.temperature,
        top_p=s.top_p,
        tool_error=h.multi_turn.tool_error,
        max_observation_tokens=h.multi_turn.max_observation_tokens,
        generator=gen,
        fast=True,
    )
    return score_batch(h, domain, picked, episodes)


def score_batch(h: Harness, domain: Domain, picked: list[Task], episodes: list[Episode]) -> Batch:
    """Episodes of consecutive groups of num_generations, scored under the harness: every term, the total,
    each rollout's group std (the TRL backend scores its completions with this too)."""
    terms = [term_values(domain, ep.task, ep.turns, ep.info) for ep in episodes]
    totals = total_reward(
        h,
        {k: np.array([t[k] for t in terms]) for k in terms[0]},
        np.array([ep.action_tokens for ep in episodes]),
        np.array([max((t.tokens for t in ep.turns), default=0) for ep in episodes]),
        np.array([ep.termination for ep in episodes]),
    )
    group = np.arange(len(episodes)) // h.sampling.num_generations
    _, group_std = advantages(totals, group, h.loss.advantage_estimator, h.loss.scale_rewards)
    return Batch(picked, episodes, terms, totals, group_std, np.ones(len(episodes), bool))


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
    trainer.set_step(step)
    b = sample_batch(trainer, domain, pool, ctx, step, pass_rates)
    gen_seconds = time.perf_counter() - t0
    idx = np.flatnonzero(b.trained)
    sub = [b.episodes[i] for i in idx]
    termination = np.array([ep.termination for ep in sub])
    group = np.arange(len(sub)) // s.num_generations
    adv, group_std = advantages(b.totals[idx], group, h.loss.advantage_estimator, h.loss.scale_rewards)
    cut, trainer.std_ema = std_cuts(h, group_std, group, np.zeros(len(sub), np.int64), trainer.std_ema)
    keep = trainable(h, termination, group_std, cut)
    metrics = trainer.update(sub, torch.tensor(adv, dtype=torch.float32), keep.tolist())
    if trainer.std_ema is not None:
        metrics["filters/std_threshold"] = trainer.std_ema
    if pass_rates is not None and "correct" in b.terms[0]:
        for j, task in enumerate(b.picked):
            pass_rates[task.id] = float(
                np.mean([b.terms[j * s.num_generations + k]["correct"] for k in range(s.num_generations)])
            )
    audited = audit_sample(len(b.episodes), audit_fraction, ctx.seed, step)
    audits: list[bool | None] = [None] * len(b.episodes)
    for i in audited:
        audits[i] = audit_verdict(domain, b.episodes[i].task, b.episodes[i].turns, b.episodes[i].info)
    metrics.update(step_metrics(h, b, keep, audits, audited, domain))
    metrics.update({"gen_seconds": gen_seconds, "seconds": time.perf_counter() - t0})
    if store is not None:
        record_step(store, ctx, step, h, b, audits, metrics)
    return metrics


def record_step(
    store: RolloutStore,
    ctx: StepContext,
    step: int,
    h: Harness,
    b: Batch,
    audits: list[bool | None],
    metrics: dict[str, float],
) -> None:
    """A step's rollouts and metrics, in one shard named by branch and step (either backend)."""
    shard = shard_id(ctx.branch, step)
    rollouts = to_rollouts(
        b.episodes,
        b.terms,
        b.totals.tolist(),
        ctx=ctx,
        step=step,
        harness_version=h.version,
        group_size=h.sampling.num_generations,
        audits=audits,
    )
    store.append(rollouts, shard)
    store.append_metrics(ctx.run, ctx.branch, step, metrics, shard)


def step_metrics(
    h: Harness,
    b: Batch,
    keep: np.ndarray,
    audits: list[bool | None],
    audited: list[int],
    domain: Domain,
) -> dict[str, float]:
    """The step's metrics under TRL's names, over every episode drawn (a dropped group is still seen)."""
    episodes, n = b.episodes, len(b.episodes)
    n_tok = sum(ep.action_tokens for ep in episodes)
    m = {
        **diversity_metrics(episodes, h.sampling.num_generations, domain),
        "reward": float(b.totals.mean()),
        "reward_std": float(b.totals.std(ddof=1)) if n > 1 else 0.0,
        "frac_reward_zero_std": float((b.group_std[:: h.sampling.num_generations] < ZERO_STD).mean()),
        "frac_trainable": float(keep.sum() / n),
        "sampling_rounds": float(b.rounds),
        "completions/mean_length": n_tok / n,
        "completions/max_length": float(max(ep.action_tokens for ep in episodes)),
        "completions/clipped_ratio": sum(ep.termination == "length" for ep in episodes) / n,
        "entropy": sum(ep.entropy_sum for ep in episodes) / max(n_tok, 1),
        "num_turns/mean": sum(len(ep.turns) for ep in episodes) / n,
        "tool_errors/mean": sum(t.tool_error for ep in episodes for t in ep.turns) / n,
        "turn_cap_ratio": sum(ep.termination == "turn_cap" for ep in episodes) / n,
        "tokens_generated": float(n_tok),
    }
    verdicts = [audits[i] for i in audited if audits[i] is not None]  # None: the audit's sandbox failed
    if verdicts:
        m["audit/pass_rate"] = float(np.mean(verdicts))
    if len(verdicts) < len(audited):
        m["audit/infra_failures"] = float(len(audited) - len(verdicts))
    for name, weight in h.reward_weights.items():
        m[f"reward_weights/{name}"] = float(weight)  # which terms were paid, for the detectors
    for name in b.terms[0]:
        vals = np.array([t[name] for t in b.terms])
        m[f"rewards/{name}/mean"] = float(vals.mean())
        m[f"rewards/{name}/std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
    return m


def diversity_metrics(episodes: list[Episode], size: int, domain: Domain) -> dict[str, float]:
    """Collapse and diversity: distinct solutions per group as a share of the group (env.solution_key; 1 when
    every rollout differs, 1/size when all are the same), and the mean log-probability of the sampled tokens
    (near 0: the policy samples what it is sure of). Either falling while the outcome stays low is collapse."""
    groups = [episodes[i : i + size] for i in range(0, len(episodes), size)]
    keys = [{solution_key(domain, ep.task, ep.turns, ep.info) for ep in g} for g in groups]
    n_tok = sum(len(ep.sampled_logprobs) for ep in episodes)
    return {
        "completions/distinct_per_group": float(np.mean([len(k) / len(g) for k, g in zip(keys, groups, strict=True)])),
        "completions/mean_logprob": sum(sum(ep.sampled_logprobs) for ep in episodes) / max(n_tok, 1),
    }
