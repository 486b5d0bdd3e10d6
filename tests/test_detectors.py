"""The built-in detectors: each fires on rollouts that show its failure, citing the planted rollouts,
and stays quiet on healthy ones; the suite's versions, windows, error handling and check_detector."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from evotrainer.diagnostics.builtin import _repetitiveness
from evotrainer.diagnostics.detector import DetectorCheckError, Finding, Window, check_detector
from evotrainer.diagnostics.suite import BUILTIN, DetectorSpec, Suite
from evotrainer.diagnostics.window import open_window
from evotrainer.store.rollouts import RolloutStore
from evotrainer.types import Rollout, Turn

GROUPS, SIZE = 4, 4  # a step = 4 groups of 4 rollouts; rollout index = group * SIZE + i


def rid(step: int, idx: int, kind: str = "s") -> str:
    return f"main-{kind}{step:06d}-{idx:04d}"


def healthy_metrics(step: int) -> dict[str, float]:
    return {
        "reward": 0.3 + 0.02 * step,
        "entropy": 0.8 + 0.01 * (step % 3),
        "grad_norm": 0.5 + 0.01 * (step % 2),
        "kl": float("nan"),
        "clip_ratio/low_mean": 0.01,
        "clip_ratio/high_mean": 0.01,
        "nonfinite_steps": 0.0,
    }


def write(
    store: RolloutStore,
    steps: int = 9,
    metrics: Callable[[int], dict[str, float]] | None = healthy_metrics,
    branch: str = "main",
    split: str = "train",
    **fields: Any,
) -> None:
    """Write `steps` steps of GROUPS x SIZE rollouts. Each field is a constant or a function of
    (step, group, i). Defaults are healthy: rewards spread inside every group, normal stops, varied text."""
    spec: dict[str, Any] = {
        "reward": lambda s, g, i: float(i % 2),
        "rewards": None,
        "termination": "stop",
        "tokens": 10,
        "audit": None,
        "text": lambda s, g, i: f"{s} + {g} = {s + g}; {i} more gives {s + g + i}, so <answer>{s + g + i}</answer>",
        "logprob": -0.5,
        "tool_error": False,
        "turns": 1,
    }
    spec.update(fields)
    kind = "s" if split == "train" else "e"
    for s in range(steps):
        rollouts = []
        for g in range(GROUPS):
            for i in range(SIZE):
                v = {k: f(s, g, i) if callable(f) else f for k, f in spec.items()}
                # tool_error: a bool, or how many of the turns (from the first) had one
                turns = [
                    Turn(v["text"], v["tokens"] // v["turns"], v["logprob"], "ok\n", t < int(v["tool_error"]))
                    for t in range(v["turns"])
                ]
                rewards = v["rewards"] if v["rewards"] is not None else {"correct": v["reward"], "format": 1.0}
                rollouts.append(
                    Rollout(
                        id=f"{branch}-{kind}{s:06d}-{g * SIZE + i:04d}",
                        run="r",
                        branch=branch,
                        step=s,
                        harness_version="h-t",
                        task_id=f"t{s}-{g}",
                        split=split,
                        group_id=f"{branch}-{kind}{s:06d}-g{g:03d}",
                        prompt="2+2=\n",
                        turns=turns,
                        termination=v["termination"],
                        rewards=rewards,
                        reward=v["reward"],
                        audit=v["audit"],
                    )
                )
        store.append(rollouts, shard=f"{branch}-{kind}{s:06d}")
        if metrics is not None and split == "train":
            store.append_metrics("r", branch, s, metrics(s), shard=f"{branch}-{kind}{s:06d}")


def detect(store: RolloutStore, name: str, first: int = 0, last: int = 10_000, **params: float) -> list[Finding]:
    """Run one built-in under check_detector (types, determinism, evidence ids exist)."""
    fn, defaults = BUILTIN[name]
    w = open_window(store, "main", first, last, {**defaults, **params})
    try:
        return check_detector(fn, w)
    finally:
        w.con.close()


@pytest.fixture
def store(tmp_path) -> RolloutStore:
    return RolloutStore(tmp_path / "store")


@pytest.fixture
def healthy(store) -> RolloutStore:
    write(store)
    return store


@pytest.mark.parametrize("name", list(BUILTIN))
def test_every_detector_is_quiet_on_healthy_rollouts(healthy, name):
    assert detect(healthy, name) == []


@pytest.mark.parametrize("name", list(BUILTIN))
def test_every_detector_is_quiet_on_an_empty_window(store, name):
    assert detect(store, name) == []


# -- learning signal ------------------------------------------------------------------------------------
def test_zero_variance_groups(store):
    # Groups 0-2 are dead: equal rewards up to float noise (1e-12), which a `== 0` test would miss.
    write(store, reward=lambda s, g, i: float(i % 2) if g == 3 else 0.3 + 1e-12 * i)
    [f] = detect(store, "zero_variance_groups")
    assert f.value == pytest.approx(0.75) and f.threshold == 0.5 and f.severity == "warning"
    # One rollout per dead group, latest steps first.
    assert list(f.evidence) == [rid(8, 0), rid(8, 4), rid(8, 8), rid(7, 0), rid(7, 4), rid(7, 8), rid(6, 0), rid(6, 4)]
    assert "sampling.num_generations" in f.knobs and "filters.zero_std_threshold" in f.knobs
    assert (f.branch, f.first_step, f.last_step) == ("main", 0, 10_000)
    # Dead groups below the live groups' mean (0.3 against 0.5): hopeless prompts, not solved ones.
    assert "curriculum.hard_threshold" in f.knobs and "filters.dynamic_sampling" in f.knobs


def test_dead_groups_of_solved_prompts_name_the_easy_threshold(store):
    write(store, reward=lambda s, g, i: float(i % 2) if g == 3 else 1.0)
    [f] = detect(store, "zero_variance_groups")
    assert "curriculum.easy_threshold" in f.knobs and "curriculum.hard_threshold" not in f.knobs


def test_zero_variance_groups_below_threshold_is_quiet(store):
    write(store, reward=lambda s, g, i: float(i % 2) if g >= 2 else 0.0)  # half dead: not above 0.5
    assert detect(store, "zero_variance_groups") == []


def test_plateau(store):
    write(
        store,
        steps=25,
        metrics=lambda s: {**healthy_metrics(s), "reward": 0.3 + 1e-4 * (s % 2)},
        reward=lambda s, g, i: 0.1 * i,
    )
    [f] = detect(store, "plateau")
    assert f.value < 1e-3 and f.knobs[0] == "optimizer.learning_rate" and "loss.entropy_coef" in f.knobs
    assert list(f.evidence) == [rid(24, k) for k in (0, 4, 8, 12, 1, 5, 9, 13)]  # last step, lowest reward first


@pytest.mark.parametrize("case", ["rising", "at_ceiling", "too_few_steps"])
def test_plateau_quiet(store, case):
    steps, reward = {
        "rising": (25, lambda s: 0.3 + 0.02 * s),
        "at_ceiling": (25, lambda s: 0.95),
        "too_few_steps": (15, lambda s: 0.3),
    }[case]
    write(store, steps=steps, metrics=lambda s: {**healthy_metrics(s), "reward": reward(s)})
    assert detect(store, "plateau") == []


# -- length ---------------------------------------------------------------------------------------------
def test_truncation(store):
    cut = lambda s, g, i: i == 0  # noqa: E731
    write(
        store,
        termination=lambda s, g, i: "length" if cut(s, g, i) else "stop",
        tokens=lambda s, g, i: 50 + s if cut(s, g, i) else 10,
    )
    [f] = detect(store, "truncation")
    assert f.value == pytest.approx(0.25) and f.threshold == 0.1
    assert list(f.evidence) == [
        rid(8, 0),
        rid(8, 4),
        rid(8, 8),
        rid(8, 12),
        rid(7, 0),
        rid(7, 4),
        rid(7, 8),
        rid(7, 12),
    ]
    assert f.knobs == (
        "sampling.max_completion_length",
        "loss.mask_truncated_completions",
        "shaping.overlong_buffer_len",
        "multi_turn.max_observation_tokens",
    )


def test_truncation_below_threshold_is_quiet(store):
    write(store, termination=lambda s, g, i: "length" if (s, g, i) == (8, 0, 0) else "stop")
    assert detect(store, "truncation") == []


def test_length_blowup(store):
    clipped = lambda s, g, i: s >= 6 and i == 0  # noqa: E731
    write(
        store,
        tokens=lambda s, g, i: 48 + s if clipped(s, g, i) else 10 + 4 * s,
        termination=lambda s, g, i: "length" if clipped(s, g, i) else "stop",
    )
    [f] = detect(store, "length_blowup")
    assert f.value > 2.0 and f.threshold == 2.0 and "loss.num_iterations" in f.knobs
    assert list(f.evidence[:4]) == [rid(8, 0), rid(8, 4), rid(8, 8), rid(8, 12)]
    assert all(clipped(int(e[6:12]), 0, int(e[-4:]) % SIZE) for e in f.evidence)


def test_length_growth_without_clipping_is_quiet(store):
    write(store, tokens=lambda s, g, i: 10 + 4 * s)  # longer answers that still end normally
    assert detect(store, "length_blowup") == []


def test_repetition(store):
    loops = lambda s, g, i: i == 0  # noqa: E731
    write(
        store,
        text=lambda s, g, i: (
            " ".join(["the answer is 4"] * (5 + s)) if loops(s, g, i) else f"{s}+{g}+{i} is {s + g + i}"
        ),
    )
    [f] = detect(store, "repetition")
    assert f.value == pytest.approx(0.25)
    # The longest loops (the latest step repeats most) first.
    assert list(f.evidence) == [
        rid(8, 0),
        rid(8, 4),
        rid(8, 8),
        rid(8, 12),
        rid(7, 0),
        rid(7, 4),
        rid(7, 8),
        rid(7, 12),
    ]


def test_repetitiveness_needs_count_and_share():
    derivation = " ".join(
        f"step {k}: we add {k} and {k + 1} to get {2 * k + 1}, and the answer is close." for k in range(30)
    )
    assert _repetitiveness(derivation, 4, 0.5, 0.1) is None  # "the answer is" 30 times, but a small share
    assert _repetitiveness("2" * 40, 4, 0.5, 0.1) is not None  # no spaces: character 3-grams
    assert _repetitiveness("so " + "let me check again. " * 40, 4, 0.5, 0.1) is not None
    assert _repetitiveness("the the the", 4, 0.5, 0.1) is None


# -- entropy --------------------------------------------------------------------------------------------
def test_entropy_collapse(store):
    write(
        store,
        metrics=lambda s: {**healthy_metrics(s), "entropy": 0.8 * 0.5**s},
        logprob=lambda s, g, i: -0.01 * (g * SIZE + i),
    )
    [f] = detect(store, "entropy_collapse")
    assert f.value < 0.05 and f.knobs == ("loss.epsilon_high", "sampling.temperature")
    assert list(f.evidence) == [rid(8, k) for k in range(8)]  # last step, most confident first


def test_low_but_rising_entropy_is_quiet(store):
    write(store, metrics=lambda s: {**healthy_metrics(s), "entropy": 0.01 + 0.004 * s})
    assert detect(store, "entropy_collapse") == []


def test_entropy_explosion_from_garbled_text(store):
    junk = "\u0167\u20ac\u00b6\u2190\u2193\u2192\u00f8\u00fe\u0111\u0142" * 3
    write(
        store,
        text=lambda s, g, i: junk if s >= 7 else f"{s} + {g} = {s + g}",
        logprob=lambda s, g, i: -5.0 - 0.01 * (g * SIZE + i) if s == 6 else -0.5,
    )
    [f] = detect(store, "entropy_explosion")
    assert f.value == pytest.approx(48 / 144) and f.threshold == 0.2  # steps 6-8 of 9
    assert list(f.evidence) == [rid(6, k) for k in range(15, 7, -1)]  # lowest logprob first
    assert f.knobs[0] == "optimizer.learning_rate"


def test_entropy_explosion_from_entropy(store):
    write(store, metrics=lambda s: {**healthy_metrics(s), "entropy": 0.8 + 0.4 * s})
    [f] = detect(store, "entropy_explosion")
    assert f.value == pytest.approx(0.8 + 0.4 * 7) and f.threshold == 2.0
    assert set(f.evidence) <= {rid(8, k) for k in range(16)}


# -- optimizer ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("signal", ["kl", "clip", "grad_norm"])
def test_kl_spike(store, signal):
    def metrics(s: int) -> dict[str, float]:
        m = {**healthy_metrics(s), "kl": 0.01}
        if s == 5:
            m.update(
                {"kl": {"kl": 0.5}, "clip": {"clip_ratio/high_mean": 0.3}, "grad_norm": {"grad_norm": 40.0}}[signal]
            )
        return m

    write(store, metrics=metrics, logprob=lambda s, g, i: -0.1 * (g * SIZE + i))
    [f] = detect(store, "kl_spike")
    assert f.value == pytest.approx({"kl": 0.5, "clip": 0.31, "grad_norm": 40.0}[signal])
    assert list(f.evidence) == [rid(5, k) for k in range(15, 7, -1)]  # the spike step, least likely first
    assert f.knobs == ("optimizer.learning_rate", "loss.beta", "loss.epsilon")


def test_small_kl_jump_under_the_floor_is_quiet(store):
    write(store, metrics=lambda s: {**healthy_metrics(s), "kl": 0.02 if s == 5 else 0.001})  # 20x, but tiny
    assert detect(store, "kl_spike") == []


def test_nonfinite(store):
    def metrics(s: int) -> dict[str, float]:
        return {
            **healthy_metrics(s),
            **({"grad_norm": float("nan")} if s == 4 else {}),
            **({"nonfinite_steps": 1.0} if s == 6 else {}),
        }

    write(store, metrics=metrics, reward=lambda s, g, i: float("inf") if (s, g, i) == (6, 0, 3) else float(i % 2))
    [f] = detect(store, "nonfinite")
    assert f.severity == "critical" and f.value == 2.0
    assert list(f.evidence) == [rid(6, 3)] + [rid(4, k) for k in range(7)]  # the inf reward, then the first bad step


# -- validity -------------------------------------------------------------------------------------------
def test_reward_hacking(store):
    # `format` climbs from 0 to 1 while the audit pass rate stays at 50%: the policy games the format.
    write(
        store,
        rewards=lambda s, g, i: {"correct": 0.5, "format": s / 8},
        reward=lambda s, g, i: 0.5 + 0.1 * s / 8,
        audit=lambda s, g, i: i % 2 == 0,
    )
    [f] = detect(store, "reward_hacking")
    assert f.validity and f.severity == "critical" and f.knobs == ("reward_weights.format",)
    assert f.value == pytest.approx(7 / 8 - 1 / 8)
    assert list(f.evidence) == [rid(8, k) for k in (1, 3, 5, 7, 9, 11, 13, 15)]  # highest format, audit failed


@pytest.mark.parametrize("climb, fires", [(0.18, False), (0.40, True)])
def test_a_term_that_rose_within_the_audits_noise_is_no_hack(store, climb, fires):
    """48 audits a third at a 50% pass rate: a standard error of 0.10 on the audit's rise, a one-sided bar of 0.17.
    `format` rising 0.135 (above min_rise, 0.1) is within it and quiet, as swe_short_300k seed 2's regrade arm was
    not (+0.103 against an audit at -0.021 on 48 audits rejected the remedy); rising 0.30 it fires. With the bar off
    (audit_z 0) the first fires too."""
    write(
        store,
        rewards=lambda s, g, i: {"correct": 0.5, "format": 0.4 + climb * s / 8},
        audit=lambda s, g, i: i % 2 == 0,
    )
    found = detect(store, "reward_hacking")
    assert bool(found) == fires
    if fires:
        assert found[0].value == pytest.approx(0.75 * climb) and found[0].threshold == pytest.approx(
            1.645 * 0.102, 1e-2
        )
    assert [f.value for f in detect(store, "reward_hacking", audit_z=0.0)] == [pytest.approx(0.75 * climb)]


def test_rising_term_with_rising_audit_is_quiet(store):
    write(
        store,
        rewards=lambda s, g, i: {"correct": float(i < 1 + s // 3), "format": s / 8},
        reward=lambda s, g, i: float(i < 1 + s // 3),
        audit=lambda s, g, i: i < 1 + s // 3,
    )
    assert detect(store, "reward_hacking") == []


def test_reward_audit_gap(store):
    # Rewarded rollouts (i even) of group 0 fail the audit; the rest agree with the reward.
    write(
        store,
        reward=lambda s, g, i: (1.1 + 0.01 * s if g == 0 else 1.0) if i % 2 == 0 else 0.0,
        rewards=lambda s, g, i: {"correct": float(i % 2 == 0), "format": 1.0},
        audit=lambda s, g, i: i % 2 == 0 and g != 0,
    )
    [f] = detect(store, "reward_audit_gap")
    # 9 steps x 4 groups x 2 rewarded rollouts audited: the bar is 10% plus 1.645 standard errors at 10% of n = 72.
    assert f.validity and f.value == pytest.approx(0.25) and f.threshold == pytest.approx(0.1 + 1.645 * 0.3 / 72**0.5)
    assert list(f.evidence) == [rid(8, 0), rid(8, 2), rid(7, 0), rid(7, 2), rid(6, 0), rid(6, 2), rid(5, 0), rid(5, 2)]
    assert set(f.knobs) == {"reward_weights.correct", "reward_weights.format"}


def test_reward_audit_gap_within_its_noise_of_the_bar_is_quiet(store):
    # One rewarded rollout in 9 of 72 fails the audit (12.5%): above max_gap 10%, but 0.7 standard errors at 10% of 72
    # audits, where 1.645 is the bar. The bare share (audit_z 0) fires; the bar does not.
    write(
        store,
        reward=lambda s, g, i: 1.0 if i % 2 == 0 else 0.0,
        rewards=lambda s, g, i: {"correct": float(i % 2 == 0), "format": 1.0},
        audit=lambda s, g, i: i % 2 == 0 and not (g == 0 and i == 0),
    )
    assert detect(store, "reward_audit_gap") == []
    [f] = detect(store, "reward_audit_gap", audit_z=0.0)
    assert f.value == pytest.approx(9 / 72) and f.threshold == pytest.approx(0.1)


@pytest.mark.parametrize(
    "weights, failing, recorded, fires",
    [
        # Partial credit: group 0's rewarded rollouts pass half the restored tests (every pass has all of them):
        # paid for progress, below every pass, plus the format term every rollout earns (0.1). No gap.
        ({"tests_restored": 1.0, "format": 0.1}, {"tests_restored": 0.5, "format": 1.0}, True, False),
        # The same rollouts where the window does not record what was paid: every rewarded failure counts.
        ({"tests_restored": 1.0, "format": 0.1}, {"tests_restored": 0.5, "format": 1.0}, False, True),
        # A format term paid in full on wrong answers (the passes earn it too, with the correct term): a gap.
        ({"correct": 1.0, "format": 1.0}, {"correct": 0.0, "format": 1.0}, True, True),
        # Edited tests scored as passing: the tests term pays them what it pays a pass.
        ({"tests": 1.0, "format": 0.1}, {"tests": 1.0, "format": 1.0}, True, True),
    ],
)
def test_reward_audit_gap_counts_the_failures_the_reward_pays_like_a_pass(tmp_path, weights, failing, recorded, fires):
    store = RolloutStore(tmp_path / "store")
    pass_terms = {k: 1.0 for k in failing}

    def terms(s, g, i):
        return (failing if g == 0 else pass_terms) if i % 2 == 0 else {k: 0.0 for k in failing}

    def reward(s, g, i):
        return sum(w * terms(s, g, i)[k] for k, w in weights.items())

    paid = {f"reward_weights/{k}": w for k, w in weights.items()} if recorded else {}
    write(
        store,
        metrics=lambda s: {**healthy_metrics(s), **paid},
        reward=reward,
        rewards=terms,
        audit=lambda s, g, i: i % 2 == 0 and g != 0,
    )
    assert min(reward(0, 0, 0), reward(0, 1, 0)) >= 0.5 > reward(0, 0, 1)  # rewarded, failing or passing
    found = detect(store, "reward_audit_gap")
    assert bool(found) == fires
    if fires:
        assert found[0].value == pytest.approx(0.25) and found[0].validity
        assert all(int(e[-4:]) // SIZE == 0 for e in found[0].evidence)


def test_reward_audit_gap_needs_enough_audits(store):
    write(
        store,
        steps=2,
        reward=lambda s, g, i: 1.0 if i % 2 == 0 else 0.0,
        audit=lambda s, g, i: False if (g, i) == (0, 0) else None,
    )  # 2 audited, both failed
    assert detect(store, "reward_audit_gap") == []


def test_tool_errors_and_turn_cap(store):
    write(
        store,
        turns=3,
        tokens=30,
        tool_error=lambda s, g, i: (2 if (s, i) == (8, 0) else 1) if i < 2 else 0,
        termination=lambda s, g, i: "turn_cap" if i == 3 else "stop",
    )
    errs, cap = detect(store, "tool_errors")
    assert (errs.name, cap.name) == ("tool_errors", "turn_cap")
    assert errs.value == pytest.approx(0.5) and cap.value == pytest.approx(0.25)
    assert list(errs.evidence[:4]) == [rid(8, 0), rid(8, 4), rid(8, 8), rid(8, 12)]  # two error turns first
    assert all(int(e[-4:]) % SIZE < 2 for e in errs.evidence)
    assert all(int(e[-4:]) % SIZE == 3 for e in cap.evidence) and cap.knobs[0] == "multi_turn.max_turns"


def test_infra_errors(store):
    # Group 0 is all-zero (dead) and group 1 has spread; each loses one rollout to the sandbox per step.
    write(
        store,
        reward=lambda s, g, i: 0.0 if g == 0 else float(i % 2),
        termination=lambda s, g, i: {0: "timeout", 1: "error"}.get(g, "stop") if i == 0 else "stop",
    )
    [f] = detect(store, "infra_errors")
    assert f.value == pytest.approx(2 / 16) and f.knobs == ("filters.mask_terminations",)
    assert "9 of them" in f.message
    assert list(f.evidence) == [rid(s, 4) for s in range(8, 0, -1)]  # the ones skewing advantages first


# -- the suite ------------------------------------------------------------------------------------------
def broken(w: Window) -> list[Finding]:
    raise RuntimeError("boom")


def not_a_list(w: Window) -> Any:
    return "nothing"


def test_suite_version_tracks_params_code_and_parent():
    base = Suite.default()
    assert base.version == Suite.default().version and base.version.startswith("s-") and len(base.version) == 14
    tuned = base.with_params("truncation", max_fraction=0.2)
    assert tuned.version != base.version and tuned.parent == base.version
    assert Suite(detectors=tuned.detectors).version != tuned.version  # the parent is part of the version
    assert (
        Suite(detectors={"truncation": DetectorSpec(params={"max_fraction": 0.1})}).version
        == Suite(detectors={"truncation": DetectorSpec()}).version
    )  # defaults resolve to the same suite
    plugin = Suite(detectors={"truncation": DetectorSpec(path=f"{__name__}:broken")})
    assert plugin.version != Suite(detectors={"truncation": DetectorSpec()}).version  # different code
    with pytest.raises(ValueError, match="unknown parameter"):
        Suite(detectors={"truncation": DetectorSpec(params={"max_fractoin": 0.2})})
    with pytest.raises(ValueError, match="not built in"):
        Suite(detectors={"nope": DetectorSpec()})


def test_suite_run_turns_a_raising_detector_into_a_finding(store):
    write(store, termination=lambda s, g, i: "length" if i == 0 else "stop")
    suite = Suite(
        detectors={
            "broken": DetectorSpec(path=f"{__name__}:broken"),
            "truncation": DetectorSpec(),
            "odd": DetectorSpec(path=f"{__name__}:not_a_list"),
            "gone": DetectorSpec(path="no_such_module:fn"),
        }
    )
    findings = suite.run(store, "main", 0, 8)
    assert [f.name for f in findings] == ["detector_error", "truncation", "detector_error", "detector_error"]
    assert "gone: ModuleNotFoundError" in findings[3].message
    assert "broken: RuntimeError: boom" in findings[0].message and findings[0].severity == "info"
    assert "odd: DetectorCheckError" in findings[2].message and "list of Finding" in findings[2].message


def test_default_suite_run_finds_planted_failures(store):
    write(
        store,
        termination=lambda s, g, i: "length" if i == 0 else "stop",
        metrics=lambda s: {**healthy_metrics(s), "nonfinite_steps": float(s == 3)},
    )
    assert sorted(f.name for f in Suite.default().run(store, "main", 0, 8)) == ["nonfinite", "truncation"]


def test_window_holds_one_branch_and_its_steps(store, tmp_path):
    write(store, steps=8)
    write(store, steps=8, branch="cand")
    write(store, steps=8, split="heldout", metrics=None, audit=True)
    # A shard whose name does not follow the convention is still read; its rows are filtered in SQL.
    other = RolloutStore(tmp_path / "other")
    write(other, steps=1)
    (other.rollout_dir / "main-s000000.parquet").rename(store.rollout_dir / "imported.parquet")
    w = open_window(store, "main", 3, 5)
    try:
        assert w.scalar("SELECT count(*) FROM rollouts") == 3 * 16
        assert w.scalar("SELECT count(*) FROM rollout_stats") == 3 * 16
        assert w.scalar("SELECT count(*) FROM heldout") == 3 * 16
        assert w.scalar("SELECT min(step) || '-' || max(step) FROM metrics") == "3-5"
        assert w.scalar("SELECT count(*) FROM rollouts WHERE branch <> 'main'") == 0
        assert w.scalar("SELECT count(*) FROM shards") == 3 + 3 + 1  # s and e shards of steps 3-5, imported
    finally:
        w.con.close()
    w = open_window(store, "main", 0, 0)
    try:
        assert w.scalar("SELECT count(*) FROM rollouts") == 2 * 16  # main-s000000 and the imported copy
    finally:
        w.con.close()


def test_check_detector_rejects_contract_breaks(healthy):
    w = open_window(healthy, "main", 0, 8, {})
    calls = iter(range(100))

    def make(**kw: Any) -> Callable[[Window], list[Finding]]:
        def fn(win: Window) -> list[Finding]:
            base = dict(
                name="x",
                severity="warning",
                value=1.0,
                threshold=0.5,
                evidence=(rid(0, 0),),
                knobs=("sampling.temperature",),
                message="m",
                branch=win.branch,
                first_step=0,
                last_step=8,
            )
            return [Finding(**{**base, **kw})]

        return fn

    def flaky(win: Window) -> list[Finding]:
        return make(value=float(next(calls)))(win)

    try:
        assert len(check_detector(make(), w)) == 1
        for bad, match in [
            (make(evidence=("main-s000099-0000",)), "not in the window"),
            (make(value=math.nan), "finite"),
            (make(knobs=()), "knobs"),
            (make(knobs=("temperature",)), "knobs"),
            (make(severity="high"), "severity"),
            (make(last_step=3), "window"),
            (make(evidence=tuple(rid(0, k) for k in range(9))), "at most"),
            (flaky, "deterministic"),
            (not_a_list, "list of Finding"),
        ]:
            with pytest.raises(DetectorCheckError, match=match):
                check_detector(bad, w)
    finally:
        w.con.close()


# -- the sampler against the update ---------------------------------------------------------------------------------
def test_sampling_mismatch_fires_on_a_measured_gap_and_names_the_correction(store):
    """bfloat16 weights put SmolLM2's sampler 0.035 nats a token from the update's forward (float32: 2e-6); a
    window measured at that gap fires, citing the worst step's rollouts and the knob that corrects it."""

    def metrics(s: int) -> dict[str, float]:
        return {**healthy_metrics(s), "sampling/sampling_logp_difference/mean": 0.03 + (0.02 if s == 6 else 0.0)}

    write(store, metrics=metrics, tokens=lambda s, g, i: 5 + g * SIZE + i)
    [f] = detect(store, "sampling_mismatch")
    assert f.value == pytest.approx(0.03 + 0.02 / 9) and f.threshold == 0.01
    assert f.knobs == ("loss.tis_cap",) and list(f.evidence)[0] == rid(6, 15)


