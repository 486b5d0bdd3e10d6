"""Shared fixtures: small real models built and warm-started here, in a per-session cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from evotrainer.config import RunConfig, parse_config

# Trajectory-dependent tests must hold on any machine, seed and thread count: benchmarks/robustness.py runs
# them under several of each through these two variables (the defaults are what CI runs).
SEED = int(os.environ.get("EVOTRAINER_TEST_SEED", "0"))
torch.set_num_threads(int(os.environ.get("EVOTRAINER_TEST_THREADS", "2")))


def small_config(tmp: Path, domain: str = "math", **sections) -> RunConfig:
    """A config sized for tests: a 2-layer model, one-digit sums, a small held-out set."""
    raw = {
        "run": {"name": "t", "out_dir": str(tmp / "runs"), "seed": SEED},
        "policy": {
            "kind": "tiny",
            "cache_dir": os.environ["EVOTRAINER_TEST_CACHE"],
            "tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "vocab_size": 200, "max_positions": 256},
            "warm_start": {"steps": 150, "batch_size": 64, "learning_rate": 3e-3, "demonstrations": 4000},
        },
        "env": {
            "domain": domain,
            "train_size": 400,
            "datasets": [
                {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}
            ],
        },
        "harness": {"sampling": {"num_generations": 8, "prompts_per_step": 16, "max_completion_length": 8}},
        "train": {"steps": 5, "max_seconds": 120},
        "eval": {"heldout_size": 60, "max_new_tokens": 8, "max_turns": 6},
    }
    if domain == "digits":
        raw["env"] = {"domain": "digits", "num_digits": 2, "train_size": 500}
        raw["harness"]["multi_turn"] = {"max_turns": 5}
        raw["harness"]["sampling"]["max_completion_length"] = 6
        raw["eval"]["heldout_size"] = 30  # of 90 two-digit numbers: 60 remain for training
    if sections.get("env", {}).get("domain", raw["env"]["domain"]) != raw["env"]["domain"]:
        raw["env"] = {"train_size": 400}  # another domain: the math fields above do not apply to it
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return parse_config(raw)


@pytest.fixture(scope="session", autouse=True)
def _test_cache(tmp_path_factory):
    os.environ["EVOTRAINER_TEST_CACHE"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def math_setup(tmp_path_factory, _test_cache):
    """(config, domain, warm-started policy) for one-digit sums; built once per session."""
    from evotrainer.envs.registry import make_domain
    from evotrainer.policies import load_policy

    cfg = small_config(tmp_path_factory.mktemp("math"))
    domain = make_domain(cfg)
    return cfg, domain, load_policy(cfg, domain, log=lambda *_: None)


@pytest.fixture(scope="session")
def digits_setup(tmp_path_factory, _test_cache):
    from evotrainer.envs.registry import make_domain
    from evotrainer.policies import load_policy

    cfg = small_config(tmp_path_factory.mktemp("digits"), "digits")
    domain = make_domain(cfg)
    return cfg, domain, load_policy(cfg, domain, log=lambda *_: None)
