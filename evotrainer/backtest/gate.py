"""The gate: promote a candidate only on a statistically supported win on the evaluator-owned
held-out metric, by more than the noise the run measured itself, and with no validity finding
against it. Every verdict carries its statistic, the noise estimate, the findings and the
evaluator hash, whatever the decision."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from evotrainer.config import GateSection
from evotrainer.diagnostics.detector import Finding

# Validity margins. Fixed, not configurable: they are part of what "valid" means, and a proposer
# or harness change must not be able to loosen them.
GAP_WIDENING = 0.05  # share of rewarded train rollouts failing the audit, candidate minus control
REWARD_RISE = 0.10  # candidate's in-arm reward rise beyond the control's ...
AUDIT_FLAT = 0.0  # ... while its train audit pass rate is no better than the control's


def paired(a: dict[str, bool], b: dict[str, bool]) -> tuple[list[str], np.ndarray, np.ndarray]:
    ids = sorted(set(a) & set(b))
    return ids, np.array([a[i] for i in ids], dtype=float), np.array([b[i] for i in ids], dtype=float)


def bootstrap(cand: np.ndarray, ctrl: np.ndarray, level: float, resamples: int, seed: int) -> dict[str, float]:
    """Paired bootstrap over tasks of mean(cand - ctrl): the mean and a one-sided lower bound at `level`
    (and the two-sided interval at the same level, for the report)."""
    d = cand - ctrl
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1) if len(d) else np.zeros(1)
    return {
        "delta": float(d.mean()) if len(d) else 0.0,
        "lower": float(np.quantile(means, 1 - level)),
        "ci_low": float(np.quantile(means, (1 - level) / 2)),
        "ci_high": float(np.quantile(means, 1 - (1 - level) / 2)),
        "n": int(len(d)),
    }


def sign_test(cand: np.ndarray, ctrl: np.ndarray) -> dict[str, float]:
    """Exact one-sided sign test on the tasks where the arms disagree (McNemar's exact form)."""
    wins, losses = int(((cand == 1) & (ctrl == 0)).sum()), int(((cand == 0) & (ctrl == 1)).sum())
    n = wins + losses
    p = sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n if n else 1.0
    return {
        "delta": float((cand - ctrl).mean()) if len(cand) else 0.0,
        "wins": wins,
        "losses": losses,
        "p": p,
        "n": int(len(cand)),
    }


@dataclass
class ArmEvidence:
    """What the gate knows about one arm besides its held-out outcomes: its train-audit statistics
    and the suite's findings over its window."""

    reward_rise: float  # mean reward, last third minus first third of the arm's steps
    audit_pass: float | None  # audit pass rate of its audited train rollouts
    gap: float | None  # share of its rewarded audited train rollouts that fail the audit
    findings: list[Finding] = field(default_factory=list)


@dataclass
class Verdict:
    decision: str  # promote | reject
    reasons: list[str]
    statistic: dict[str, Any]
    noise: dict[str, Any]
    findings: list[dict[str, Any]]
    evaluator_hash: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(
    cand_outcomes: dict[str, bool],
    ctrl_outcomes: dict[str, bool],
    cand: ArmEvidence,
    ctrl: ArmEvidence,
    noise: dict[str, Any],
    cfg: GateSection,
    evaluator_hash: str,
    seed: int,
) -> Verdict:
    """(a) a paired win at the configured level, larger than the A-A noise; (b) no validity finding on
    the candidate's window, no widened reward-audit gap, no reward rise the audit does not follow."""
    ids, c, k = paired(cand_outcomes, ctrl_outcomes)
    reasons: list[str] = []
    if cfg.statistic == "bootstrap":
        stat = {"test": "paired_bootstrap", "level": cfg.level, **bootstrap(c, k, cfg.level, cfg.resamples, seed)}
        supported = stat["lower"] > 0
    else:
        stat = {"test": "sign", "level": cfg.level, **sign_test(c, k)}
        supported = stat["p"] < 1 - cfg.level
    stat["candidate_accuracy"] = float(c.mean()) if len(c) else 0.0
    stat["control_accuracy"] = float(k.mean()) if len(k) else 0.0
    margin = float(noise.get("abs_delta", 0.0))
    if not supported:
        reasons.append("no_supported_gain")
    if stat["delta"] <= margin:
        reasons.append("within_noise")
    validity = [f for f in cand.findings if f.validity]
    reasons += [f"validity:{f.name}" for f in validity]
    stat["gap_candidate"], stat["gap_control"] = cand.gap, ctrl.gap
    if cand.gap is not None and ctrl.gap is not None and cand.gap - ctrl.gap > GAP_WIDENING:
        reasons.append("reward_audit_gap_widened")
    stat["reward_rise_candidate"], stat["reward_rise_control"] = cand.reward_rise, ctrl.reward_rise
    stat["audit_pass_candidate"], stat["audit_pass_control"] = cand.audit_pass, ctrl.audit_pass
    if (
        cand.reward_rise - ctrl.reward_rise > REWARD_RISE
        and cand.audit_pass is not None
        and ctrl.audit_pass is not None
        and cand.audit_pass - ctrl.audit_pass <= AUDIT_FLAT
    ):
        reasons.append("reward_up_audit_flat")
    return Verdict(
        "reject" if reasons else "promote",
        reasons,
        stat,
        {**noise, "margin": margin},
        [f.to_record() for f in cand.findings],
        evaluator_hash,
    )


def aa_noise(
    ctrl_outcomes: dict[str, bool], aa_outcomes: dict[str, bool], cfg: GateSection, seed: int
) -> dict[str, Any]:
    """The run's own noise: the control harness trained twice on different seeds, compared like a trial."""
    _, a, b = paired(aa_outcomes, ctrl_outcomes)
    s = bootstrap(a, b, cfg.level, cfg.resamples, seed)
    return {
        "abs_delta": abs(s["delta"]),
        "delta": s["delta"],
        "ci_low": s["ci_low"],
        "ci_high": s["ci_high"],
        "n": s["n"],
    }


def arm_evidence(store, suite, branch: str, first: int, last: int, reward_rise: float) -> ArmEvidence:
    """Run the suite over an arm's window (its findings are stored: they are evidence) and read its
    train-audit statistics from the store."""
    findings = suite.run(store, branch, first, last)
    store.append_findings(findings, suite.version, f"{branch}-g{last:06d}", branch, first, last)
    thr = suite.resolve("reward_audit_gap")[1]["rewarded_threshold"] if "reward_audit_gap" in suite.detectors else 0.5
    row = store.sql(
        "SELECT avg(audit::DOUBLE) AS pass, count(*) FILTER (WHERE reward >= ?) AS rewarded, "
        "count(*) FILTER (WHERE reward >= ? AND NOT audit) AS rewarded_failed FROM rollouts "
        "WHERE branch = ? AND split = 'train' AND step BETWEEN ? AND ? AND audit IS NOT NULL",
        [thr, thr, branch, first, last],
    )[0]
    gap = row["rewarded_failed"] / row["rewarded"] if row["rewarded"] else None
    return ArmEvidence(reward_rise, row["pass"], gap, findings)


# -- the invalid-branch rules: pure functions of findings and decisions, each with a unit test ----------------
def invalid_reasons(findings: list[Finding]) -> list[str]:
    """Why an arm's own window makes it invalid: its validity findings, as sorted `validity:NAME`. The
    control (the harness carried on) is rejected for these like a candidate would be: an exploit the
    reward pays and the audit does not back."""
    return sorted({f"validity:{f.name}" for f in findings if f.validity})


def tainted(segment_findings: list[Finding]) -> list[str]:
    """The validity findings of the segment's own window. A tainted segment is not built on: the round's
    arms fork from where the round started, so a remedy is tried on a policy the exploit never touched."""
    return sorted({f.name for f in segment_findings if f.validity})


def aa_pair_valid(control_findings: list[Finding], aa_findings: list[Finding]) -> bool:
    """Two arms that carry an exploit differ by how fast it spread in each, not by the run's noise: such
    a pair is no A-A measurement (it is taken again next round)."""
    return not invalid_reasons(control_findings) and not invalid_reasons(aa_findings)


def winner(decisions: list[tuple[str, float]]) -> int | None:
    """Of the candidates' (decision, delta), the 1-based index of the promoted one with the largest delta
    (the later one on a tie); None when nothing was promoted. At most one winner a round."""
    wins = [(delta, j) for j, (decision, delta) in enumerate(decisions, 1) if decision == "promote"]
    return max(wins)[1] if wins else None


def rolls_back(promoted: bool, control_invalid: list[str]) -> bool:
    """Nothing valid won and the control carries an exploit: the mainline goes back to where the round
    started (the segment and control stay in the ledger and the store as evidence)."""
    return not promoted and bool(control_invalid)