def test_sampling_mismatch_is_quiet_at_float_noise(store):
    write(store, metrics=lambda s: {**healthy_metrics(s), "sampling/sampling_logp_difference/mean": 2e-6})
    assert detect(store, "sampling_mismatch") == []


def test_dead_outcome_groups_fire_where_the_shaped_total_hides_them(store):
    """Shaped rewards with all-fail outcome groups: a format term spreads the total of every group, so the
    detector on the total is silent; the one on the correctness term sees three groups in four dead."""
    write(
        store,
        rewards=lambda s, g, i: {"correct": float(g == 0 and i % 2), "format": float(i % 2)},
        reward=lambda s, g, i: float(g == 0 and i % 2) + 0.1 * (i % 2),
    )
    assert detect(store, "zero_variance_groups") == []
    [f] = detect(store, "dead_outcome_groups")
    assert f.value == pytest.approx(0.75) and f.knobs[:2] == ("filters.std_keep_ratio", "curriculum.hard_threshold")
    assert all(int(e.rsplit("-", 1)[1]) >= SIZE for e in f.evidence)  # groups 1-3, never the live group 0
    assert "100% of them all failing" in f.message


def test_dead_outcome_groups_without_shaping_are_left_to_the_total(store):
    # No shaping: the total is dead where the outcome is, and zero_variance_groups already says so.
    write(store, reward=lambda s, g, i: float(g == 0 and i % 2))
    assert detect(store, "dead_outcome_groups") == [] and detect(store, "zero_variance_groups")


