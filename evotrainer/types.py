"""The nouns of docs/design.md as plain dataclasses: tasks, turns, rollouts, and the termination reasons."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Split = Literal["train", "heldout"]

# Why a rollout ended. `stop`: the policy ended normally; `length`: the token cap cut an action;
# `turn_cap`: the multi-turn cap was reached; `tool_error`: a malformed action ended the episode;
# `timeout` / `error`: infrastructure (sandbox) failures, not the policy's fault.
Termination = Literal["stop", "length", "turn_cap", "tool_error", "timeout", "error"]
TERMINATIONS: tuple[str, ...] = ("stop", "length", "turn_cap", "tool_error", "timeout", "error")


@dataclass(frozen=True)
class Task:
    """One problem. `data` is hidden from the policy: the reward terms and the evaluator read it."""

    id: str
    split: Split
    prompt: str
    difficulty: int = 0
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass
class Turn:
    """One policy action and what the environment answered."""

    action: str
    tokens: int
    mean_logprob: float
    observation: str = ""
    tool_error: bool = False


@dataclass
class Rollout:
    """One recorded trajectory, with its rewards and, once audited, its audit outcome."""

    id: str
    run: str
    branch: str
    step: int
    harness_version: str
    task_id: str
    split: Split
    group_id: str
    prompt: str
    turns: list[Turn]
    termination: Termination
    rewards: dict[str, float]
    reward: float
    audit: bool | None = None
    difficulty: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    gen_seconds: float = 0.0
    env_seconds: float = 0.0

    @property
    def completion_tokens(self) -> int:
        return sum(t.tokens for t in self.turns)

    def to_record(self) -> dict[str, Any]:
        rec = asdict(self)
        rec["rewards"] = [{"term": k, "value": float(v)} for k, v in self.rewards.items()]
        rec["info"] = _json(self.info)
        rec["completion_tokens"] = self.completion_tokens
        rec["max_action_tokens"] = max((t.tokens for t in self.turns), default=0)
        rec["num_turns"] = len(self.turns)
        return rec


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


# -- the naming scheme of a run's branches and trials (the loop, the report and the tests use these) --------
_ROLE_SUFFIX = {"segment": "seg", "control": "ctl", "aa": "aa", "control_replicate": "ctlr"}


def branch_id(rnd: int, role: str, k: int = 0) -> str:
    """`base` (round 0), then per round: `r01-seg` (the mainline's segment), `r01-ctl` (the control: the
    harness carried on), `r01-c1`, `r01-c2`... (candidates), `r01-aa` (an A-A control), and the
    confirmation's `r01-c2r` (candidate 2 on fresh seeds) and `r01-ctlr` (the control on those seeds)."""
    if role == "base":
        return "base"
    if role in ("candidate", "replicate"):
        return f"r{rnd:02d}-c{k}" + ("r" if role == "replicate" else "")
    return f"r{rnd:02d}-" + _ROLE_SUFFIX[role]


def trial_id(rnd: int, k: int) -> str:
    """The trial of candidate k in round rnd (`r01-t1`)."""
    return f"r{rnd:02d}-t{k}"
