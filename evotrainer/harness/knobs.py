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

TARGETS = ("trl", "verl", "openrlhf")
TITLES = {"trl": "TRL", "verl": "verl", "openrlhf": "OpenRLHF"}


@dataclass(frozen=True)
class Name:
    """A knob's setting in one target trainer. `key` "-": the target has no equivalent, and honours the
    knob only at a value in `builtin` (what it does without one); a backend for it refuses any other."""

    key: str
    note: str = ""
    """How a value translates, or why there is no equivalent."""
    also: tuple[str, ...] = ()
    """Further keys `evotrainer harness export` sets with this one."""
    builtin: tuple[Any, ...] = ()
    """Values the target behaves as without any key."""
    only: tuple[Any, ...] = ()
    """The values `key` can express (empty: all)."""


# Each knob's names in TRL, verl and OpenRLHF; `evotrainer harness export` writes these keys. Read from
# the sources, not from memory (knob names change between releases):
# - TRL 1.16.0 (installed): trl/trainer/grpo_config.py (GRPOConfig) and the transformers 5.23
#   TrainingArguments it extends (learning_rate, weight_decay, max_grad_norm, warmup_steps,
#   lr_scheduler_type, lr_scheduler_kwargs, per_device_train_batch_size, gradient_accumulation_steps).
# - verl 0.10.0.dev, github.com/verl-project/verl at 1dda039b (2026-08-22): every key checked against
#   verl/trainer/config/_generated_ppo_trainer.yaml, except reward.reward_kwargs.* (a `+` override read by
#   verl/experimental/reward_loop/reward_manager/dapo.py; reward_loop.py migrates the old
#   reward_model.reward_kwargs there). Filter groups: verl/trainer/ppo/v1/trainer_base.py and
#   replay_buffer.py; estimators, loss aggregation and KL: verl/trainer/ppo/core_algos.py; the schedule:
#   verl/workers/engine/fsdp/transformer_impl.py. Older verl read the overlong buffer elsewhere:
#   reward_model.reward_kwargs.overlong_buffer_cfg (volcengine/verl b178a3cd, 0.8.0.dev), and the DAPO
#   recipe's own config reward_model.overlong_buffer.* (verl-recipe 21892b92).
# - OpenRLHF 0.11.0, github.com/OpenRLHF/OpenRLHF at 3c3be623 (tag v0.11.0): the dotted flags of
#   openrlhf/cli/train_ppo_ray.py (dotted since v0.10.2, commit ed62d0e2); estimators:
#   trainer/ppo_utils/experience_maker.py; dynamic filtering: ppo_utils/samples_generator.py; the
#   scheduler: utils/deepspeed/deepspeed.py.
_TOTAL = "the response across all turns"
_NO_STD = "no batch scaling of the group baseline"
MAPPINGS: dict[str, tuple[Name, Name, Name]] = {
    "reward_weights.*": (
        Name("reward_weights", "a list, in the order of GRPOTrainer's reward_funcs"),
        Name("-", "no per-term weights: reward.custom_reward_function must return the weighted sum"),
        Name("-", "no per-term weights: the --reward.remote_url function must return the weighted sum"),
    ),
    "sampling.num_generations": (
        Name("num_generations", "at least 2"),
        Name("actor_rollout_ref.rollout.n"),
        Name("--rollout.n_samples_per_prompt"),
    ),
    "sampling.prompts_per_step": (
        Name(
            "generation_batch_size",
            "= prompts_per_step * num_generations, one optimizer step per batch",
            also=("per_device_train_batch_size", "gradient_accumulation_steps"),
        ),
        Name(
            "data.train_batch_size",
            "with ppo_mini_batch_size equal: one optimizer step per batch and epoch",
            also=("actor_rollout_ref.actor.ppo_mini_batch_size",),
        ),
        Name(
            "--rollout.batch_size",
            "with --train.batch_size = prompts_per_step * num_generations: one optimizer step per batch and epoch",
            also=("--train.batch_size",),
        ),
    ),
    "sampling.temperature": (
        Name("temperature"),
        Name("actor_rollout_ref.rollout.temperature"),
        Name("--rollout.temperature"),
    ),
    "sampling.top_p": (Name("top_p"), Name("actor_rollout_ref.rollout.top_p"), Name("--rollout.top_p")),
    "sampling.max_completion_length": (
        Name("max_completion_length", f"caps {_TOTAL}"),
        Name("data.max_response_length", f"caps {_TOTAL}"),
        Name("--rollout.max_new_tokens", f"caps {_TOTAL}"),
    ),
    "loss.advantage_estimator": (
        Name("-", "grpo is GRPOTrainer's own baseline; rloo needs RLOOTrainer", builtin=("grpo",)),
        Name("algorithm.adv_estimator"),
        Name("--algo.advantage.estimator", "grpo: group_norm (group std) or dr_grpo (none); rloo: rloo"),
    ),
    "loss.loss_type": (
        Name("loss_type"),
        Name(
            "actor_rollout_ref.actor.loss_agg_mode",
            "grpo: seq-mean-token-mean; dapo: token-mean; dr_grpo: seq-mean-token-sum-norm with "
            "loss_scale_factor = max_completion_length * max_turns",
            also=("actor_rollout_ref.actor.loss_scale_factor",),
        ),
        Name("-", "the ppo policy loss is always a token mean over the batch", builtin=("dapo",)),
    ),
    "loss.scale_rewards": (
        Name("scale_rewards"),
        Name(
            "algorithm.norm_adv_by_std_in_grpo",
            f"true: group, false: none; {_NO_STD}; rloo never divides by a std",
            only=("group", "none"),
        ),
        Name(
            "--algo.advantage.estimator",
            f"group: group_norm; none: dr_grpo or rloo; {_NO_STD} (reinforce_baseline whitens token advantages)",
            only=("group", "none"),
        ),
    ),
    "loss.epsilon": (
        Name("epsilon"),
        Name("actor_rollout_ref.actor.clip_ratio_low", "verl also dual-clips negative advantages (clip_ratio_c)"),
        Name("--actor.eps_clip_low_high", "LOW HIGH"),
    ),
    "loss.epsilon_high": (
        Name("epsilon_high"),
        Name("actor_rollout_ref.actor.clip_ratio_high"),
        Name("--actor.eps_clip_low_high", "LOW HIGH"),
    ),
    "loss.beta": (
        Name("beta", "with use_bias_correction_kl false, as the harness", also=("use_bias_correction_kl",)),
        Name(
            "actor_rollout_ref.actor.kl_loss_coef",
            "with use_kl_loss and kl_loss_type low_var_kl (k3)",
            also=("actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_type"),
        ),
        Name(
            "--algo.kl.init_coef",
            "with --algo.kl.use_loss and --algo.kl.estimator k3",
            also=("--algo.kl.use_loss", "--algo.kl.estimator"),
        ),
    ),
    "loss.num_iterations": (
        Name("num_iterations"),
        Name("actor_rollout_ref.actor.ppo_epochs"),
        Name("--train.max_epochs"),
    ),
    "loss.mask_truncated_completions": (
        Name("mask_truncated_completions"),
        Name("-", "truncated responses always train", builtin=(False,)),
        Name("-", "--reward.stop_properly_penalty_coef rescales their reward, it does not mask", builtin=(False,)),
    ),
    "loss.tis_cap": (
        Name(
            "vllm_importance_sampling_clip_max",
            "with vllm_importance_sampling_correction and mode token_truncate; TRL applies it to vLLM generation only",
            also=("vllm_importance_sampling_correction", "vllm_importance_sampling_mode"),
        ),
        Name(
            "algorithm.rollout_correction.rollout_is_threshold",
            "with rollout_is token (TIS) and the rollout's log-probabilities",
            also=("algorithm.rollout_correction.rollout_is", "actor_rollout_ref.rollout.calculate_log_probs"),
        ),
        Name(
            "--algo.advantage.is_correction_threshold",
            "LOW HIGH, with --algo.advantage.is_correction_enable and type tis",
            also=("--algo.advantage.is_correction_enable", "--algo.advantage.is_correction_type"),
        ),
    ),
    "loss.entropy_coef": (
        Name("entropy_coef"),
        Name("actor_rollout_ref.actor.entropy_coeff", "aggregated by loss_agg_mode (a token mean only for dapo)"),
        Name("--actor.entropy_coef"),
    ),
    "shaping.overlong_buffer_len": (
        Name(
            "-",
            "a reward function: trl.rewards.get_soft_overlong_punishment(max_completion_len, soft_punish_cache)",
            builtin=(0,),
        ),
        Name(
            "reward.reward_kwargs.overlong_buffer_cfg.len",
            "the DAPO reward manager",
            also=(
                "reward.reward_manager.name",
                "reward.reward_kwargs.overlong_buffer_cfg.enable",
                "reward.reward_kwargs.overlong_buffer_cfg.log",
                "reward.reward_kwargs.max_resp_len",
            ),
        ),
        Name("--reward.overlong_buffer_len", "off when absent"),
    ),
    "shaping.overlong_penalty_factor": (
        Name("-", "the weight of a get_soft_overlong_punishment reward function"),
        Name("reward.reward_kwargs.overlong_buffer_cfg.penalty_factor"),
        Name("--reward.overlong_penalty_factor"),
    ),
    "shaping.length_penalty": (Name("-", "a reward function instead", builtin=(0.0,)),) * 3,
    "filters.zero_std_threshold": (
        Name("-", "every group trains", builtin=(None,)),
        Name("-", "algorithm.filter_groups resamples groups instead (filters.dynamic_sampling)", builtin=(None,)),
        Name("-", "--algo.dynamic_filtering_enable resamples groups instead", builtin=(None,)),
    ),
    "filters.mask_terminations": (
        Name("mask_truncated_completions", "only ('length',) carries over", only=((), ("length",))),
        Name("-", "no mask by termination reason", builtin=((),)),
        Name("-", "no mask by termination reason", builtin=((),)),
    ),
    "filters.dynamic_sampling": (
        Name("-", "none built in (TRL issue #3708)", builtin=(False,)),
        Name(
            "algorithm.filter_groups.enable",
            "with metric acc (a float reward's score): groups whose metric is all equal are resampled",
            also=("algorithm.filter_groups.metric",),
        ),
        Name("--algo.dynamic_filtering_enable", "drops groups whose mean score is outside (0, 1): 0/1 scores only"),
    ),
    "filters.max_sampling_rounds": (
        Name("-", "no dynamic sampling"),
        Name("-", "the V1 trainer ignores algorithm.filter_groups.max_num_gen_batches: it resamples until full"),
        Name("-", "filtered prompts are replaced until the batch is full, with no cap"),
    ),
    "filters.std_keep_ratio": (
        Name("-", "no group filter on reward std", builtin=(None,)),
        Name("-", "algorithm.filter_groups resamples groups whose metric is all equal instead", builtin=(None,)),
        Name("-", "--algo.dynamic_filtering_enable resamples groups instead", builtin=(None,)),
    ),
    "filters.std_ema_decay": (Name("-", "no group filter on reward std", builtin=(0.95,)),) * 3,
    "curriculum.levels": (
        Name("-", "no difficulty sampler", builtin=(None,)),
        Name("-", "a custom sampler (trainer.v1.sampler.custom_sampler)", builtin=(None,)),
        Name("-", "--data.prompt_probs mixes datasets, not difficulty levels", builtin=(None,)),
    ),
    "curriculum.easy_threshold": (Name("-", "no difficulty sampler", builtin=(None,)),) * 3,
    "curriculum.hard_threshold": (Name("-", "no difficulty sampler", builtin=(None,)),) * 3,
    "optimizer.learning_rate": (
        Name("learning_rate"),
        Name("actor_rollout_ref.actor.optim.lr"),
        Name("--actor.adam.lr"),
    ),
    "optimizer.weight_decay": (
        Name("weight_decay"),
        Name("actor_rollout_ref.actor.optim.weight_decay"),
        Name("--actor.adam.weight_decay"),
    ),
    "optimizer.max_grad_norm": (
        Name("max_grad_norm"),
        Name("actor_rollout_ref.actor.optim.clip_grad"),
        Name("--actor.max_norm"),
    ),
    "optimizer.warmup_steps": (
        Name("warmup_steps", "counted in optimizer steps: warmup_steps * num_iterations"),
        Name("actor_rollout_ref.actor.optim.lr_warmup_steps"),
        Name("--actor.lr_warmup_ratio", "a share of the run's steps: only 0 carries over", only=(0,)),
    ),
    "optimizer.lr_decay": (
        Name(
            "lr_scheduler_type",
            "warmup_stable_decay (decay_type, num_decay_steps, min_lr_ratio in lr_scheduler_kwargs)",
            also=("lr_scheduler_kwargs", "warmup_steps"),
        ),
        Name(
            "actor_rollout_ref.actor.optim.lr_scheduler_type", "decays over the whole run", only=("constant", "cosine")
        ),
        Name(
            "--actor.lr_scheduler",
            "decays over the whole run (cosine: cosine_with_min_lr)",
            also=("--actor.min_lr_ratio",),
        ),
    ),
    "optimizer.decay_steps": (
        Name("lr_scheduler_kwargs", "num_decay_steps = (decay_steps - warmup_steps) * num_iterations"),
        Name("-", "the decay spans the run (trainer.total_training_steps)", builtin=(0,)),
        Name("-", "the decay spans the run", builtin=(0,)),
    ),
    "optimizer.min_lr_ratio": (
        Name("lr_scheduler_kwargs", "min_lr_ratio of warmup_stable_decay"),
        Name("actor_rollout_ref.actor.optim.min_lr_ratio", "cosine only"),
        Name("--actor.min_lr_ratio", "cosine_with_min_lr only"),
    ),
    "multi_turn.max_turns": (
        Name("max_tool_calling_iterations", "= max_turns - 1: tool rounds after the first generation"),
        Name(
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
            also=("actor_rollout_ref.rollout.multi_turn.enable",),
        ),
        Name("-", "the agent function (--train.agent_func_path) decides when an episode ends", builtin=(1,)),
    ),
    "multi_turn.max_observation_tokens": (
        Name("-", "TRL's tool loop keeps whole tool results", builtin=(0,)),
        Name(
            "-",
            "rollout.multi_turn.max_tool_response_length counts characters (about 4 a token) and keeps one side "
            "(tool_response_truncate_side): set it by hand",
            builtin=(0,),
        ),
        Name("-", "the agent function decides", builtin=(0,)),
    ),
    "multi_turn.tool_error": (
        Name("-", "a failed tool call's error is fed back", builtin=("feedback",)),
        Name("-", "the tool agent loop feeds a failed call's error back", builtin=("feedback",)),
        Name("-", "the agent function decides"),
    ),
    "suite_version": (Name("-", "EvoTrainer's diagnostic suite, not a trainer setting", builtin=(None,)),) * 3,
}


