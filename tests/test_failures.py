"""Failure scenarios (examples/failures/): each built-in detector fires on a real training run that
exhibits its failure, citing rollouts that show it, and every detector stays quiet on the healthy runs."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from conftest import SEED
from evotrainer.config import RunConfig, load_config
from evotrainer.diagnostics.detector import Finding
from evotrainer.diagnostics.suite import BUILTIN, Suite
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.run import BRANCH, train_run

FAILURES = Path(__file__).resolve().parents[1] / "examples" / "failures"
QUIET = Console(file=open(os.devnull, "w"))
HEALTHY = ("healthy", "healthy_digits")


@dataclass(frozen=True)
class Scenario:
    control: str
    """The healthy config this scenario breaks."""
    planted: Callable[[RunConfig, RunConfig], bool]
    """(scenario, control) -> the planted knob differs from the control as intended."""
    fires: tuple[str, ...]
    """Findings the run must produce (others may fire too: a broken run is often broken several ways)."""
    knobs: tuple[tuple[str, str], ...] = ()
    """(finding, knob) pairs: the finding must name the planted knob among those to change."""
    seeds: int = 1
    """Runs at the test seed and the next ones, this many, for a plant whose failure develops at some seeds
    but not every one: its findings must all fire at one of them at least (the evidence checked on each run
    that fired). The healthy runs are held to as many seeds (HEALTHY_SEEDS) and must be quiet at every one, so
    a detector is not judged more leniently on its plant than on the healthy runs. length_blowup fired at 4
    of 5 seeds on an AMD EPYC (the robustness grid) and at 1 of 3 on an Intel Xeon with AVX-512 and AMX."""


def _h(cfg: RunConfig):
    return cfg.harness


SCENARIOS: dict[str, Scenario] = {
    "zero_variance": Scenario(
        "healthy",
        lambda c, h: _h(c).sampling.num_generations == 1 < _h(h).sampling.num_generations,
        ("zero_variance_groups",),
        (("zero_variance_groups", "sampling.num_generations"),),
    ),
    "truncation": Scenario(
        "healthy",
        lambda c, h: _h(c).sampling.max_completion_length == 4 < _h(h).sampling.max_completion_length,
        ("truncation",),
        (("truncation", "sampling.max_completion_length"),),
    ),
    "plateau": Scenario(
        "healthy",
        lambda c, h: _h(c).optimizer.learning_rate == 0.0 < _h(h).optimizer.learning_rate,
        ("plateau",),
        (("plateau", "optimizer.learning_rate"),),
    ),
    "entropy_explosion": Scenario(
        "healthy",
        lambda c, h: _h(c).sampling.temperature == 3.0 > _h(h).sampling.temperature,
        ("entropy_explosion",),
        (("entropy_explosion", "sampling.temperature"),),
    ),
    "entropy_collapse": Scenario(
        "healthy",
        lambda c, h: (
            _h(c).optimizer.learning_rate >= 1000 * _h(h).optimizer.learning_rate
            and _h(c).loss.beta > 0 == _h(h).loss.beta
            and _h(c).loss.num_iterations == 1
        ),
        ("entropy_collapse", "repetition"),
        # What the policy collapses onto depends on the trajectory: a loop such as 'bbbb b b' (repetition fires)
        # or one short string such as '</answer>' (seed 4 under ATEN_CPU_CAPABILITY=default, the robustness grid).
        seeds=3,
    ),
    "nonfinite": Scenario(
        "healthy",
        lambda c, h: (
            _h(c).optimizer.learning_rate >= 1000 * _h(h).optimizer.learning_rate
            and _h(c).loss.beta > 0 == _h(h).loss.beta
            and _h(c).loss.num_iterations > 1
        ),
        ("nonfinite",),
        (("nonfinite", "optimizer.learning_rate"),),
    ),
    "kl_spike": Scenario(
        "healthy",
        lambda c, h: (
            _h(c).loss.num_iterations == 4 > _h(h).loss.num_iterations
            and _h(c).loss.beta > 0
            and _h(c).optimizer.learning_rate > _h(h).optimizer.learning_rate
        ),
        ("kl_spike",),
        (("kl_spike", "optimizer.learning_rate"), ("kl_spike", "loss.beta")),
    ),
    "reward_hacking": Scenario(
        "healthy",
        lambda c, h: _h(c).reward_weights == {"contains_answer": 1.0} != _h(h).reward_weights,
        ("reward_hacking", "reward_audit_gap"),
        (("reward_hacking", "reward_weights.contains_answer"), ("reward_audit_gap", "reward_weights.contains_answer")),
        # reward_hacking reads a paid term that rises: where the warm start is paid by the lenient term from the
        # first step there is no rise to see (seed 2 on an AMD EPYC: 88% of paid answers fail the audit from the
        # start, the reward flat over 100 steps; reward_audit_gap fires).
        seeds=3,
    ),
    "length_blowup": Scenario(
        "healthy",
        lambda c, h: _h(c).reward_weights == {"contains_answer": 1.0} != _h(h).reward_weights,
        ("length_blowup", "reward_audit_gap"),
        (("reward_audit_gap", "reward_weights.contains_answer"),),
        seeds=3,
    ),
    "format_hacking": Scenario(
        "healthy",
        lambda c, h: _h(c).reward_weights["format"] == 1.0 > _h(h).reward_weights["format"],
        ("reward_audit_gap",),
        (("reward_audit_gap", "reward_weights.format"),),
    ),
    "tool_errors": Scenario(
        "healthy_digits",
        lambda c, h: _h(c).sampling.temperature == 1.5 > _h(h).sampling.temperature,
        ("tool_errors",),
        (("tool_errors", "multi_turn.tool_error"),),
    ),
    "turn_cap": Scenario(
        "healthy_digits",
        lambda c, h: _h(c).multi_turn.max_turns == 1 < _h(h).multi_turn.max_turns,
        ("turn_cap",),
        (("turn_cap", "multi_turn.max_turns"),),
    ),
    "infra_errors": Scenario(
        "healthy_digits",
        lambda c, h: c.env.infra_error_rate == 0.2 > h.env.infra_error_rate,
        ("infra_errors",),
        (("infra_errors", "filters.mask_terminations"),),
    ),
}


def scenario_config(name: str, offset: int = 0, **overrides: Any) -> RunConfig:
    if SEED or offset:  # benchmarks/robustness.py: the same scenario on other seeds
        overrides.setdefault("run.seed", SEED + offset)
        overrides.setdefault("run.name", f"{name}-{offset}" if offset else name)
    return load_config(FAILURES / f"{name}.yaml", overrides)


@dataclass
class Result:
    cfg: RunConfig
    summary: dict
    store: RolloutStore
    findings: list[Finding]
    metrics: dict[int, dict[str, float]]

    def rollouts(self, ids: tuple[str, ...]) -> dict[str, dict]:
        quoted = ", ".join("'" + i.replace("'", "''") + "'" for i in ids)
        return {
            r["id"]: r for r in self.store.query(where=f"split = 'train' AND branch = '{BRANCH}' AND id IN ({quoted})")
        }

    def series(self, name: str) -> np.ndarray:
        return np.array([self.metrics[s].get(name, np.nan) for s in sorted(self.metrics)])


@pytest.fixture(scope="module")
def run_scenario(tmp_path_factory, _test_cache):
    """name -> Result: trains the scenario once per module (warm starts come from the session cache) and
    runs the default suite over all of its train steps."""
    out = tmp_path_factory.mktemp("failures")
    done: dict[str, Result] = {}

    def run(name: str, offset: int = 0) -> Result:
        if (name, offset) not in done:
            cfg = scenario_config(
                name, offset, **{"run.out_dir": str(out), "policy.cache_dir": os.environ["EVOTRAINER_TEST_CACHE"]}
            )
            summary = train_run(cfg, QUIET)
            assert summary["steps"] == cfg.train.steps, f"{name}: ran {summary['steps']} of {cfg.train.steps} steps"
            store = RolloutStore(out / cfg.run.name / "store")
            findings = Suite.default().run(store, BRANCH, 1, summary["steps"])
            done[name, offset] = Result(cfg, summary, store, findings, store.metrics(BRANCH))
        return done[name, offset]

    return run


# -- what evidence must show, per finding: (rollout row, the run) -> bool -------------------------------
def _actions(r: dict) -> str:
    return "\n".join(t["action"] or "" for t in r["turns"])


def _mean_logprob(r: dict) -> float:
    return float(np.mean([t["mean_logprob"] for t in r["turns"]]))


def _group_std(res: Result, group_id: str) -> float:
    rows = res.store.sql("SELECT reward FROM rollouts WHERE group_id = ? AND split = 'train'", [group_id])
    assert rows, group_id
    return float(np.std([x["reward"] for x in rows]))  # a group of one has std 0: no signal


def _spiked(res: Result, step: int, factor: float) -> bool:
    """Some signal kl_spike reads (grad norm, KL, clipped share) is `factor` times its run median at `step`."""
    for names in (("grad_norm",), ("kl",), ("clip_ratio/low_mean", "clip_ratio/high_mean")):
        s = sum(res.series(n) for n in names)
        if (
            np.isfinite(s).sum() >= 5
            and np.isfinite(s[step - 1])
            and s[step - 1] > factor * np.nanmedian(s[np.isfinite(s)])
        ):
            return True
    return False


# One chunk, then at least three more copies of it. A chunk is a few characters ('bbbb b b') or a phrase: on an AMD
# EPYC under avx2 kernels (the scenario's seed 5) the collapsed policy looped the prompt's 60-character first sentence.
_LOOP = re.compile(r"(.{1,100}?)\1{3,}", re.DOTALL)

EVIDENCE: dict[str, Callable[[dict, Result], bool]] = {
    "zero_variance_groups": lambda r, res: _group_std(res, r["group_id"]) < 1e-6,
    "truncation": lambda r, res: r["termination"] == "length",
    "length_blowup": lambda r, res: r["completion_tokens"] >= 1.5 * res.series("completions/mean_length")[0],
    "entropy_collapse": lambda r, res: r["step"] == res.summary["steps"] and _mean_logprob(r) > -0.05,
    "entropy_explosion": lambda r, res: _mean_logprob(r) < -2.0,
    "repetition": lambda r, res: bool(_LOOP.search(_actions(r))),
    "kl_spike": lambda r, res: _spiked(res, r["step"], 5.0),
    "nonfinite": lambda r, res: (
        res.metrics[r["step"]]["nonfinite_steps"] > 0 or not np.isfinite(res.metrics[r["step"]]["grad_norm"])
    ),
    "reward_hacking": lambda r, res: (
        r["audit"] is False and r["rewards"]["contains_answer"] > 0 and r["rewards"]["correct"] < 1
    ),
    "reward_audit_gap": lambda r, res: r["audit"] is False and r["reward"] >= 0.5,
    "tool_errors": lambda r, res: any(t["tool_error"] for t in r["turns"]),
    "turn_cap": lambda r, res: (
        r["termination"] == "turn_cap" and r["num_turns"] == res.cfg.harness.multi_turn.max_turns
    ),
    "infra_errors": lambda r, res: r["termination"] == "error",
    "plateau": lambda r, res: r["step"] == res.summary["steps"],
}


# -- the tests ------------------------------------------------------------------------------------------
# Detectors of the code and SWE domains fire on those domains' rollouts; their domain tests plant the
# behaviour and check the evidence ids (a math scenario cannot produce a test-file edit). sampling_mismatch
# needs a sampler that differs from the update (bfloat16): test_detectors.py plants the logprobs.
DOMAIN_TESTED = {
    "sampling_mismatch": "test_detectors.py",
    "dead_outcome_groups": "test_detectors.py",
    "solution_collapse": "test_detectors.py",
    "logprob_collapse": "test_detectors.py",
    "hardcoded_examples": "test_code_domain.py",
    "exec_errors": "test_code_domain.py",
    "test_tampering": "test_swe_domain.py",
    "collection_errors": "test_swe_domain.py",
    "tests_dropped": "test_swe_domain.py",
    "missing_behaviour": "test_swe_behaviour.py",
}


def test_scenarios_cover_every_detector():
    # tool_errors reports two findings: `tool_errors` and `turn_cap`.
    general = set(BUILTIN) - set(DOMAIN_TESTED)
    assert {f for s in SCENARIOS.values() for f in s.fires} == general | {"turn_cap"}
    assert set(EVIDENCE) == general | {"turn_cap"}
    assert set(DOMAIN_TESTED) <= set(BUILTIN)
    for name, test_file in DOMAIN_TESTED.items():
        assert f'"{name}"' in (Path(__file__).parent / test_file).read_text(), f"{test_file} does not test {name}"
    # swe_* / code_* scenario files belong to the domain tests above.
    assert sorted(p.stem for p in FAILURES.glob("*.yaml") if not p.stem.startswith(("swe_", "code_"))) == sorted(
        [*SCENARIOS, *HEALTHY]
    )


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_plants_its_knob(name):
    s = SCENARIOS[name]
    cfg, control = scenario_config(name), scenario_config(s.control)
    assert s.planted(cfg, control)
    assert cfg.harness.version != control.harness.version or cfg.env != control.env
    # Warm starts are shared: a scenario breaks training, not the starting policy.
    assert (cfg.policy, cfg.env.domain, cfg.eval.heldout_size) == (
        control.policy,
        control.env.domain,
        control.eval.heldout_size,
    )


@pytest.mark.parametrize("name", SCENARIOS)
def test_detectors_fire_on_their_scenario(name, run_scenario):
    seeds, fired, misses = SCENARIOS[name].seeds, 0, []
    for offset in range(seeds):
        res = run_scenario(name, offset)
        assert not [f for f in res.findings if f.name == "detector_error"], [f.message for f in res.findings]
        missing = [t for t in SCENARIOS[name].fires if t not in {f.name for f in res.findings}]
        if missing:
            misses.append(f"offset {offset}: {missing} did not fire; findings: {[f.message for f in res.findings]}")
            continue
        fired += 1
        _check_evidence(name, res)
    assert fired, f"{name}: fired at none of {seeds} seeds; " + "; ".join(misses)


def _check_evidence(name: str, res: Result) -> None:
    by_name = {f.name: f for f in res.findings}
    for target in SCENARIOS[name].fires:
        f = by_name[target]
        assert f.evidence, f"{target}: no evidence"
        rows = res.rollouts(f.evidence)
        assert set(rows) == set(f.evidence), (
            f"{target}: evidence ids missing from the store: {set(f.evidence) - set(rows)}"
        )
        bad = [i for i in f.evidence if not EVIDENCE[target](rows[i], res)]
        assert not bad, f"{target}: evidence that does not show the failure: {[(i, _actions(rows[i])) for i in bad]}"
    for target, knob in SCENARIOS[name].knobs:
        assert knob in by_name[target].knobs, f"{target} names {by_name[target].knobs}, not the planted {knob}"


def test_plateau_is_a_frozen_policy(run_scenario):
    # The planted cause, checked independently of the detector: with learning rate 0 the weights never
    # move (the greedy held-out accuracy is unchanged) and the reward has no trend.
    res = run_scenario("plateau")
    assert res.summary["accuracy_before"] == res.summary["accuracy_after"]
    slope = np.polyfit(np.arange(len(res.metrics)), res.series("reward"), 1)[0]
    assert abs(slope) < 1e-3


HEALTHY_SEEDS = max(s.seeds for s in SCENARIOS.values())


@pytest.mark.parametrize("offset", range(HEALTHY_SEEDS))
@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_run_is_quiet(name, offset, run_scenario):
    res = run_scenario(name, offset)
    assert res.findings == [], "\n".join(f"{f.name}: {f.message}" for f in res.findings)
    # Quiet because it is healthy, not because nothing happened: the training reward climbs.
    reward = res.series("reward")
    third = len(reward) // 3
    assert reward[-third:].mean() > reward[:third].mean() + 0.02, reward
