"""Harness export: a harness as another trainer's settings (TRL GRPOConfig keywords, verl Hydra overrides,
OpenRLHF flags). Every knob gets one line: exported, exported with a stated difference, or not exported
with the reason; none is dropped silently."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from evotrainer.harness.harness import Harness
from evotrainer.harness.knobs import TARGETS, TITLES, Knob, registry

TRL_VERSIONS = ">=1.16,<2"
"""The TRL releases the TRL export (GRPOConfig keywords) and `train.backend: trl` are tested with (1.16 here);
older ones lack keys the export writes (0.20: `entropy_coef`, `loss_type="dapo"`), a new major may rename them.
The dev and trl extras in pyproject.toml require the same range; the TRL backend checks it at start-up."""


@dataclass(frozen=True)
class Line:
    """One knob's translation into a target."""

    knob: str
    value: Any
    settings: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    """What differs in the target (exported), or why the knob does not carry over (not exported)."""
    exported: bool = True


@dataclass(frozen=True)
class Export:
    """A harness in one target's terms: a line per knob, in the registry's order."""

    target: str
    lines: tuple[Line, ...]

    @property
    def settings(self) -> dict[str, Any]:
        """Every exported key with its value. Knobs that share a key (TRL's schedule) set it alike."""
        out: dict[str, Any] = {}
        for line in self.lines:
            for key, v in line.settings.items():
                if out.get(key, v) != v:
                    raise ValueError(f"{line.knob} sets {key}={v!r}, another knob {out[key]!r}")
                out[key] = v
        return out

    @property
    def unmapped(self) -> list[Line]:
        """Knobs with no equivalent in the target, or set to a value it cannot express."""
        return [x for x in self.lines if not x.exported]

    @property
    def notes(self) -> list[Line]:
        """Knobs exported with a difference the user should know of."""
        return [x for x in self.lines if x.exported and x.note]

    def render(self) -> str:
        """The settings in the target's own form: a JSON dict of GRPOConfig keywords, Hydra `key=value`
        overrides (`+` for keys verl's base config lacks), or train_ppo_ray flags, one per line."""
        s = self.settings
        if self.target == "trl":
            return json.dumps(s, indent=2)
        if self.target == "verl":
            return "\n".join(f"{'+' if k.startswith(_VERL_APPENDED) else ''}{k}={_hydra(v)}" for k, v in s.items())
        return "\n".join(_flag(k, v) for k, v in s.items() if v is not False)

    def report(self) -> str:
        """The knobs that did not carry over, then those that carried over with a difference."""
        title = TITLES[self.target]
        if not self.unmapped:
            out = [f"# Every knob carries over to {title}."]
        else:
            out = [f"# Not exported to {title} (no equivalent, or a value {title} cannot express):"]
            out += [f"#   {x.knob} = {x.value!r}: {x.note}" for x in self.unmapped]
        if self.notes:
            out.append(f"# Exported with a difference in {title}:")
            out += [f"#   {x.knob} = {x.value!r}: {x.note}" for x in self.notes]
        return "\n".join(out)


def export(h: Harness, target: str) -> Export:
    """The harness as `target`'s settings, one line per registry knob."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; one of {', '.join(TARGETS)}")
    rules = _RULES[target]
    lines = []
    for k in registry():
        value = _value(h, k.path)
        out = rules[k.path](h) if k.path in rules else _generic(h, k, target, value)
        lines.append(Line(k.path, value, *out))
    return Export(target, tuple(lines))


# A rule's result: (settings, note, exported).
Out = tuple[dict[str, Any], str, bool]


def _ok(settings: dict[str, Any] | None = None, note: str = "") -> Out:
    return settings or {}, note, True


def _drop(reason: str) -> Out:
    return {}, reason, False


def _value(h: Harness, path: str) -> Any:
    if path == "reward_weights.*":
        return dict(h.reward_weights)
    section, _, name = path.partition(".")
    return getattr(getattr(h, section), name) if name else getattr(h, section)


def _generic(h: Harness, k: Knob, target: str, value: Any) -> Out:
    """A knob without a special rule: inert under this harness, the target's key, its built-in behaviour,
    or not exported."""
    n = k.name(target)
    if inert := _inert(h, k.path):
        return _ok(note=inert if value != k.default else "")
    if n.key != "-" and (not n.only or value in n.only):
        return _ok({n.key: list(value) if isinstance(value, tuple) else value})
    if value in n.builtin:
        return _ok()
    if n.key != "-":
        return _drop(f"{n.key} expresses only {', '.join(map(repr, n.only))}" + (f": {n.note}" if n.note else ""))
    return _drop(n.note or f"{TITLES[target]} has no equivalent")


def _inert(h: Harness, path: str) -> str:
    """Why a knob has no effect under the rest of this harness ("" when it has one)."""
    if path == "shaping.overlong_penalty_factor" and not h.shaping.overlong_buffer_len:
        return "no effect: shaping.overlong_buffer_len is 0"
    if path == "filters.max_sampling_rounds" and not h.filters.dynamic_sampling:
        return "no effect: filters.dynamic_sampling is off"
    if path in ("optimizer.decay_steps", "optimizer.min_lr_ratio", "optimizer.lr_decay") and not _decays(h):
        return "no effect: the learning rate does not decay (lr_decay constant or decay_steps 0)"
    if path == "multi_turn.tool_error" and h.multi_turn.tool_error == "feedback" and h.multi_turn.max_turns == 1:
        return "no effect: single-turn episodes"
    return ""


def _decays(h: Harness) -> bool:
    return h.optimizer.lr_decay != "constant" and h.optimizer.decay_steps > 0


def _multi_turn(h: Harness, what: str) -> str:
    """The difference of a length setting in multi-turn episodes: the targets count every turn's tokens."""
    if h.multi_turn.max_turns == 1:
        return ""
    return f"{what} the response across all turns; the harness each turn"


