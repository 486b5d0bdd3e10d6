"""The TRL backend: a short `evotrainer train` run by trl.GRPOTrainer lands in our store and checkpoint
layout (and forks as an arm, under either backend); what TRL cannot honour is refused before anything
is written."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import trl
from rich.console import Console

from evotrainer.backtest.trial import ArmSpec, run_arm
from evotrainer.errors import ConfigError
from evotrainer.harness.export import TRL_VERSIONS
from evotrainer.harness.harness import Harness
from evotrainer.policies.hf import HFPolicy, Placement
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.run import train_run
from evotrainer.training.trl_backend import TRLTrainer, check_trl_version, stop_token_ids, unhonoured
from tests.conftest import small_config

QUIET = Console(file=open("/dev/null", "w"))
SAMPLING = {"num_generations": 4, "prompts_per_step": 4, "max_completion_length": 8}


def _trl_config(tmp_path, **sections):
    train = {"steps": 3, "backend": "trl", **sections.pop("train", {})}
    return small_config(tmp_path, train=train, harness={"sampling": SAMPLING, **sections.pop("harness", {})})


def test_trl_train_run_writes_our_store_and_checkpoint(tmp_path, math_setup):
    cfg = _trl_config(tmp_path)
    summary = train_run(cfg, QUIET)
    run_dir = tmp_path / "runs" / "t"
    assert summary["steps"] == 3
    store = RolloutStore(run_dir / "store")
    rows = store.query(where="split = 'train'")
    assert len(rows) == 3 * 4 * 4 and sorted({r["step"] for r in rows}) == [1, 2, 3]
    assert all(set(r["rewards"]) == {"correct", "format", "contains_answer"} for r in rows)
    assert all(r["termination"] in ("stop", "length") for r in rows)
    assert all(r["id"] == f"main-s{r['step']:06d}-{int(r['id'][-4:]):04d}" for r in rows)
    assert {r["group_id"] for r in rows if r["step"] == 1} == {f"main-s000001-g{g:03d}" for g in range(4)}
    assert any(r["audit"] is not None for r in rows)  # the evaluator audits a sample, as under ours
    # A completion ends on the stop string, as our sampler ends it: the token is the stop token, not EOS.
    stopped = [r for r in rows if r["termination"] == "stop"]
    assert stopped and all(r["turns"][0]["action"].endswith("</answer>") for r in stopped)
    assert all(r["turns"][0]["mean_logprob"] < 0 for r in rows)
    m = store.metrics("main")
    assert sorted(m) == [1, 2, 3]
    for name in ("reward", "rewards/correct/mean", "rewards/contains_answer/mean", "grad_norm", "learning_rate"):
        assert name in m[1], name
    assert m[1]["loss"] == m[1]["loss"]  # from TRL's log
    assert m[2]["tokens_generated"] > 0 and m[2]["audit/pass_rate"] >= 0.0
    # The checkpoint is ours: weights and the optimizer state a fork loads.
    ckpt = run_dir / "checkpoints" / "main"
    assert (ckpt / "optimizer.pt").is_file()
    HFPolicy.load(ckpt)


@pytest.mark.parametrize("backend", ["trl", "ours"])
def test_trl_checkpoint_forks_as_an_arm(tmp_path, math_setup, backend):
    cfg = _trl_config(tmp_path, train={"steps": 1})
    train_run(cfg, QUIET)
    run_dir = tmp_path / "runs" / "t"
    arm_cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"backend": backend})})
    spec = ArmSpec(
        branch="arm",
        role="candidate",
        run_dir=str(run_dir),
        config=arm_cfg.model_dump(mode="json"),
        harness=cfg.harness.model_dump(mode="json"),
        start=str(run_dir / "checkpoints" / "main"),
        seed=cfg.run.seed,
        first_step=2,
        steps=2,
    )
    r = run_arm(spec)
    assert (r.first_step, r.last_step) == (2, 3) and r.generated_tokens > 0
    store = RolloutStore(run_dir / "store")
    assert store.count("branch = 'arm'") == 2 * 4 * 4
    assert sorted(store.metrics("arm")) == [2, 3]
    assert (run_dir / "checkpoints" / "arm" / "optimizer.pt").is_file()


def test_refused_knob_names_it_before_anything_is_written(tmp_path):
    cfg = _trl_config(tmp_path, harness={"filters": {"dynamic_sampling": True}})
    with pytest.raises(ConfigError, match=r"harness\.filters\.dynamic_sampling"):
        train_run(cfg, QUIET)
    assert not (tmp_path / "runs").exists()


def test_multi_turn_domain_is_refused(tmp_path):
    cfg = small_config(tmp_path, "digits", train={"backend": "trl"})
    with pytest.raises(ConfigError, match=r"single-turn.*multi_turn\.max_turns"):
        train_run(cfg, QUIET)
    assert not (tmp_path / "runs").exists()


def test_trl_args_may_not_override_the_harness(tmp_path):
    cfg = _trl_config(tmp_path, train={"trl_args": {"beta": 0.1}})
    with pytest.raises(ConfigError, match=r"train\.trl_args.*beta"):
        train_run(cfg, QUIET)
    assert not (tmp_path / "runs").exists()


def test_trl_outside_the_tested_range_is_refused_naming_it(tmp_path, monkeypatch):
    """The export's keys come and go between TRL releases (0.20 lacks entropy_coef): the backend checks the
    installed TRL against the range the extras require, before anything is written."""
    check_trl_version(trl.__version__)  # the TRL the tests run on is in the tested range
    for old in ("0.20.0", "2.0.0"):
        with pytest.raises(ConfigError, match=rf"train\.backend: trl is tested with trl{TRL_VERSIONS}.*trl {old}"):
            check_trl_version(old)
    monkeypatch.setattr(trl, "__version__", "0.20.0")
    with pytest.raises(ConfigError, match="0.20.0"):
        train_run(_trl_config(tmp_path), QUIET)
    assert not (tmp_path / "runs").exists()
    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra in ("dev", "trl"):
        assert f"trl{TRL_VERSIONS}" in extras[extra]


def test_a_stop_string_of_several_tokens_is_refused(math_setup):
    tok = math_setup[2].tokenizer
    assert len(stop_token_ids(tok, ("</answer>",))) == 1
    with pytest.raises(ConfigError, match="stop string"):
        stop_token_ids(tok, ("</answer> and then some words",))


def test_unhonoured_knobs_are_named_for_the_loops_screen():
    assert unhonoured(Harness()) == ""
    why = unhonoured(Harness(filters={"zero_std_threshold": 0.01}, loss={"advantage_estimator": "rloo"}))
    assert "harness.filters.zero_std_threshold" in why and "harness.loss.advantage_estimator" in why


def test_the_policy_placement_reaches_trls_arguments(math_setup, tmp_path):
    cfg, domain, policy = math_setup
    policy.save(tmp_path / "base")
    placed = HFPolicy.load(tmp_path / "base", placement=Placement("cpu", "bfloat16", True))
    args = TRLTrainer(placed, cfg.harness, domain)._config(str(tmp_path / "out"), 2, 0)
    assert args.use_cpu and args.bf16 and args.activation_checkpointing
    plain = TRLTrainer(policy, cfg.harness, domain, trl_args={"bf16": True})._config(str(tmp_path / "out"), 2, 0)
    assert plain.use_cpu and plain.bf16 and not plain.activation_checkpointing  # trl_args still override
