"""Validity, made fair: a validity finding counts against an arm only when the arm's own reward pays what
it flags while the audit fails it (else it stays as a warning, its figures kept); and the gate's reward
rise and reward-audit gap compare both arms under one reward function."""

from __future__ import annotations

import pytest

from evotrainer.backtest import gate
from evotrainer.diagnostics.detector import Finding
from evotrainer.diagnostics.suite import Suite, weigh
from evotrainer.diagnostics.window import open_window
from evotrainer.harness.harness import Harness
from evotrainer.harness.rewards import total_reward
from evotrainer.store.rollouts import RolloutStore
from evotrainer.types import Rollout, Turn


def rollout(
    branch: str, step: int, i: int, *, text: str, correct: float, reward: float, audit: bool | None, tokens: int = 4
) -> Rollout:
    return Rollout(
        id=f"{branch}-s{step:06d}-{i:04d}",
        run="r",
        branch=branch,
        step=step,
        harness_version="h",
        task_id=f"t{i}",
        split="train",
        group_id=f"{branch}-s{step:06d}-g{i // 4:03d}",
        prompt="p",
        turns=[Turn(action=text, tokens=tokens, mean_logprob=-0.5)],
        termination="stop",
        rewards={"correct": correct, "format": 1.0},
        reward=reward,
        audit=audit,
    )


def flagged_finding(branch: str) -> Finding:
    return Finding(
        name="induced_long",
        severity="critical",
        value=0.5,
        threshold=0.05,
        evidence=(),
        knobs=("reward_weights.correct",),
        message="long answers",
        validity=True,
        branch=branch,
        first_step=1,
        last_step=3,
        flagged="SELECT id FROM rollouts WHERE contains(array_to_string(list_transform(turns, "
        "lambda t: t.action), ''), 'LONG')",
    )


@pytest.mark.parametrize("paid", [True, False])
def test_a_validity_finding_counts_only_where_the_reward_pays_what_it_flags(tmp_path, paid):
    """Half of the window's rollouts are 'long' and all of those fail the audit. When the reward pays them
    (the exploit), the finding counts; when it does not (the arm is unlearning the behaviour), it is
    demoted to a warning with its figures."""
    store = RolloutStore(tmp_path / "store")
    for step in (1, 2, 3):
        rows = []
        for i in range(16):
            long = i % 2 == 0
            r = (1.0 if paid else 0.1) if long else 1.0
            rows.append(
                rollout("arm", step, i, text="LONG answer" if long else "ok", correct=r, reward=r, audit=not long)
            )
        store.append(rows, f"arm-s{step:06d}")
    w = open_window(store, "arm", 1, 3)
    try:
        out = weigh(w, flagged_finding("arm"), rewarded=0.5)
    finally:
        w.con.close()
    if paid:
        assert out.validity and not out.demoted and out.severity == "critical"
    else:
        assert not out.validity and out.severity == "warning"
        assert "24 flagged rollouts" in out.demoted and "0 of the 24 audited" in out.demoted
        assert "Not counted" in out.message


def test_an_unweighable_finding_keeps_counting(tmp_path):
    store = RolloutStore(tmp_path / "store")
    store.append(
        [rollout("arm", 1, i, text="LONG", correct=0.0, reward=0.0, audit=None) for i in range(16)], "arm-s000001"
    )
    w = open_window(store, "arm", 1, 1)
    try:
        f = flagged_finding("arm")
        assert weigh(w, f, 0.5) is f  # nothing audited among the flagged: no grounds to demote
        aggregate = Finding(
            name="reward_hacking",
            severity="critical",
            value=0.3,
            threshold=0.1,
            evidence=(),
            knobs=("reward_weights.x",),
            message="m",
            validity=True,
        )
        assert weigh(w, aggregate, 0.5) is aggregate  # an aggregate finding (no flagged query) is not weighed
    finally:
        w.con.close()


def _arm(store: RolloutStore, branch: str, own: Harness, shrinking: bool) -> None:
    """Nine steps where correctness is flat (half right, the audit agrees); on a shrinking arm the
    completions get shorter every step."""
    import numpy as np

    for step in range(1, 10):
        tokens = 12 - step if shrinking else 8
        rows = []
        for i in range(16):
            c = float(i % 2)
            r = float(
                total_reward(
                    own,
                    {"correct": np.array([c]), "format": np.array([1.0])},
                    np.array([tokens]),
                    np.array([tokens]),
                    np.array(["stop"]),
                )[0]
            )
            rows.append(rollout(branch, step, i, text="x", correct=c, reward=r, audit=bool(c), tokens=tokens))
        store.append(rows, f"{branch}-s{step:06d}")


