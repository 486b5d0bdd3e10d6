"""Harness export: TRL keywords checked against TRL's own GRPOConfig, verl overrides and OpenRLHF flags
against the registry's names, and every knob accounted for (exported, or listed with a reason)."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex

import pytest
import torch
import yaml
from typer.testing import CliRunner

from evotrainer.cli.main import app
from evotrainer.harness.export import TRL_VERSIONS, export
from evotrainer.harness.harness import Harness
from evotrainer.harness.knobs import TARGETS, knob, registry, target_keys
from evotrainer.training.grpo import lr_factor

# Off the defaults wherever a target can follow, and past what some cannot express.
WIDE = Harness(
    reward_weights={"correct": 1.0, "format": 0.2},
    sampling={"num_generations": 4, "prompts_per_step": 6, "temperature": 0.7, "max_completion_length": 256},
    loss={
        "loss_type": "dr_grpo",
        "scale_rewards": "none",
        "epsilon": 0.15,
        "epsilon_high": 0.28,
        "beta": 0.04,
        "num_iterations": 2,
        "mask_truncated_completions": True,
        "entropy_coef": 0.01,
    },
    shaping={"overlong_buffer_len": 32},
    filters={"dynamic_sampling": True},
    curriculum={"levels": (1, 2)},
    optimizer={"learning_rate": 1e-5, "warmup_steps": 10, "lr_decay": "cosine", "decay_steps": 100},
    multi_turn={"max_turns": 3},
)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("h", [Harness(), WIDE], ids=["default", "wide"])
def test_every_knob_is_exported_or_listed_with_a_reason(h, target):
    ex = export(h, target)
    assert [x.knob for x in ex.lines] == [k.path for k in registry()]
    assert all(x.note for x in ex.unmapped)
    assert set(ex.settings) <= target_keys(target), set(ex.settings) - target_keys(target)


def test_trl_export_builds_trl_own_grpo_config_and_round_trips(tmp_path):
    from trl import GRPOConfig

    # The registry names only fields GRPOConfig has (the TRL backend refuses a knob whose name is "-").
    assert target_keys("trl") <= {f.name for f in dataclasses.fields(GRPOConfig)}
    ex = export(WIDE, "trl")
    d = json.loads(ex.render())
    assert d == ex.settings
    cfg = GRPOConfig(**d, output_dir=str(tmp_path), use_cpu=True, report_to="none")
    s, L = WIDE.sampling, WIDE.loss
    assert cfg.learning_rate == WIDE.optimizer.learning_rate and cfg.num_generations == s.num_generations
    assert cfg.generation_batch_size // cfg.num_generations == s.prompts_per_step
    # One optimizer step per sampled batch, as the harness: the whole generation batch is accumulated.
    assert cfg.steps_per_generation == cfg.gradient_accumulation_steps
    assert (cfg.temperature, cfg.beta, cfg.epsilon, cfg.epsilon_high) == (s.temperature, L.beta, 0.15, 0.28)
    assert (cfg.loss_type, cfg.scale_rewards, cfg.num_iterations) == ("dr_grpo", "none", 2)
    assert cfg.mask_truncated_completions and cfg.entropy_coef == L.entropy_coef
    assert cfg.max_completion_length == s.max_completion_length and cfg.max_tool_calling_iterations == 2
    assert cfg.use_bias_correction_kl is False and cfg.reward_weights == [1.0, 0.2]
    unmapped = {x.knob for x in ex.unmapped}
    assert unmapped == {
        "shaping.overlong_buffer_len",
        "shaping.overlong_penalty_factor",
        "filters.dynamic_sampling",
        "filters.max_sampling_rounds",
        "curriculum.levels",
    }
    assert "get_soft_overlong_punishment" in next(x.note for x in ex.unmapped if x.knob.startswith("shaping."))
    assert not export(Harness(), "trl").unmapped  # the default harness carries over whole


@pytest.mark.parametrize(
    "optimizer,mu",
    [
        ({"warmup_steps": 5, "lr_decay": "cosine", "decay_steps": 40}, 1),
        ({"warmup_steps": 5, "lr_decay": "linear", "decay_steps": 40}, 3),
        ({"lr_decay": "cosine", "decay_steps": 30, "min_lr_ratio": 0.1}, 2),
        ({"warmup_steps": 7}, 2),
    ],
)
def test_trl_schedule_is_the_harness_schedule(optimizer, mu):
    """transformers builds the schedule from the exported keywords as the Trainer does; TRL steps it per
    optimizer step (num_iterations per batch), the harness per batch: update mu*k has the rate of step k."""
    from transformers.optimization import get_scheduler

    h = Harness(optimizer=optimizer, loss={"num_iterations": mu})
    d = export(h, "trl").settings
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    n = 60 * mu
    sched = get_scheduler(
        d["lr_scheduler_type"],
        opt,
        num_warmup_steps=d["warmup_steps"],
        num_training_steps=n,
        scheduler_specific_kwargs=d.get("lr_scheduler_kwargs") or {},
    )
    for k in range(60):
        assert sched.lr_lambdas[0](mu * k) == pytest.approx(lr_factor(h.optimizer, k), abs=1e-9), k


def _overrides(text: str) -> dict[str, tuple[str, str]]:
    """Hydra `key=value` lines as {key: (prefix, value)}."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(r"(\+?)([A-Za-z_][\w.]*)=(\S+)", line)
        assert m, f"not a Hydra override: {line!r}"
        out[m[2]] = (m[1], m[3])
    return out


