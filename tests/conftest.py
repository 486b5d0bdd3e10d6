"""Shared fixtures: small real models built and warm-started here, in a per-session cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from evotrainer.config import RunConfig, parse_config
from evotrainer.testing import small_raw

# Trajectory-dependent tests must hold on any machine, seed and thread count: benchmarks/robustness.py runs
# them under several of each through these two variables (the defaults are what CI runs).
SEED = int(os.environ.get("EVOTRAINER_TEST_SEED", "0"))
torch.set_num_threads(int(os.environ.get("EVOTRAINER_TEST_THREADS", "2")))


def small_config(tmp: Path, domain: str = "math", **sections) -> RunConfig:
    """A config sized for tests: a 2-layer model, one-digit sums, a small held-out set."""
    raw = small_raw(tmp / "runs", os.environ["EVOTRAINER_TEST_CACHE"], SEED)
    raw["env"]["domain"] = domain
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


def started_with(cfg: RunConfig, planted: dict[str, str]):
    """A run opened and its start stage done, its suite with `planted` detectors added (name -> a plugin's
    "module:function" path, as a user names one): the run context and the mainline round 1 starts from."""
    from evotrainer.diagnostics.suite import DetectorSpec, Suite
    from evotrainer.stages import start
    from evotrainer.stages.context import run_stage
    from evotrainer.stages.results import StartResult

    ctx = start.open_run(cfg, resume=False)
    head = run_stage(ctx, 0, "start", StartResult, lambda: start.start(ctx, lambda *_: None)).head
    extra = {name: DetectorSpec(path=path) for name, path in planted.items()}
    return ctx, head.model_copy(update={"suite": Suite(detectors={**head.suite.detectors, **extra})})


@pytest.fixture(scope="session", autouse=True)
def _test_cache(tmp_path_factory):
    os.environ["EVOTRAINER_TEST_CACHE"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def math_setup(tmp_path_factory, _test_cache):
    """(config, domain, warm-started policy) for one-digit sums; built once per session."""
    from evotrainer.envs.registry import make_domain, warm_start_key
    from evotrainer.policies import load_policy

    cfg = small_config(tmp_path_factory.mktemp("math"))
    domain = make_domain(cfg)
    return cfg, domain, load_policy(cfg.policy, domain, cfg.run.seed, warm_start_key(cfg, domain), log=lambda *_: None)


@pytest.fixture(scope="session")
def digits_setup(tmp_path_factory, _test_cache):
    from evotrainer.envs.registry import make_domain, warm_start_key
    from evotrainer.policies import load_policy

    cfg = small_config(tmp_path_factory.mktemp("digits"), "digits")
    domain = make_domain(cfg)
    return cfg, domain, load_policy(cfg.policy, domain, cfg.run.seed, warm_start_key(cfg, domain), log=lambda *_: None)


def train_rollout(run: str, branch: str, step: int, i: int, harness, task, turns, terms, total, audit, info, rid=None):
    """A stored train rollout of a planted episode (`i`-th of its step, groups of 8), as a segment would write it:
    the tests that plant SWE episodes by hand build them alike."""
    from evotrainer.types import Rollout

    return Rollout(
        rid or f"{branch}-s{step:06d}-{i:04d}",
        run,
        branch,
        step,
        harness.version,
        task.id,
        "train",
        f"{branch}-s{step:06d}-g{i // 8:03d}",
        task.prompt,
        turns,
        "stop",
        terms,
        total,
        audit,
        task.difficulty,
        info,
    )


def swe_hedged_repair():
    """SWE's naive harness and the repair the loop makes on it (proposers/hedges.py): the regrade `tests` ->
    `tests_restored` paired with the learning rate halved, bound to that harness."""
    from evotrainer.diagnostics.detector import Finding
    from evotrainer.harness.harness import Harness
    from evotrainer.harness.interventions import Hypothesis, Intervention
    from evotrainer.proposers.hedges import hedge
    from evotrainer.proposers.proposer import Proposal

    h = Harness(reward_weights={"tests": 1.0, "format": 0.1}, optimizer={"learning_rate": 5e-4})
    hyp = Hypothesis(finding="test_tampering", signal="heldout/accuracy", direction="up")
    regrade = Intervention(
        kind="replace_reward_term", target="reward_weights.tests", value="tests_restored", hypothesis=hyp
    )
    tampering = Finding(
        "test_tampering", "critical", 1.0, 0.5, ("r01-seg-000001-0",), ("reward_weights.tests",), "planted", True
    )
    repair = hedge([Proposal(regrade, "catalog")], [tampering], h, 0.5).intervention.bind(h)
    assert repair.paired is not None and repair.paired.value == 2.5e-4  # what the tests leave behind
    return h, repair
