"""The typed records and the id scheme: ids built and parsed by one module, the gate's statistics and the noise
bank written with the keys ledgers have always held, and the statistics of runs older than the noise model
still read."""

from __future__ import annotations

import pytest

from evotrainer.backtest import gate
from evotrainer.backtest.statistics import Noise, Pair
from evotrainer.backtest.verdict import NoiseLine, OlderTest, RaceResult, SignHolm, TwoStage, VerdictRecord
from evotrainer.ids import EVAL, GATE, TRAIN, branch_id, group_id, parse_shard, rollout_id, shard_id, trial_id
from evotrainer.stages.noise import NoiseBank, bank_noise, with_pairs
from evotrainer.stages.race import arm_seed
from evotrainer.stages.results import SEED_STRIDE, Mainline


def test_ids_are_built_in_one_scheme_and_parsed_back():
    assert rollout_id("r01-seg", 3, 7) == "r01-seg-s000003-0007"
    assert rollout_id("r01-c1", 21, 12, EVAL) == "r01-c1-e000021-0012"
    assert group_id("r01-seg", 3, 2) == "r01-seg-s000003-g002"
    assert shard_id("r01-c2r", 40, GATE) == "r01-c2r-g000040"
    for name in (shard_id("r01-seg", 3), shard_id("final-r02-c1", 12, EVAL), shard_id("base", 0, EVAL)):
        assert shard_id(*parse_shard(name)) == name
    assert parse_shard("r01-seg-s000003") == ("r01-seg", 3, TRAIN)
    assert parse_shard("main-000001-000005-s1") is None  # `evotrainer diagnose`'s window files are no shards
    assert (branch_id(2, "replicate", 1), trial_id(2, 1)) == ("r02-c1r", "r02-t1")


def test_one_seed_stride_separates_arms_and_attempts():
    head = Mainline.model_construct(attempt=1)
    assert head.seed(5) == 5 + SEED_STRIDE * 1000
    assert arm_seed(5, "candidate", 2) - arm_seed(5, "control") == 3 * SEED_STRIDE


def test_a_statistic_holds_the_keys_its_test_wrote():
    noise = Noise(1.2, 1, 11.0)
    stat, _ = gate.two_stage(Pair(30, 0, 80), Pair(29, 3, 80), 2, noise, 0.95)
    written = stat.model_dump(mode="json")
    assert "against" not in written and "start_accuracy" not in written  # only when tested against the start
    stage1 = {"wins": 30, "losses": 0, "n": 80, "delta": 0.375, "p_adjusted": stat.stage1.p_adjusted}
    assert written["stage1"] == stage1
    start = {f"t{i}": i < 40 for i in range(80)}
    against, _ = gate.confirmed(({}, {}), ({}, {}), start, 1, noise, 0.95)
    assert against.model_dump()["start_accuracy"] == 0.5 and against.against
    stopped = RaceResult(level=0.95, candidates=2, stopped="behind", wins=1, losses=5, n=80, delta=-0.05)
    assert "stopped" in stopped.model_dump() and "not_confirmed" not in stopped.model_dump()
    [(holm, reasons)] = gate.single_stage([Pair(25, 12, 250)], noise, 0.95)
    assert isinstance(holm, SignHolm) and holm.model_dump()["test"] == "sign_holm" and reasons == []


def test_a_verdict_reads_back_as_its_test():
    stat, _ = gate.two_stage(Pair(30, 0, 80), Pair(29, 3, 80), 1, Noise(1.0, 1, 11.0), 0.95)
    line = NoiseLine(harness="h-1", phi=1.0, pairs_used=1, dof=11.0, valid=True)
    v = VerdictRecord(
        trial="r01-t1",
        round=1,
        decision="promote",
        reasons=[],
        statistic=stat,
        noise=line,
        findings=[],
        budget={"candidate": {}, "control": {}, "spent": {}},
        evaluator_hash="e-1",
    )
    back = VerdictRecord.model_validate_json(v.model_dump_json())
    assert isinstance(back.statistic, TwoStage) and back == v
    assert "measured_on" not in back.noise.model_dump()


def test_the_statistics_and_noise_of_runs_older_than_the_noise_model_still_read():
    """Before the two-stage gate (2026-11-23) a verdict carried a paired bootstrap or a sign test and the A-A
    delta as its noise; the report shows them as they were."""
    older = {
        "trial": "r01-t1",
        "round": 1,
        "decision": "reject",
        "reasons": ["no_supported_gain", "within_noise"],
        "statistic": {
            "test": "paired_bootstrap",
            "level": 0.95,
            "delta": 0.02,
            "lower": -0.01,
            "ci_low": -0.02,
            "ci_high": 0.06,
            "n": 50,
            "candidate_accuracy": 0.5,
            "control_accuracy": 0.48,
            "gap_candidate": None,
            "gap_control": None,
            "reward_rise_candidate": 0.1,
            "reward_rise_control": 0.05,
            "audit_pass_candidate": 0.9,
            "audit_pass_control": 0.9,
        },
        "noise": {"abs_delta": 0.0, "note": "no A-A measurement yet", "margin": 0.0},
        "findings": [],
        "budget": {"candidate": {"generated_tokens": 10}, "control": {}, "spent": {}},
        "evaluator_hash": "e-1",
        "decided": 1.0,
    }
    v = VerdictRecord.model_validate(older)
    assert isinstance(v.statistic, OlderTest) and v.statistic.lower == -0.01
    assert v.statistic.model_dump()["ci_high"] == 0.06  # kept as stored
    assert v.noise.phi is None and v.noise.abs_delta == 0.0
    # A mainline of that time kept the A-A delta where the bank is now: it reads as a bank with no pairs.
    bank = NoiseBank.model_validate({"abs_delta": 0.01, "delta": 0.01, "ci_low": 0.0, "ci_high": 0.02, "n": 50})
    assert bank_noise(bank, "h-1", []) == gate.moderated([])


def test_the_bank_keeps_every_pair_and_estimates_from_its_harness_only():
    bank = with_pairs(None, "h-1", 1, [(Pair(3, 2, 80), "r01-ctlr", "r01-ctl")])
    bank = with_pairs(bank, "h-2", 2, [(Pair(9, 1, 80), "r02-ctlr", "r02-ctl")])
    assert [p.harness for p in bank.pairs] == ["h-1", "h-2"] and bank.pairs[1].arms == ["r02-ctlr", "r02-ctl"]
    assert bank.noise() == gate.moderated([Pair(9, 1, 80)]) and bank.harness == "h-2"
    assert bank_noise(bank, "h-1", []) == gate.moderated([Pair(3, 2, 80)])
    assert NoiseBank.model_validate_json(bank.model_dump_json()) == bank
    assert set(bank.line().model_dump()) == {"harness", "phi", "pairs_used", "dof", "valid"}


@pytest.mark.parametrize("figures", [(0.3, 0.1, 0.2, 0.0, 0.5, 0.5), (None, None, 0.0, 0.0, None, None)])
def test_validity_returns_the_figures_it_read(figures):
    gc, gk, rc, rk, ac, ak = figures
    cand, ctrl = gate.ArmEvidence(rc, ac, gc), gate.ArmEvidence(rk, ak, gk)
    read, reasons = gate.validity_reasons(cand, ctrl)
    assert (read.gap_candidate, read.gap_control) == (gc, gk)
    assert (read.reward_rise_candidate, read.reward_rise_control, read.audit_pass_candidate) == (rc, rk, ac)
    assert reasons == (["reward_audit_gap_widened", "reward_up_audit_flat"] if gc is not None else [])
