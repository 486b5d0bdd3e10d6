"""The knob registry: every harness field with its type, range, default, meaning (read from the
field's docstring), its names in TRL / verl / OpenRLHF, and whether a replay can evaluate a change."""

from __future__ import annotations

import functools
import typing
from dataclasses import asdict, dataclass
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel

from evotrainer.harness.harness import Harness

# Names in other trainers (rl-trainers.md, table a). A dash: no direct equivalent there.
# TRL = GRPOConfig; verl = its Hydra keys; OpenRLHF = train_ppo_ray flags.
MAPPINGS: dict[str, tuple[str, str, str]] = {
    "reward_weights.*": (
        "reward_weights",
        "custom_reward_function (weights in the function)",
        "--remote_rm_url (weights in reward_func)",
    ),
    "sampling.num_generations": ("num_generations", "actor_rollout_ref.rollout.n", "--n_samples_per_prompt"),
    "sampling.prompts_per_step": (
        "per_device_train_batch_size / num_generations",
        "data.train_batch_size",
        "--rollout_batch_size",
    ),
    "sampling.temperature": ("temperature", "actor_rollout_ref.rollout.temperature", "--temperature"),
    "sampling.top_p": ("top_p", "actor_rollout_ref.rollout.top_p", "--top_p"),
    "sampling.max_completion_length": ("max_completion_length", "data.max_response_length", "--generate_max_len"),
    "loss.advantage_estimator": (
        "GRPOTrainer (grpo) / RLOOTrainer (rloo)",
        "algorithm.adv_estimator",
        "--advantage_estimator (group_norm / rloo)",
    ),
    "loss.loss_type": (
        "loss_type",
        "actor_rollout_ref.actor.loss_agg_mode (token-mean = dapo, seq-mean-token-mean = grpo, "
        "seq-mean-token-sum-norm = dr_grpo)",
        "-",
    ),
    "loss.scale_rewards": ("scale_rewards", "algorithm.norm_adv_by_std_in_grpo", "--no_advantage_std_norm"),
    "loss.epsilon": ("epsilon", "actor_rollout_ref.actor.clip_ratio_low", "--eps_clip"),
    "loss.epsilon_high": ("epsilon_high", "actor_rollout_ref.actor.clip_ratio_high", "--eps_clip_low_high"),
    "loss.beta": (
        "beta",
        "actor_rollout_ref.actor.kl_loss_coef (with use_kl_loss)",
        "--init_kl_coef (with --use_kl_loss)",
    ),
    "loss.num_iterations": ("num_iterations", "actor_rollout_ref.actor.ppo_epochs", "--max_epochs"),
    "loss.mask_truncated_completions": ("mask_truncated_completions", "-", "-"),
    "shaping.overlong_buffer_len": (
        "trl.rewards.get_soft_overlong_punishment(soft_punish_cache)",
        "reward_model.overlong_buffer.len",
        "--overlong_buffer_len",
    ),
    "shaping.overlong_penalty_factor": (
        "-",
        "reward_model.overlong_buffer.penalty_factor",
        "--overlong_penalty_factor",
    ),
    "shaping.length_penalty": ("-", "-", "-"),
    "filters.zero_std_threshold": ("-", "algorithm.filter_groups.enable", "--dynamic_filtering"),
    "filters.mask_terminations": ("-", "-", "-"),
    "curriculum.levels": ("-", "data.custom_cls (a sampler)", "--prompt_data_probs"),
    "curriculum.easy_threshold": ("-", "-", "-"),
    "curriculum.hard_threshold": ("-", "-", "-"),
    "optimizer.learning_rate": ("learning_rate", "actor_rollout_ref.actor.optim.lr", "--actor_learning_rate"),
    "optimizer.weight_decay": ("weight_decay", "actor_rollout_ref.actor.optim.weight_decay", "--l2"),
    "optimizer.max_grad_norm": ("max_grad_norm", "actor_rollout_ref.actor.grad_clip", "--max_norm"),
    "multi_turn.max_turns": (
        "max_tool_calling_iterations",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
        "-",
    ),
    "multi_turn.tool_error": ("-", "-", "-"),
    "suite_version": ("-", "-", "-"),
}

# A replay recomputes rewards, masks and advantages of stored rollouts; these knobs only change that
# arithmetic. Every other knob changes what is sampled or how the weights move: it needs a trial.
REPLAYABLE_PREFIXES = (
    "reward_weights.",
    "shaping.",
    "filters.",
    "loss.advantage_estimator",
    "loss.scale_rewards",
    "loss.mask_truncated_completions",
)


@dataclass(frozen=True)
class Knob:
    path: str
    type: str
    default: Any
    low: float | None
    high: float | None
    choices: tuple[Any, ...] | None
    meaning: str
    trl: str
    verl: str
    openrlhf: str
    replayable: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_replayable(path: str) -> bool:
    return path.startswith(REPLAYABLE_PREFIXES)


def _bounds(field) -> tuple[float | None, float | None]:
    low = high = None
    for m in field.metadata:
        if isinstance(m, (Ge, Gt)):
            low = float(getattr(m, "ge", getattr(m, "gt", None)))
        if isinstance(m, (Le, Lt)):
            high = float(getattr(m, "le", getattr(m, "lt", None)))
    return low, high


def _choices(annotation) -> tuple[Any, ...] | None:
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is typing.Literal:
            return typing.get_args(arg)
        inner = _choices(arg)
        if inner:
            return inner
    return None


def _type_name(annotation) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


@functools.cache
def registry() -> tuple[Knob, ...]:
    """All knobs, in the harness's field order (built once: the harness schema does not change)."""
    out: list[Knob] = []
    defaults = Harness()
    for name, field in Harness.model_fields.items():
        if name == "parent":
            continue
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            section = getattr(defaults, name)
            for sub, f in ann.model_fields.items():
                out.append(_knob(f"{name}.{sub}", f, getattr(section, sub)))
        elif name == "reward_weights":
            out.append(
                Knob(
                    "reward_weights.*",
                    "float",
                    None,
                    None,
                    None,
                    None,
                    "Weight of one reward term (any term the domain defines); absent terms weigh 0.",
                    *MAPPINGS["reward_weights.*"],
                    True,
                )
            )
        else:
            out.append(_knob(name, field, getattr(defaults, name)))
    return tuple(out)


def _knob(path: str, field, default: Any) -> Knob:
    low, high = _bounds(field)
    trl, verl, orl = MAPPINGS.get(path, ("-", "-", "-"))
    choices = _choices(field.annotation)
    return Knob(
        path,
        "choice" if choices and "tuple" not in str(field.annotation) else _type_name(field.annotation),
        default,
        low,
        high,
        choices,
        " ".join((field.description or "").split()),
        trl,
        verl,
        orl,
        is_replayable(path),
    )


def knob(path: str) -> Knob:
    """The registry entry of a dotted path (reward_weights.TERM resolves to reward_weights.*)."""
    key = "reward_weights.*" if path.startswith("reward_weights.") else path
    for k in registry():
        if k.path == key:
            return k
    raise KeyError(f"unknown knob {path!r}; `evotrainer knobs` lists them all")
