"""The environment contract: a multi-turn Env (single-turn is the one-step case) and the Domain that
makes tasks, envs, reward terms, demonstrations and the evaluator-owned audit."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Protocol

from evotrainer.errors import AuditUnavailable
from evotrainer.types import Task, Turn

# A reward term: (task, turns, final info) -> float. Plain callables, looked up by name.
RewardFn = Callable[[Task, list[Turn], dict[str, Any]], float]

# A demonstration is the transcript as segments (text, is_action): actions are trained on,
# prompts and observations are not. The episode runner builds RL sequences with the same split.
Demonstration = list[tuple[str, bool]]


class Env(Protocol):
    """One episode's state. `step` returns (observation, done, info); info may carry
    `tool_error` (bool, a malformed action), `termination` (to override `stop`) and `answer`."""

    def reset(self, task: Task) -> str: ...

    def step(self, action: str) -> tuple[str, bool, dict[str, Any]]: ...


class Domain(Protocol):
    """A family of tasks with its envs. `stop` are the strings that end one action."""

    name: str
    stop: tuple[str, ...]
    reward_terms: dict[str, RewardFn]
    evaluator_settings: dict[str, Any]
    """The domain's settings that can change an audit outcome (its config, as built): part of the
    evaluator's identity (evaluation.py), so a changed scorer or observation cap is a changed evaluator."""
    evaluator_packages: tuple[str, ...]
    """Distributions whose version can change an audit outcome (a scorer, a test harness)."""
    demo_recipe: dict[str, Any]
    """What the demonstrations depend on beyond the config (a version, shares): part of the warm-start
    cache key, so a change to the demonstration code never reuses a stale base. {} for none."""

    def tasks(self, split: str) -> list[Task]: ...

    def make_env(self) -> Env: ...

    def demonstration(self, task: Task, rng: random.Random) -> Demonstration: ...

    def audit(self, task: Task, turns: list[Turn], info: dict[str, Any]) -> bool:
        """Evaluator-owned, stricter than any reward term, independent of the harness. Raises
        AuditUnavailable when the evaluator's own machinery failed (no verdict on the policy)."""
        ...


def solution_key(domain: Domain, task: Task, turns: list[Turn], info: dict[str, Any]) -> str:
    """What makes two rollouts the same solution, for counting distinct solutions in a group: the domain's
    `solution(task, turns, info)` where it defines one (SWE: the files it edited, as edited), else the
    completion with its whitespace collapsed and its case folded."""
    own = getattr(domain, "solution", None)
    if own is not None:
        return str(own(task, turns, info))
    return " ".join(" ".join(t.action for t in turns).split()).casefold()


AUDIT_TRIES = 2  # a sandbox worker lost once is replaced by the pool; twice in a row is not a blip


def audit_verdict(domain: Domain, task: Task, turns: list[Turn], info: dict[str, Any]) -> bool | None:
    """The domain's audit, tried again once if its machinery failed; None (no verdict, an infrastructure
    failure, noted on `info` as `audit_infra_error`) if it failed twice. Never a pass or fail the policy
    did not earn, and never a crash of the evaluation that asked."""
    for attempt in range(AUDIT_TRIES):
        try:
            return bool(domain.audit(task, turns, info))
        except AuditUnavailable as e:
            if attempt == AUDIT_TRIES - 1:
                info["audit_infra_error"] = str(e)[:300]
    return None


class EnvCheckError(AssertionError):
    pass


def check_env(domain: Domain, n: int = 8, seed: int = 0) -> None:
    """Check a domain the way Gymnasium's check_env does: seeded tasks are deterministic, splits are
    disjoint, ids unique, demonstrations are deterministic and replay through the env, reward terms
    return floats."""
    train, heldout = domain.tasks("train"), domain.tasks("heldout")
    if not train or not heldout:
        raise EnvCheckError(f"{domain.name}: both splits must have tasks")

    def key(t: Task) -> tuple[str, str]:
        return t.prompt, str(t.data.get("answer"))

    if {key(t) for t in train} & {key(t) for t in heldout}:
        raise EnvCheckError(f"{domain.name}: a held-out task (prompt and answer) also appears in train")
    if len({t.id for t in train + heldout}) != len(train) + len(heldout):
        raise EnvCheckError(f"{domain.name}: task ids are not unique")
    for task in train[:n]:
        demo = domain.demonstration(task, random.Random(seed))
        if demo != domain.demonstration(task, random.Random(seed)):
            raise EnvCheckError(f"{domain.name}: demonstration of {task.id} is not deterministic for a seed")
        first, turns, info = replay(domain, task, demo)
        if not demo or demo[0] != (first, False):
            raise EnvCheckError(f"{domain.name}: a demonstration must start with the env's first observation")
        for name, fn in domain.reward_terms.items():
            value = fn(task, turns, info)
            if not isinstance(value, float):
                raise EnvCheckError(f"{domain.name}: reward term {name} returned {type(value).__name__}, not float")


def replay(domain: Domain, task: Task, demo: Demonstration) -> tuple[str, list[Turn], dict[str, Any]]:
    """A demonstration's actions played through a fresh env: (first observation, turns, final info), the
    shape of a real rollout, on which reward terms can be called before any policy exists."""
    env = domain.make_env()
    first = env.reset(task)
    turns: list[Turn] = []
    info: dict[str, Any] = {}
    for text, is_action in demo[1:]:
        if not is_action:
            continue
        obs, done, info = env.step(text)
        turns.append(
            Turn(action=text, tokens=0, mean_logprob=0.0, observation=obs, tool_error=bool(info.get("tool_error")))
        )
        if done:
            break
    return first, turns, info
