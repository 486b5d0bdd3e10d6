"""Reward terms and the total reward under a harness: the weighted terms plus shaping. The total is
computed by one vectorized function that training and the replay backtest share, so a replayed
harness scores rollouts exactly as training would have."""

from __future__ import annotations

from typing import Any

import numpy as np

from evotrainer.envs.env import Domain
from evotrainer.errors import HarnessError
from evotrainer.harness.harness import Harness
from evotrainer.types import Task, Turn


def check_terms(harness: Harness, domain: Domain) -> None:
    unknown = sorted(set(harness.reward_weights) - set(domain.reward_terms))
    if unknown:
        raise HarnessError(
            f"harness.reward_weights: unknown term(s) {unknown} for domain {domain.name}; "
            f"available: {sorted(domain.reward_terms)}"
        )


def term_values(domain: Domain, task: Task, turns: list[Turn], info: dict[str, Any]) -> dict[str, float]:
    """Every term the domain defines, weighted or not: stored on the rollout, so that a harness that
    reweights, adds or removes a term can be replayed on it later."""
    return {name: float(fn(task, turns, info)) for name, fn in domain.reward_terms.items()}


def total_reward(
    h: Harness,
    terms: dict[str, np.ndarray],
    completion_tokens: np.ndarray,
    max_action_tokens: np.ndarray,
    termination: np.ndarray,
) -> np.ndarray:
    """Weighted terms + overlong shaping + length penalty; zero for a tool error the harness ends."""
    n = len(completion_tokens)
    total = np.zeros(n, dtype=np.float64)
    for name, w in h.reward_weights.items():
        total += w * np.asarray(terms[name], dtype=np.float64)
    sh = h.shaping
    if sh.overlong_buffer_len:
        cap = h.sampling.max_completion_length
        start = cap - sh.overlong_buffer_len
        over = np.clip(max_action_tokens - start, 0, None) / sh.overlong_buffer_len
        total -= sh.overlong_penalty_factor * np.minimum(over, 1.0)
    if sh.length_penalty:
        total -= sh.length_penalty * completion_tokens
    if h.multi_turn.tool_error in ("end", "mask"):
        total = np.where(termination == "tool_error", 0.0, total)
    return total


def score(
    harness: Harness, domain: Domain, task: Task, turns: list[Turn], info: dict[str, Any], termination: str
) -> tuple[dict[str, float], float]:
    """One rollout's terms and total (the batch path is total_reward)."""
    terms = term_values(domain, task, turns, info)
    tokens = np.array([sum(t.tokens for t in turns)])
    longest = np.array([max((t.tokens for t in turns), default=0)])
    total = total_reward(
        harness, {k: np.array([v]) for k, v in terms.items()}, tokens, longest, np.array([termination])
    )
    return terms, float(total[0])
