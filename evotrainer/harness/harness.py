"""The harness: the declarative, versioned spec of everything training-side. The trainer reads all of
its behaviour from here; a version is the content hash of the canonical spec plus its parent."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, model_validator

from evotrainer.section import Section
from evotrainer.store.files import atomic_write_text
from evotrainer.types import Termination


class Sampling(Section):
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


class Loss(Section):
    """The policy-gradient objective (TRL GRPOConfig names)."""

    advantage_estimator: Literal["grpo", "rloo"] = "grpo"
    """Baseline of a rollout's reward: its group's mean (grpo) or the mean of the others (rloo)."""
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
    entropy_coef: float = Field(0.0, ge=0.0, le=1.0)
    """Weight of an entropy bonus: the loss loses entropy_coef * the mean per-token entropy of the
    trained tokens (TRL's entropy_coef: the same meaning for every loss_type)."""
    tis_cap: float | None = Field(None, ge=1.0, le=100.0)
    """Truncated importance sampling (TIS) against the sampler/trainer mismatch: each action token's loss is
    weighted by min(p_train / p_sample, tis_cap), p_train its probability under the update's forward and p_sample
    under the sampler's. The two differ when they compute differently (bfloat16 weights, another engine); the
    step metric sampling/sampling_logp_difference/mean says by how much. None: no correction."""


class Optimizer(Section):
    """AdamW on the policy."""

    learning_rate: float = Field(3e-4, ge=0.0, le=1.0)
    """Peak learning rate (the schedule below scales it by global step). 0: the policy does not move."""
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    """Decoupled weight decay."""
    max_grad_norm: float = Field(1.0, gt=0.0)
    """Gradients are clipped to this global norm."""
    warmup_steps: int = Field(0, ge=0, le=1_000_000)
    """Linear learning-rate warm-up over the run's first N global steps (0: none)."""
    lr_decay: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate decay after the warm-up, reaching min_lr_ratio * learning_rate at decay_steps."""
    decay_steps: int = Field(0, ge=0, le=1_000_000)
    """Global step at which the decay reaches its floor (0: no decay, whatever lr_decay says)."""
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    """Floor of the decay, as a share of learning_rate."""


class Shaping(Section):
    """Reward shaping added to the weighted terms."""

    overlong_buffer_len: int = Field(0, ge=0)
    """DAPO soft overlong punishment: actions longer than max_completion_length - buffer lose up to
    overlong_penalty_factor, linearly; 0 turns it off."""
    overlong_penalty_factor: float = Field(1.0, ge=0.0, le=10.0)
    """Penalty at the token cap (DAPO's overlong_buffer.penalty_factor)."""
    length_penalty: float = Field(0.0, ge=0.0, le=1.0)
    """Subtracted per completion token."""


class Filters(Section):
    """Which rollouts the loss sees."""

    zero_std_threshold: float | None = Field(None, ge=0.0)
    """Groups whose reward std is below this are left out of the loss (their rollouts still count in
    metrics); None keeps them. A threshold, not an exact 0, so float noise does not hide dead groups."""
    mask_terminations: tuple[Termination, ...] = ()
    """Rollouts that ended for these reasons are masked out of the loss (e.g. infrastructure errors)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: groups whose rewards are all equal are dropped and more prompts are drawn,
    so a step keeps prompts_per_step informative groups (up to max_sampling_rounds draws; the extra
    samples are charged)."""
    max_sampling_rounds: int = Field(3, ge=1, le=32)
    """Draws of prompts_per_step prompts at most, per step, under dynamic sampling."""
    std_keep_ratio: float | None = Field(None, gt=0.0, le=1.0)
    """Group filter on reward std with an EMA threshold (the paper's SWE run: 0.9): each step the threshold moves
    toward the std under which the lowest (1 - std_keep_ratio) of the step's groups fall, and groups below it (or
    below 1e-6) leave the loss. The threshold starts afresh with each segment. None: off."""
    std_ema_decay: float = Field(0.95, ge=0.0, lt=1.0)
    """Weight of the previous threshold in that EMA (the paper's run: 0.95; 0: each step's own quantile)."""


class Curriculum(Section):
    """Which train tasks are drawn."""

    levels: tuple[int, ...] | None = None
    """Difficulty levels drawn from; None draws every level."""
    easy_threshold: float | None = None
    """A task whose last group's mean `correct` reached this is not drawn again (None: never skipped)."""
    hard_threshold: float | None = None
    """A task whose last group's mean `correct` was at most this is not drawn again (None: never skipped)."""


class MultiTurn(Section):
    """What happens across turns."""

    max_turns: int = Field(1, ge=1, le=256)
    """Turn cap; an episode still running at the cap ends with termination `turn_cap`."""
    tool_error: Literal["feedback", "end", "mask"] = "feedback"
    """A malformed action: feed the error back and continue, end the episode with zero reward, or end
    it and mask the rollout out of the loss."""
    max_observation_tokens: int = Field(0, ge=0, le=1_000_000)
    """Tokens of one observation the policy sees in training (0: all of it). A longer one keeps its first
    three quarters and last quarter of this many tokens (the end holds the environment's prompt) around a
    marker: long raw observations fill the context before the episode can finish."""


class Harness(Section):
    """Everything training-side. Fields are the knobs the proposer may change, one at a time."""

    reward_weights: dict[str, float] = Field(default_factory=lambda: {"correct": 1.0, "format": 0.1})
    """Reward terms by name and their weights; the total reward is the weighted sum."""
    sampling: Sampling = Sampling()
    loss: Loss = Loss()
    shaping: Shaping = Shaping()
    filters: Filters = Filters()
    curriculum: Curriculum = Curriculum()
    optimizer: Optimizer = Optimizer()
    multi_turn: MultiTurn = MultiTurn()
    suite_version: str | None = None
    """Version of the diagnostic suite that reads this harness's rollouts (None: the built-in suite)."""
    parent: str | None = None
    """Version of the harness this one was derived from (None for a root)."""

    @model_validator(mode="after")
    def _check(self) -> Harness:
        if not self.reward_weights:
            raise ValueError("reward_weights must name at least one reward term")
        o = self.optimizer
        if o.lr_decay != "constant" and o.decay_steps and o.decay_steps <= o.warmup_steps:
            raise ValueError(
                f"optimizer.decay_steps={o.decay_steps} must be above optimizer.warmup_steps={o.warmup_steps}"
            )
        if self.shaping.overlong_buffer_len >= self.sampling.max_completion_length:
            # verl PR #2107: a buffer as long as the cap penalizes every response.
            raise ValueError(
                f"shaping.overlong_buffer_len={self.shaping.overlong_buffer_len} must be below "
                f"sampling.max_completion_length={self.sampling.max_completion_length}"
            )
        return self

    def canonical(self) -> str:
        """The spec as canonical JSON: sorted keys, parent excluded (the version adds it). Knobs added
        after the first release enter it only when set, so every earlier harness keeps its version."""
        spec = self.model_dump(mode="json", exclude={"parent"})
        for section, knobs in _ADDED_KNOBS.items():
            for name in knobs:
                if spec[section][name] == _DEFAULTS[section][name]:
                    del spec[section][name]
        return json.dumps(spec, sort_keys=True, separators=(",", ":"))

    @property
    def version(self) -> str:
        """Content hash of the canonical spec plus the parent's version."""
        h = hashlib.sha256((self.canonical() + "|" + (self.parent or "")).encode()).hexdigest()
        return "h-" + h[:12]


# Knobs added after the first release, by section: out of the canonical spec while at their defaults.
_ADDED_KNOBS: dict[str, tuple[str, ...]] = {
    "loss": ("entropy_coef", "tis_cap"),
    "optimizer": ("warmup_steps", "lr_decay", "decay_steps", "min_lr_ratio"),
    "filters": ("dynamic_sampling", "max_sampling_rounds", "std_keep_ratio", "std_ema_decay"),
    "multi_turn": ("max_observation_tokens",),
}
_DEFAULTS = Harness().model_dump(mode="json")


def save_harness(run_dir: str | Path, harness: Harness) -> Path:
    """Every harness version a run trains under is kept by version: `evotrainer harness show|diff` reads them."""
    d = Path(run_dir) / "harness"
    d.mkdir(exist_ok=True)
    path = d / f"{harness.version}.yaml"
    if not path.exists():
        atomic_write_text(path, yaml.safe_dump(harness.model_dump(mode="json"), sort_keys=False))
    return path