def _inert_or(h: Harness, path: str, default: Any, settings: dict[str, Any]) -> Out:
    """The settings a rule always writes, with the inert note when the knob has no effect here."""
    inert = _inert(h, path)
    return _ok(settings, inert if inert and _value(h, path) != default else "")


# ---- TRL (GRPOConfig 1.16.0) ----


def _trl_schedule(h: Harness) -> dict[str, Any]:
    """The harness's schedule in transformers' terms. TRL's scheduler steps once per optimizer step,
    num_iterations of them per sampled batch, so step counts scale by it. warmup_stable_decay (after the
    warm-up, decay over num_decay_steps to min_lr_ratio, then hold) is the harness's shape exactly; like
    every transformers schedule it counts the first update as step 0 where the harness counts 1."""
    o, mu = h.optimizer, h.loss.num_iterations
    if not _decays(h):
        kind = "constant_with_warmup" if o.warmup_steps else "constant"
        return {"lr_scheduler_type": kind, "warmup_steps": o.warmup_steps * mu}
    decay = {"num_stable_steps": 0, "num_decay_steps": (o.decay_steps - o.warmup_steps) * mu}
    decay |= {"decay_type": o.lr_decay, "min_lr_ratio": o.min_lr_ratio}
    return {
        "lr_scheduler_type": "warmup_stable_decay",
        "warmup_steps": o.warmup_steps * mu,
        "lr_scheduler_kwargs": decay,
    }


_PER_UPDATE = "the rate also moves between the num_iterations optimizer steps of a batch; the harness holds it"


def _trl_warmup(h: Harness) -> Out:
    o, note = h.optimizer, []
    if o.warmup_steps and _decays(h) and o.min_lr_ratio:
        note.append("warmup_stable_decay warms up from min_lr_ratio * learning_rate, the harness from 0")
    if o.warmup_steps and h.loss.num_iterations > 1:
        note.append(_PER_UPDATE)
    return _ok(_trl_schedule(h), "; ".join(note))


def _trl_decay(h: Harness) -> Out:
    if not _decays(h):
        return _inert_or(h, "optimizer.lr_decay", "constant", _trl_schedule(h))
    return _ok(_trl_schedule(h), _PER_UPDATE if h.loss.num_iterations > 1 else "")


def _trl_mask_terminations(h: Harness) -> Out:
    rest = [t for t in h.filters.mask_terminations if t != "length"]
    if rest:
        return _drop(f"GRPOConfig masks truncated completions only ('length': mask_truncated_completions), not {rest}")
    return _ok({"mask_truncated_completions": True} if h.filters.mask_terminations else {})


def _trl_mask_truncated(h: Harness) -> Out:
    on = h.loss.mask_truncated_completions or "length" in h.filters.mask_terminations
    note = "TRL also leaves them out of the dapo denominator; the harness keeps them in" if on else ""
    return _ok({"mask_truncated_completions": on}, note if h.loss.loss_type == "dapo" else "")


