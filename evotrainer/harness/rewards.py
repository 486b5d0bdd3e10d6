"""Reward terms and the total reward under a harness: the weighted sum of the domain's terms."""
from __future__ import annotations

from typing import Any

from evotrainer.envs.env import Domain
from evotrainer.harness.harness import Harness
from evotrainer.types import Task, Termination, Turn


class HarnessError(ValueError):
    """A harness that does not fit the domain (for example a reward term the domain lacks)."""


def check_terms(harness: Harness, domain: Domain) -> None:
    unknown = sorted(set(harness.reward_weights) - set(domain.reward_terms))
    if unknown:
        raise HarnessError(f"harness.reward_weights: unknown term(s) {unknown} for domain {domain.name}; "
                           f"available: {sorted(domain.reward_terms)}")


def score(harness: Harness, domain: Domain, task: Task, turns: list[Turn], info: dict[str, Any],
          termination: Termination) -> tuple[dict[str, float], float]:
    """Every term the domain defines is computed and recorded (weight 0 terms too, so a later
    harness can be replayed on them); the total uses the harness's weights."""
    terms = {name: float(fn(task, turns, info)) for name, fn in domain.reward_terms.items()}
    total = sum(w * terms[name] for name, w in harness.reward_weights.items())
    if termination == "tool_error" and harness.multi_turn.tool_error in ("end", "mask"):
        total = 0.0
    return terms, float(total)