def test_validity_statistics_compare_both_arms_under_one_reward(tmp_path):
    """A candidate with a length penalty: its own reward climbs as its completions shorten, while its
    correctness and audit do not move. Under the control's reward (shared) there is no rise to flag;
    measured with each arm's own reward, the same arms read as `reward_up_audit_flat`."""
    control_h = Harness(reward_weights={"correct": 1.0, "format": 0.1})
    cand_h = control_h.model_copy(update={"shaping": control_h.shaping.model_copy(update={"length_penalty": 0.05})})
    store = RolloutStore(tmp_path / "store")
    _arm(store, "ctl", control_h, shrinking=False)
    _arm(store, "cand", cand_h, shrinking=True)
    suite = Suite(detectors={})
    shared_c = gate.arm_evidence(store, suite, "cand", 1, 9, control_h)
    shared_k = gate.arm_evidence(store, suite, "ctl", 1, 9, control_h)
    assert abs(shared_c.reward_rise) < 1e-9 and gate.validity_reasons(shared_c, shared_k)[1] == []
    own_c = gate.arm_evidence(store, suite, "cand", 1, 9, cand_h)
    assert own_c.reward_rise > 0.1
    figures, reasons = gate.validity_reasons(own_c, shared_k)
    assert "reward_up_audit_flat" in reasons and figures.reward_rise_candidate == own_c.reward_rise


def test_induction_prefers_the_exploit_s_own_pattern_over_a_length_proxy():
    """The failing rollouts are long AND carry the shortcut's literal; length separates them perfectly on
    the fit part, the literal nearly. The rule names the literal; a literal that fits much worse loses."""
    import numpy as np

    from evotrainer.diagnostics.induction import prefer_behaviour
    from evotrainer.diagnostics.rules import Feature

    rng = np.random.default_rng(0)
    y = np.array([True] * 40 + [False] * 60)
    chars = np.where(y, rng.integers(70, 90, 100), rng.integers(30, 60, 100)).astype(float)
    literal = y.astype(float)
    literal[[0, 1]] = 0.0  # two failing rollouts take another path: the literal misses them
    feats = [Feature(kind="column", arg="chars"), Feature(kind="count", arg="return a")]
    rule = prefer_behaviour(np.column_stack([chars, literal]), y, feats)
    assert [j for j, _, _ in rule] == [1]
    weak = np.where(rng.random(100) < 0.6, y, ~y).astype(float)  # a literal that is mostly noise
    rule = prefer_behaviour(np.column_stack([chars, weak]), y, feats)
    assert [j for j, _, _ in rule] == [0]


def test_induction_keeps_a_length_rule_over_a_behaviour_rule_the_verdict_would_reject_on_specificity():
    """Where failing rollouts outnumber passing ones, a behaviour rule can be precise, recall everything and still
    flag many honest rollouts: the swap must ask the specificity the verdict asks, or it trades an accepted rule for
    a rejected one (a low mean log-probability on an AMD EPYC under avx2 kernels, 2026-12-05)."""
    import numpy as np

    from evotrainer.diagnostics.induction import prefer_behaviour, score
    from evotrainer.diagnostics.rules import Feature

    rng = np.random.default_rng(0)
    y = np.array([True] * 200 + [False] * 100)
    tokens = np.where(y, rng.integers(6, 12, 300), 3).astype(float)  # honest answers have one fixed length
    unsure = np.arange(300) >= 285  # the last 15 honest answers are written with as little confidence as the stuffing
    logprob = np.where(y | unsure, rng.uniform(-2.0, -1.0, 300), rng.uniform(-0.5, -0.1, 300))
    feats = [Feature(kind="column", arg="completion_tokens"), Feature(kind="column", arg="mean_logprob")]
    alone = score(logprob <= -1.0, y)  # the behaviour rule: precise and complete, specificity 0.85
    assert alone.precision > 0.92 and alone.recall == 1.0 and alone.specificity == 0.85
    rule = prefer_behaviour(np.column_stack([tokens, logprob]), y, feats)
    assert [j for j, _, _ in rule] == [0]
    # Where the behaviour rule spares the honest answers too, it is still preferred to the length.
    sure = np.where(y, logprob, rng.uniform(-0.5, -0.1, 300))
    rule = prefer_behaviour(np.column_stack([tokens, sure]), y, feats)
    assert [j for j, _, _ in rule] == [1]