def test_verl_overrides_use_only_registry_keys():
    # Every key is checked once against verl's own flattened config, verl/trainer/config/
    # _generated_ppo_trainer.yaml at verl-project/verl 1dda039b (0.10.0.dev), when the registry was written:
    # all are there but reward.reward_kwargs.*, which verl's DAPO reward manager reads and a `+` adds.
    ex = export(WIDE, "verl")
    kv = _overrides(ex.render())
    assert set(kv) <= target_keys("verl")
    assert all((p == "+") == k.startswith("reward.reward_kwargs.") for k, (p, _) in kv.items())
    v = {k: val for k, (_, val) in kv.items()}
    assert v["actor_rollout_ref.rollout.n"] == "4" and v["data.train_batch_size"] == "6"
    assert v["actor_rollout_ref.actor.ppo_mini_batch_size"] == "6"
    assert (v["actor_rollout_ref.actor.clip_ratio_low"], v["actor_rollout_ref.actor.clip_ratio_high"]) == (
        "0.15",
        "0.28",
    )
    assert v["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-sum-norm"
    assert v["actor_rollout_ref.actor.loss_scale_factor"] == str(256 * 3)
    assert v["actor_rollout_ref.actor.kl_loss_coef"] == "0.04" and v["actor_rollout_ref.actor.use_kl_loss"] == "true"
    assert v["reward.reward_kwargs.overlong_buffer_cfg.len"] == "32" and v["reward.reward_manager.name"] == "dapo"
    assert v["algorithm.filter_groups.enable"] == "true" and v["algorithm.norm_adv_by_std_in_grpo"] == "false"
    assert {x.knob for x in ex.unmapped} >= {
        "reward_weights.*",
        "curriculum.levels",
        "optimizer.decay_steps",
        "filters.max_sampling_rounds",
        "loss.mask_truncated_completions",
    }
    # Values verl cannot express are listed, not dropped.
    for loss in ({"scale_rewards": "batch"}, {"advantage_estimator": "rloo", "scale_rewards": "group"}):
        assert "loss.scale_rewards" in {x.knob for x in export(Harness(loss=loss), "verl").unmapped}


def _flags(text: str) -> dict[str, list[str]]:
    out = {}
    for line in text.splitlines():
        flag, *values = shlex.split(line)
        assert flag.startswith("--"), line
        out[flag] = values
    return out


def test_openrlhf_flags_use_only_registry_names():
    # Checked against openrlhf/cli/train_ppo_ray.py at OpenRLHF v0.11.0 (3c3be623), the dotted flags.
    ex = export(WIDE, "openrlhf")
    f = _flags(ex.render())
    assert set(f) <= target_keys("openrlhf")
    assert f["--rollout.n_samples_per_prompt"] == ["4"] and f["--train.batch_size"] == ["24"]
    assert f["--actor.eps_clip_low_high"] == ["0.15", "0.28"] and f["--algo.advantage.estimator"] == ["dr_grpo"]
    assert f["--algo.kl.use_loss"] == [] and f["--algo.kl.estimator"] == ["k3"]
    assert f["--algo.dynamic_filtering_enable"] == [] and f["--reward.overlong_buffer_len"] == ["32"]
    assert {"loss.loss_type", "optimizer.warmup_steps", "optimizer.decay_steps"} <= {x.knob for x in ex.unmapped}
    estimators = {
        ("grpo", "group"): "group_norm",
        ("grpo", "none"): "dr_grpo",
        ("rloo", "none"): "rloo",
    }
    for (est, scale), name in estimators.items():
        h = Harness(loss={"advantage_estimator": est, "scale_rewards": scale})
        assert _flags(export(h, "openrlhf").render())["--algo.advantage.estimator"] == [name]


def test_registry_says_which_values_a_target_honours():
    assert knob("loss.advantage_estimator").honours("trl", "grpo")
    assert not knob("loss.advantage_estimator").honours("trl", "rloo")
    assert not knob("filters.dynamic_sampling").honours("trl", True)
    assert knob("filters.dynamic_sampling").honours("verl", True)
    assert knob("optimizer.warmup_steps").honours("openrlhf", 0)
    assert not knob("optimizer.warmup_steps").honours("openrlhf", 10)
    assert knob("sampling.temperature").trl == "temperature" and knob("shaping.length_penalty").verl == "-"


def test_cli_export_from_a_run_directory(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"harness": WIDE.model_dump(mode="json")}))
    runner = CliRunner()
    res = runner.invoke(app, ["harness", "export", str(tmp_path), "--to", "trl"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["num_generations"] == 4
    assert "curriculum.levels" in res.stderr and "Not exported to TRL" in res.stderr
    # The TRL releases the export is tested with, and what GRPOConfig needs on a machine without a GPU.
    assert f"TRL {TRL_VERSIONS}" in res.stderr and "use_cpu=True" in res.stderr
    res = runner.invoke(app, ["harness", "export", str(tmp_path / "config.yaml"), "--to", "verl"])
    assert res.exit_code == 0 and "actor_rollout_ref.rollout.n=4" in res.stdout
    res = runner.invoke(app, ["harness", "export", str(tmp_path), "--to", "openrlhf"])
    assert res.exit_code == 0 and "--rollout.n_samples_per_prompt 4" in res.stdout
    res = runner.invoke(app, ["harness", "export", str(tmp_path), "--to", "deepspeed"])
    assert res.exit_code == 2 and "--to" in res.output and "openrlhf" in res.output
    res = runner.invoke(app, ["knobs", "--json"])
    rows = {r["path"]: r for r in json.loads(res.stdout)}
    assert rows["sampling.num_generations"]["openrlhf"] == "--rollout.n_samples_per_prompt"
