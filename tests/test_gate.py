"""The gate: its paired statistics, and a planted invalid branch (training reward up through a grader
loophole) trained for real against its control and rejected with the reason on record."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import small_config
from evotrainer.backtest import gate
from evotrainer.backtest.trial import ArmSpec, run_arm
from evotrainer.config import GateSection
from evotrainer.diagnostics.suite import Suite
from evotrainer.harness.interventions import Hypothesis, Intervention
from evotrainer.stages.context import split_heldout
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.grpo import GRPOTrainer


def test_bootstrap_lower_bound_separates_a_real_gain_from_a_tie():
    rng = np.random.default_rng(0)
    ctrl = (rng.random(400) < 0.5).astype(float)
    better = ctrl.copy()
    better[np.flatnonzero(ctrl == 0)[:40]] = 1.0  # 40 more tasks solved, none lost: +0.10
    s = gate.bootstrap(better, ctrl, 0.95, 2000, seed=1)
    assert s["delta"] == pytest.approx(0.10) and s["lower"] > 0.05
    tie = ctrl.copy()
    flip = rng.permutation(400)[:60]
    tie[flip] = 1 - tie[flip]  # as many gained as lost, at random
    s = gate.bootstrap(tie, ctrl, 0.95, 2000, seed=1)
    assert s["lower"] < 0 < s["ci_high"]


def test_sign_test_is_the_exact_binomial_tail():
    cand = np.array([1, 1, 1, 1, 1, 0, 1, 0], dtype=float)
    ctrl = np.array([0, 0, 0, 0, 0, 1, 1, 0], dtype=float)
    s = gate.sign_test(cand, ctrl)  # 5 wins, 1 loss among 6 discordant tasks
    assert (s["wins"], s["losses"]) == (5, 1)
    assert s["p"] == pytest.approx((math.comb(6, 5) + math.comb(6, 6)) / 2**6)


def test_a_win_inside_the_measured_noise_is_not_promoted():
    ids = [f"t{i}" for i in range(200)]
    ctrl = {i: k % 2 == 0 for k, i in enumerate(ids)}
    cand = {i: (k % 2 == 0) or k < 30 for k, i in enumerate(ids)}  # +15 tasks of 200
    ev = gate.ArmEvidence(reward_rise=0.0, audit_pass=0.5, gap=0.1)
    cfg = GateSection()
    assert gate.decide(cand, ctrl, ev, ev, {"abs_delta": 0.02}, cfg, "e-x", 0).decision == "promote"
    v = gate.decide(cand, ctrl, ev, ev, {"abs_delta": 0.10}, cfg, "e-x", 0)
    assert v.decision == "reject" and v.reasons == ["within_noise"] and v.noise["margin"] == 0.10
    assert v.evaluator_hash == "e-x"


def test_planted_loophole_branch_is_rejected_by_the_gate(tmp_path, math_setup):
    """The harness pays the strict `correct` term and, a little, the lenient `contains_answer` grader.
    The planted candidate drops `correct`, leaving the loophole alone (#3's exploit): packing several
    guesses into the answer pays, its training reward rises, the strict audit does not follow.
    Whatever its held-out score, the gate must reject it and say why."""
    cfg = small_config(
        tmp_path,
        harness={
            "reward_weights": {"correct": 1.0, "contains_answer": 0.5},
            "sampling": {"num_generations": 8, "prompts_per_step": 16, "max_completion_length": 32},
            "loss": {"loss_type": "grpo", "scale_rewards": "group"},
            "optimizer": {"learning_rate": 0.002},
        },
        eval={"heldout_size": 60, "max_new_tokens": 8, "audit_fraction": 0.5},
    )
    _, domain, policy = math_setup
    run_dir = tmp_path / "run"
    start = run_dir / "checkpoints" / "base"
    GRPOTrainer(policy.fork(tmp_path / "fork"), cfg.harness).save(start)
    plant = Intervention(
        kind="remove_reward_term",
        target="reward_weights.correct",
        hypothesis=Hypothesis(
            finding="plateau",
            signal="reward",
            direction="up",
            rationale="planted: let partial credit carry the signal",
        ),
    )
    gate_ids, _ = split_heldout([t.id for t in domain.tasks("heldout")], 0.5, 0)

    def arm(branch: str, harness) -> object:
        return run_arm(
            ArmSpec(
                branch=branch,
                role="candidate",
                run_dir=str(run_dir),
                config=cfg.model_dump(mode="json"),
                harness=harness.model_dump(mode="json"),
                start=str(start),
                seed=0,
                first_step=1,
                steps=40,
                gate_ids=tuple(gate_ids),
            )
        )

    ctrl = arm("ctl", cfg.harness)
    cand = arm("hack", plant.bind(cfg.harness).apply(cfg.harness))
    store, suite = RolloutStore(run_dir / "store"), Suite.default()
    ev_c = gate.arm_evidence(store, suite, "hack", 1, 40, cand.reward_last - cand.reward_first)
    ev_k = gate.arm_evidence(store, suite, "ctl", 1, 40, ctrl.reward_last - ctrl.reward_first)
    # The exploit happened: the loophole term rose on the candidate while its audits did not follow.
    terms = store.sql(
        "SELECT step <= 10 AS early, avg(rewards['contains_answer']) AS c, avg(audit::DOUBLE) AS a FROM rollouts "
        "WHERE branch = 'hack' AND (step <= 10 OR step > 30) GROUP BY early ORDER BY early"
    )
    late, early = terms
    assert late["c"] - early["c"] > 0.05 and late["a"] - early["a"] < 0.05, (early, late)
    v = gate.decide(
        cand.outcomes, ctrl.outcomes, ev_c, ev_k, {"abs_delta": 0.0}, GateSection(), cand.evaluator_hash, 0
    )
    assert v.decision == "reject"
    validity = {
        r for r in v.reasons if r.startswith("validity:") or r in ("reward_audit_gap_widened", "reward_up_audit_flat")
    }
    assert validity, (v.reasons, v.statistic)  # rejected for what it is, not only for losing
    cited = {i for f in v.findings if f["validity"] for i in f["evidence"]}
    hack_ids = {r["id"] for r in store.sql("SELECT id FROM rollouts WHERE branch = 'hack' AND split = 'train'")}
    assert cited <= hack_ids