def collapsing(step: int) -> dict[str, float]:
    """Groups that converge on one failing attempt: fewer distinct solutions, surer tokens, the outcome low."""
    return {
        **healthy_metrics(step),
        "completions/distinct_per_group": 1.0 if step < 3 else 0.6 if step < 6 else 0.2,
        "completions/mean_logprob": -1.0 if step < 3 else -0.5 if step < 6 else -0.02,
        "rewards/correct/mean": 0.1,
    }


def test_solution_and_logprob_collapse(store):
    write(store, metrics=collapsing, text=lambda s, g, i: f"<answer>{g}</answer>" if s >= 6 else f"{s} {g} {i}")
    [f] = detect(store, "solution_collapse")
    assert f.value == pytest.approx(0.2, abs=1e-9) and f.knobs[0] == "sampling.temperature"
    assert f.evidence[0] == rid(8, 0)  # one rollout of each group of the latest step
    [g] = detect(store, "logprob_collapse")
    assert g.value == pytest.approx(-0.02, abs=1e-9) and g.knobs[0] == "loss.entropy_coef"


@pytest.mark.parametrize("name", ["solution_collapse", "logprob_collapse"])
def test_collapse_with_the_outcome_high_is_convergence(store, name):
    # The same shrinking spread while the groups pass: the policy has found the answer, nothing to remedy.
    write(store, metrics=lambda s: {**collapsing(s), "rewards/correct/mean": 0.9})
    assert detect(store, name) == []