def target_keys(target: str) -> frozenset[str]:
    """Every key the registry names for a target (what an export may set)."""
    i = TARGETS.index(target)
    return frozenset(k for names in MAPPINGS.values() for k in (names[i].key, *names[i].also) if k != "-")


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
    replayable: bool
    names: tuple[Name, Name, Name]
    """Its setting in TRL, verl and OpenRLHF (TARGETS order)."""

    def name(self, target: str) -> Name:
        return self.names[TARGETS.index(target)]

    @property
    def trl(self) -> str:
        return self.names[0].key

    @property
    def verl(self) -> str:
        return self.names[1].key

    @property
    def openrlhf(self) -> str:
        return self.names[2].key

    def honours(self, target: str, value: Any) -> bool:
        """Whether `target` can run this knob at `value`, judged from the registry alone (the export
        also weighs the other knobs: verl's rloo, say, expresses scale_rewards "none" only)."""
        n = self.name(target)
        return (n.key != "-" and (not n.only or value in n.only)) or value in n.builtin

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["names"] = {t: asdict(n) for t, n in zip(TARGETS, self.names, strict=True)}
        return {**d, "trl": self.trl, "verl": self.verl, "openrlhf": self.openrlhf}


# Under those prefixes, knobs that change what is sampled: dynamic sampling draws more prompts.
NOT_REPLAYABLE = frozenset({"filters.dynamic_sampling", "filters.max_sampling_rounds"})


def is_replayable(path: str) -> bool:
    return path.startswith(REPLAYABLE_PREFIXES) and path not in NOT_REPLAYABLE


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
                    True,
                    MAPPINGS["reward_weights.*"],
                )
            )
        else:
            out.append(_knob(name, field, getattr(defaults, name)))
    return tuple(out)


def _knob(path: str, field, default: Any) -> Knob:
    low, high = _bounds(field)
    choices = _choices(field.annotation)
    return Knob(
        path,
        "choice" if choices and "tuple" not in str(field.annotation) else _type_name(field.annotation),
        default,
        low,
        high,
        choices,
        " ".join((field.description or "").split()),
        is_replayable(path),
        # A knob added without a row has no equivalent anywhere: a backend refuses it until one is added.
        MAPPINGS.get(path, (Name("-"),) * 3),
    )


def knob(path: str) -> Knob:
    """The registry entry of a dotted path (reward_weights.TERM resolves to reward_weights.*)."""
    key = "reward_weights.*" if path.startswith("reward_weights.") else path
    for k in registry():
        if k.path == key:
            return k
    raise KeyError(f"unknown knob {path!r}; `evotrainer knobs` lists them all")
