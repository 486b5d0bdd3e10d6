"""The harness: the declarative, versioned spec of everything training-side. The trainer reads all of
its behaviour from here; a version is the content hash of the canonical spec plus its parent."""
from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sampling(_Section):
    """How rollouts are drawn (TRL GRPOConfig names)."""

    num_generations: int = Field(8, ge=1, le=256)
    """Completions per prompt: the group size of GRPO."""
    prompts_per_step: int = Field(32, ge=1, le=4096)
    """Distinct prompts sampled per optimizer step; a step trains prompts_per_step * num_generations rollouts."""
    temperature: float = Field(1.0, gt=0.0, le=5.0)
    """Sampling temperature; logprobs for the loss are taken at the same temperature."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    max_completion_length: int = Field(16, ge=1, le=32768)
    """Token cap of one action (one turn); an action that hits it ends with termination `length`."""


class Loss(_Section):
    """The policy-gradient objective (TRL GRPOConfig names)."""

    loss_type: Literal["grpo", "dr_grpo", "dapo"] = "dapo"
    """Aggregation: grpo = mean over sequences of the token mean; dapo = mean over all tokens of the
    batch; dr_grpo = token sum divided by (sequences * max_completion_length)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Divide advantages by the group's reward std, the batch's, or not at all (Dr. GRPO)."""
    epsilon: float = Field(0.2, gt=0.0, le=1.0)
    """Lower clip range of the importance ratio."""
    epsilon_high: float | None = Field(None, gt=0.0, le=1.0)
    """Upper clip range (DAPO clip-higher); None means equal to epsilon."""
    beta: float = Field(0.0, ge=0.0, le=10.0)
    """Weight of the k3 KL penalty to the frozen reference policy; 0 loads no reference."""
    num_iterations: int = Field(1, ge=1, le=16)
    """Optimizer passes over each sampled batch (PPO epochs, mu)."""
    mask_truncated_completions: bool = False
    """Exclude rollouts that ended with termination `length` from the loss."""


class Optimizer(_Section):
    """AdamW on the policy."""

    learning_rate: float = Field(3e-4, ge=0.0, le=1.0)
    """Constant learning rate. 0 makes an A-A control (the policy does not move)."""
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    """Decoupled weight decay."""
    max_grad_norm: float = Field(1.0, gt=0.0)
    """Gradients are clipped to this global norm."""


class MultiTurn(_Section):
    """What happens across turns."""

    max_turns: int = Field(1, ge=1, le=256)
    """Turn cap; an episode still running at the cap ends with termination `turn_cap`."""
    tool_error: Literal["feedback", "end", "mask"] = "feedback"
    """A malformed action: feed the error back and continue, end the episode with zero reward, or end
    it and mask the rollout out of the loss."""


class Harness(_Section):
    """Everything training-side. Fields are the knobs the proposer may change, one at a time."""

    reward_weights: dict[str, float] = Field(default_factory=lambda: {"correct": 1.0, "format": 0.1})
    """Reward terms by name and their weights; the total reward is the weighted sum."""
    sampling: Sampling = Sampling()
    loss: Loss = Loss()
    optimizer: Optimizer = Optimizer()
    multi_turn: MultiTurn = MultiTurn()
    parent: str | None = None
    """Version of the harness this one was derived from (None for a root)."""

    @model_validator(mode="after")
    def _check_rewards(self) -> "Harness":
        if not self.reward_weights:
            raise ValueError("reward_weights must name at least one reward term")
        return self

    def canonical(self) -> str:
        """The spec as canonical JSON: sorted keys, parent excluded (the version adds it)."""
        return json.dumps(self.model_dump(mode="json", exclude={"parent"}), sort_keys=True, separators=(",", ":"))

    @property
    def version(self) -> str:
        """Content hash of the canonical spec plus the parent's version."""
        h = hashlib.sha256((self.canonical() + "|" + (self.parent or "")).encode()).hexdigest()
        return "h-" + h[:12]