def _trl_overlong(h: Harness) -> Out:
    sh, cap = h.shaping, h.sampling.max_completion_length
    if not sh.overlong_buffer_len:
        return _ok()
    return _drop(
        "no GRPOConfig field: add the reward function trl.rewards.get_soft_overlong_punishment("
        f"max_completion_len={cap}, soft_punish_cache={sh.overlong_buffer_len}) with weight "
        f"{sh.overlong_penalty_factor}"
    )


def _trl_num_generations(h: Harness) -> Out:
    if h.sampling.num_generations < 2:
        return _drop("GRPOConfig requires num_generations >= 2")
    return _ok({"num_generations": h.sampling.num_generations})


def _trl_batch(h: Harness) -> Out:
    s = h.sampling
    return _ok(
        {
            "generation_batch_size": s.prompts_per_step * s.num_generations,
            "per_device_train_batch_size": s.num_generations,
            "gradient_accumulation_steps": s.prompts_per_step,
        },
        "for one process: with N processes divide gradient_accumulation_steps by N, so that one optimizer step "
        "still takes the whole batch",
    )


_TRL: dict[str, Callable[[Harness], Out]] = {
    "reward_weights.*": lambda h: _ok(
        {"reward_weights": list(h.reward_weights.values())},
        f"reward_funcs must come in this order: {', '.join(h.reward_weights)}",
    ),
    "sampling.num_generations": _trl_num_generations,
    "sampling.prompts_per_step": _trl_batch,
    "sampling.max_completion_length": lambda h: _ok(
        {"max_completion_length": h.sampling.max_completion_length}, _multi_turn(h, "max_completion_length caps")
    ),
    "loss.beta": lambda h: _ok({"beta": h.loss.beta} | ({"use_bias_correction_kl": False} if h.loss.beta else {})),
    "loss.mask_truncated_completions": _trl_mask_truncated,
    # TRL corrects by default whenever vLLM generates; the harness says whether to.
    "loss.tis_cap": lambda h: _ok(
        {"vllm_importance_sampling_correction": h.loss.tis_cap is not None}
        | (
            {"vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_clip_max": h.loss.tis_cap}
            if h.loss.tis_cap is not None
            else {}
        )
    ),
    "filters.mask_terminations": _trl_mask_terminations,
    "shaping.overlong_buffer_len": _trl_overlong,
    "optimizer.warmup_steps": _trl_warmup,
    "optimizer.lr_decay": _trl_decay,
    "optimizer.decay_steps": lambda h: _inert_or(h, "optimizer.decay_steps", 0, _trl_schedule(h)),
    "optimizer.min_lr_ratio": lambda h: _inert_or(h, "optimizer.min_lr_ratio", 0.0, _trl_schedule(h)),
    "multi_turn.max_turns": lambda h: _ok({"max_tool_calling_iterations": h.multi_turn.max_turns - 1}),
}


# ---- verl (0.10.0.dev, main_ppo with the V1 trainer) ----

