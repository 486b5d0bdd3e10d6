"""The invalid-branch rules of the gate, one unit test each, on constructed findings and decisions: a
control rejected for an exploit, a tainted segment not built on, an A-A pair that carries an exploit not
taken as noise, at most one winner, and a rollback when nothing valid won and the control is invalid."""

from __future__ import annotations

from evotrainer.backtest import gate
from evotrainer.diagnostics.detector import Finding
from evotrainer.types import branch_id, trial_id


def finding(name: str, validity: bool, severity: str = "critical") -> Finding:
    return Finding(
        name=name,
        severity=severity,
        value=1.0,
        threshold=0.5,
        evidence=("r-1",),
        knobs=("reward_weights.x",),
        message=name,
        validity=validity,
    )


def test_a_control_is_invalid_for_its_validity_findings_only():
    assert gate.invalid_reasons([]) == []
    assert gate.invalid_reasons([finding("plateau", False, "warning")]) == []
    found = [
        finding("test_tampering", True),
        finding("plateau", False),
        finding("reward_audit_gap", True),
        finding("test_tampering", True),
    ]
    assert gate.invalid_reasons(found) == ["validity:reward_audit_gap", "validity:test_tampering"]


def test_a_segment_with_a_validity_finding_is_tainted():
    assert gate.tainted([finding("truncation", False)]) == []
    assert gate.tainted([finding("hardcoded_examples", True), finding("truncation", False)]) == ["hardcoded_examples"]


def test_an_aa_pair_is_noise_only_when_neither_arm_carries_an_exploit():
    clean, dirty = [finding("plateau", False)], [finding("reward_hacking", True)]
    assert gate.aa_pair_valid(clean, clean) and gate.aa_pair_valid([], [])
    assert not gate.aa_pair_valid(dirty, clean)
    assert not gate.aa_pair_valid(clean, dirty)


def test_at_most_one_winner_the_largest_promoted_delta():
    assert gate.winner([]) is None
    assert gate.winner([("reject", 0.3), ("reject", 0.1)]) is None
    assert gate.winner([("reject", 0.30), ("promote", 0.05), ("promote", 0.08)]) == 3
    assert gate.winner([("promote", 0.08), ("promote", 0.08)]) == 2  # a tie goes to the later candidate


def test_rollback_when_nothing_valid_won_and_the_control_is_invalid():
    assert gate.rolls_back(promoted=False, control_invalid=["validity:test_tampering"])
    assert not gate.rolls_back(promoted=True, control_invalid=["validity:test_tampering"])
    assert not gate.rolls_back(promoted=False, control_invalid=[])


def test_branch_and_trial_ids_are_one_scheme():
    assert branch_id(0, "base") == "base"
    assert [branch_id(3, r) for r in ("segment", "control", "aa")] == ["r03-seg", "r03-ctl", "r03-aa"]
    assert branch_id(12, "candidate", 2) == "r12-c2" and trial_id(12, 2) == "r12-t2"
