"""The episode runner: steps a batch of multi-turn episodes in lockstep, one batched sampling call per
turn, keeping the exact sampled token ids (token in, token out) so training sees what was sampled."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from evotrainer.envs.env import Domain
from evotrainer.policies.hf import HFPolicy
from evotrainer.policies.policy import Sample
from evotrainer.types import Task, Termination, Turn


@dataclass
class Episode:
    task: Task
    token_ids: list[int]
    is_action: list[bool]
    sampled_logprobs: list[float]  # one per action token, in order
    turns: list[Turn] = field(default_factory=list)
    termination: Termination = "stop"
    info: dict[str, Any] = field(default_factory=dict)
    entropy_sum: float = 0.0
    gen_seconds: float = 0.0
    env_seconds: float = 0.0

    @property
    def action_tokens(self) -> int:
        return sum(self.is_action)


def _termination(s: Sample, err: bool, done: bool, info: dict, tool_error: str) -> str | None:
    """How a turn ends its episode (the cap cut the action, a tool error the harness ends on, the env said
    done), or None when the episode goes on."""
    if s.finish_reason == "length":
        return "length"
    if err and tool_error in ("end", "mask"):
        return "tool_error"
    if done:
        return info.get("termination", "stop")
    return None


def run_episodes(
    policy: HFPolicy,
    domain: Domain,
    tasks: list[Task],
    *,
    max_new_tokens: int,
    max_turns: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    tool_error: str = "feedback",
    max_observation_tokens: int = 0,
    generator: torch.Generator | None = None,
    fast: bool = False,
) -> list[Episode]:
    """tool_error: `feedback` continues after a malformed action; `end` and `mask` end the episode
    with termination `tool_error` (the reward stage zeroes or masks it). `fast`: training rollouts, sampled
    through the policy's low-precision copy where it has one (HFPolicy.sample)."""
    envs = [domain.make_env() for _ in tasks]
    episodes = []
    for task, env in zip(tasks, envs):
        t0 = time.perf_counter()
        ids = policy.encode_prompt(env.reset(task))
        episodes.append(Episode(task, ids, [False] * len(ids), [], env_seconds=time.perf_counter() - t0))
    active = list(range(len(tasks)))
    for _turn in range(max_turns):
        # An episode whose context cannot fit another full action ends as truncated.
        room = [i for i in active if len(episodes[i].token_ids) + max_new_tokens <= policy.max_positions]
        for i in set(active) - set(room):
            episodes[i].termination = "length"
        active = room
        if not active:
            break
        t0 = time.perf_counter()
        samples = policy.sample(
            [episodes[i].token_ids for i in active],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=domain.stop,
            greedy=greedy,
            generator=generator,
            fast=fast,
        )
        share = (time.perf_counter() - t0) / len(active)
        still = []
        for i, s in zip(active, samples):
            ep = episodes[i]
            ep.gen_seconds += share
            ep.token_ids += s.token_ids
            ep.is_action += [True] * len(s.token_ids)
            ep.sampled_logprobs += s.logprobs
            ep.entropy_sum += s.entropy_sum
            t0 = time.perf_counter()
            obs, done, info = envs[i].step(s.text)
            ep.env_seconds += time.perf_counter() - t0
            if s.finish_reason == "length":  # an audit may refuse an answer read from an action the cap cut
                info = {**info, "truncated": True}
            ep.info = info
            err = bool(info.get("tool_error"))
            mean_lp = sum(s.logprobs) / len(s.logprobs) if s.logprobs else 0.0
            ep.turns.append(
                Turn(action=s.text, tokens=len(s.token_ids), mean_logprob=mean_lp, observation=obs, tool_error=err)
            )
            if (end := _termination(s, err, done, info, tool_error)) is not None:
                ep.termination = end
                continue
            sampled_eos = bool(s.token_ids) and s.token_ids[-1] == policy.eos_id
            obs_ids = policy.wrap_observation(_cut(policy, policy.encode(obs), max_observation_tokens), sampled_eos)
            ep.token_ids += obs_ids
            ep.is_action += [False] * len(obs_ids)
            still.append(i)
        active = still
    for i in active:
        episodes[i].termination = "turn_cap"
    return episodes


def _cut(policy: HFPolicy, ids: list[int], limit: int) -> list[int]:
    """At most `limit` tokens of an observation (0: all): its head and its tail (where the environment's
    prompt is) around a marker, three quarters to one."""
    if not limit or len(ids) <= limit:
        return ids
    marker = policy.encode(" ... ")[: limit // 2]
    room = limit - len(marker)
    tail = room // 4
    return ids[: room - tail] + marker + (ids[len(ids) - tail :] if tail else [])