# Keys verl's base config lacks (the DAPO reward manager reads them): a `+` override adds them.
_VERL_APPENDED = ("reward.reward_kwargs.",)
_VERL_AGG = {"grpo": "seq-mean-token-mean", "dapo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}
_VERL_ACTOR = "actor_rollout_ref.actor."


def _verl_scale(h: Harness) -> Out:
    L = h.loss
    if L.advantage_estimator == "rloo":
        return _ok() if L.scale_rewards == "none" else _drop("verl's rloo never divides by a std")
    if L.scale_rewards == "batch":
        return _drop("verl's grpo divides by the group's std or by nothing: no batch scaling")
    return _ok({"algorithm.norm_adv_by_std_in_grpo": L.scale_rewards == "group"})


def _verl_loss_type(h: Harness) -> Out:
    out: dict[str, Any] = {_VERL_ACTOR + "loss_agg_mode": _VERL_AGG[h.loss.loss_type]}
    if h.loss.loss_type == "dr_grpo":  # the harness's constant per-sequence denominator
        out[_VERL_ACTOR + "loss_scale_factor"] = h.sampling.max_completion_length * h.multi_turn.max_turns
    return _ok(out)


def _verl_beta(h: Harness) -> Out:
    if not h.loss.beta:
        return _ok({_VERL_ACTOR + "use_kl_loss": False})
    kl = {"use_kl_loss": True, "kl_loss_coef": h.loss.beta, "kl_loss_type": "low_var_kl"}  # k3, as the harness
    return _ok({_VERL_ACTOR + k: v for k, v in kl.items()})


def _verl_overlong(h: Harness) -> Out:
    sh = h.shaping
    if not sh.overlong_buffer_len:
        return _ok()
    cfg = "reward.reward_kwargs.overlong_buffer_cfg."
    return _ok(
        {"reward.reward_manager.name": "dapo", cfg + "enable": True, cfg + "len": sh.overlong_buffer_len}
        | {cfg + "log": False, "reward.reward_kwargs.max_resp_len": h.sampling.max_completion_length},
        _multi_turn(h, "the DAPO reward manager measures"),
    )


def _verl_dynamic(h: Harness) -> Out:
    if not h.filters.dynamic_sampling:
        return _ok({"algorithm.filter_groups.enable": False})
    return _ok(
        {"algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "acc"},
        "acc is the reward function's score when it returns a float (a dict names its own keys); verl compares it "
        "before the overlong penalty, and only an exact std of 0 drops a group",
    )


def _verl_decay(h: Harness) -> Out:
    key = _VERL_ACTOR + "optim.lr_scheduler_type"
    if not _decays(h):
        return _inert_or(h, "optimizer.lr_decay", "constant", {key: "constant"})
    if h.optimizer.lr_decay == "linear":
        return _drop("verl's FSDP optimizer schedules constant or cosine only")
    return _ok({key: "cosine"}, "verl's cosine decays over the whole run (trainer.total_training_steps)")


def _verl_turns(h: Harness) -> Out:
    turns = h.multi_turn.max_turns
    key = "actor_rollout_ref.rollout.multi_turn."
    return _ok({key + "max_assistant_turns": turns} | ({key + "enable": True} if turns > 1 else {}))


def _verl_tis(h: Harness) -> Out:
    if h.loss.tis_cap is None:
        return _ok()
    return _ok(
        {
            "algorithm.rollout_correction.rollout_is": "token",
            "algorithm.rollout_correction.rollout_is_threshold": h.loss.tis_cap,
            "actor_rollout_ref.rollout.calculate_log_probs": True,
        }
    )


_VERL: dict[str, Callable[[Harness], Out]] = {
    "loss.tis_cap": _verl_tis,
    "sampling.prompts_per_step": lambda h: _ok(
        {"data.train_batch_size": h.sampling.prompts_per_step}
        | {_VERL_ACTOR + "ppo_mini_batch_size": h.sampling.prompts_per_step}
    ),
    "sampling.max_completion_length": lambda h: _ok(
        {"data.max_response_length": h.sampling.max_completion_length}, _multi_turn(h, "data.max_response_length caps")
    ),
    "loss.advantage_estimator": lambda h: _ok({"algorithm.adv_estimator": h.loss.advantage_estimator}),
    "loss.scale_rewards": _verl_scale,
    "loss.loss_type": _verl_loss_type,
    "loss.epsilon": lambda h: _ok(
        {_VERL_ACTOR + "clip_ratio_low": h.loss.epsilon},
        "verl also dual-clips negative advantages at clip_ratio_c (3.0); the harness does not",
    ),
    "loss.epsilon_high": lambda h: _ok(
        {_VERL_ACTOR + "clip_ratio_high": h.loss.epsilon if h.loss.epsilon_high is None else h.loss.epsilon_high}
    ),
    "loss.beta": _verl_beta,
    "loss.entropy_coef": lambda h: _ok(
        {_VERL_ACTOR + "entropy_coeff": h.loss.entropy_coef},
        "verl aggregates the bonus by loss_agg_mode; the harness takes the token mean"
        if h.loss.entropy_coef and h.loss.loss_type != "dapo"
        else "",
    ),
    "shaping.overlong_buffer_len": _verl_overlong,
    "filters.dynamic_sampling": _verl_dynamic,
    "optimizer.lr_decay": _verl_decay,
    "multi_turn.max_turns": _verl_turns,
}


# ---- OpenRLHF (0.11.0, openrlhf.cli.train_ppo_ray) ----

# (advantage_estimator, scale_rewards) -> --algo.advantage.estimator; group_norm divides by the group's std,
# dr_grpo and rloo by nothing.
_ORL_ESTIMATORS = {("grpo", "group"): "group_norm", ("grpo", "none"): "dr_grpo", ("rloo", "none"): "rloo"}
_WHOLE_RUN = "the schedule decays over the run's total steps, not to decay_steps"


def _orl_estimator(h: Harness) -> dict[str, Any]:
    a, s = h.loss.advantage_estimator, h.loss.scale_rewards
    return {"--algo.advantage.estimator": _ORL_ESTIMATORS.get((a, s), "dr_grpo" if a == "grpo" else "rloo")}


def _orl_scale(h: Harness) -> Out:
    a, s = h.loss.advantage_estimator, h.loss.scale_rewards
    if (a, s) in _ORL_ESTIMATORS:
        return _ok(_orl_estimator(h))
    if a == "rloo":
        return _drop("OpenRLHF's rloo never divides by a std")
    return _drop("no batch scaling of the group baseline (reinforce_baseline whitens token advantages instead)")


def _orl_beta(h: Harness) -> Out:
    if not h.loss.beta:
        return _ok({"--algo.kl.init_coef": 0.0})
    return _ok({"--algo.kl.init_coef": h.loss.beta, "--algo.kl.use_loss": True, "--algo.kl.estimator": "k3"})


def _orl_decay(h: Harness) -> Out:
    if not _decays(h):
        return _inert_or(h, "optimizer.lr_decay", "constant", {"--actor.lr_scheduler": "constant"})
    if h.optimizer.lr_decay == "linear":
        return _ok({"--actor.lr_scheduler": "linear"}, _WHOLE_RUN)
    return _ok(
        {"--actor.lr_scheduler": "cosine_with_min_lr", "--actor.min_lr_ratio": h.optimizer.min_lr_ratio}, _WHOLE_RUN
    )


def _orl_min_lr(h: Harness) -> Out:
    r = h.optimizer.min_lr_ratio
    if not _decays(h):
        return _inert_or(h, "optimizer.min_lr_ratio", 0.0, {})
    if h.optimizer.lr_decay == "linear":
        return _drop("transformers' linear schedule decays to 0") if r else _ok()
    return _ok({"--actor.min_lr_ratio": r})


_ORL: dict[str, Callable[[Harness], Out]] = {
    "loss.tis_cap": lambda h: (
        _ok(
            {
                "--algo.advantage.is_correction_enable": True,
                "--algo.advantage.is_correction_type": "tis",
                "--algo.advantage.is_correction_threshold": [0.0, h.loss.tis_cap],
            },
            "OpenRLHF's tis clamps from below too: LOW 0 leaves the weights uncut there",
        )
        if h.loss.tis_cap is not None
        else _ok()
    ),
    "sampling.prompts_per_step": lambda h: _ok(
        {"--rollout.batch_size": h.sampling.prompts_per_step}
        | {"--train.batch_size": h.sampling.prompts_per_step * h.sampling.num_generations}
    ),
    "sampling.max_completion_length": lambda h: _ok(
        {"--rollout.max_new_tokens": h.sampling.max_completion_length}, _multi_turn(h, "--rollout.max_new_tokens caps")
    ),
    "loss.advantage_estimator": lambda h: _ok(_orl_estimator(h)),
    "loss.scale_rewards": _orl_scale,
    "loss.epsilon": lambda h: _ok({"--actor.eps_clip_low_high": _clip(h)}),
    "loss.epsilon_high": lambda h: _ok({"--actor.eps_clip_low_high": _clip(h)}),
    "loss.beta": _orl_beta,
    "shaping.overlong_buffer_len": lambda h: _ok(
        {"--reward.overlong_buffer_len": h.shaping.overlong_buffer_len} if h.shaping.overlong_buffer_len else {}
    ),
    "filters.dynamic_sampling": lambda h: (
        _ok(
            {"--algo.dynamic_filtering_enable": True},
            "OpenRLHF drops a group whose mean score is outside --algo.dynamic_filtering_range (0, 1): all-equal "
            "only for 0/1 scores",
        )
        if h.filters.dynamic_sampling
        else _ok()
    ),
    "optimizer.lr_decay": _orl_decay,
    "optimizer.min_lr_ratio": _orl_min_lr,
}


def _clip(h: Harness) -> list[float]:
    return [h.loss.epsilon, h.loss.epsilon if h.loss.epsilon_high is None else h.loss.epsilon_high]


_RULES = {"trl": _TRL, "verl": _VERL, "openrlhf": _ORL}


def _hydra(v: Any) -> str:
    """A value as a Hydra override writes it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, list | tuple):
        return "[" + ",".join(_hydra(x) for x in v) + "]"
    return str(v)


def _flag(key: str, v: Any) -> str:
    """A train_ppo_ray flag: bare for a switch, its values space-separated otherwise."""
    if v is True:
        return key
    return " ".join([key, *(shlex.quote(str(x)) for x in (v if isinstance(v, list) else [v]))])
