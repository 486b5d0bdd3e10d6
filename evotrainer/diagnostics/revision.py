"""Diagnostic revision: the suite changes from evidence under the harness's discipline. Thresholds
recalibrate against audits, validated induced detectors join, detectors an agent wrote are admitted
or refused, and every change is backtested against past findings and verdicts; each change is a
record with its evidence and the flips it causes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from evotrainer.diagnostics import agent
from evotrainer.diagnostics.detector import Finding, check_detector
from evotrainer.diagnostics.induction import Induction, induce
from evotrainer.diagnostics.suite import DetectorSpec, Suite
from evotrainer.diagnostics.window import open_window
from evotrainer.store.rollouts import RolloutStore


# -- records ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PastVerdict:
    """A decision of record about one window of a branch. `reasons`: for a reject, the names of the
    validity findings the gate cited and/or other reasons (e.g. "no_gain"); the loop's ledger fills these."""

    branch: str
    first_step: int
    last_step: int
    decision: Literal["promote", "reject"]
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class Flip:
    """One earlier outcome a revised suite would change. what=`finding`: a finding `name` that
    appears (old "absent", new "present") or disappears in a window; what=`verdict`: a decision that
    would change (`promote` -> `reject`, or `reject` -> `review` when every reason it had is gone)."""

    what: Literal["finding", "verdict"]
    branch: str
    first_step: int
    last_step: int
    name: str
    old: str
    new: str
    detail: str
    validity: bool = False


@dataclass
class Revision:
    """One change of the suite: `recalibrate` (parameters moved) or `induce` (a detector added), the
    versions before and after, the new suite itself, the evidence, and the flips of the backtest."""

    kind: Literal["recalibrate", "induce"]
    old_version: str
    new_version: str
    suite: Suite
    evidence: dict[str, Any]
    flips: list[Flip] = field(default_factory=list)

    def to_record(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "old_version": self.old_version,
            "new_version": self.new_version,
            "suite": self.suite.model_dump(mode="json"),
            "evidence": self.evidence,
            "flips": [asdict(f) for f in self.flips],
        }


# -- (a) recalibration ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    """A rollout-level threshold and the per-rollout value it cuts: rollouts below it are the ones the
    detector treats as bad, so audit failures should fall below and passes above."""

    detector: str
    param: str
    value_sql: str
    """A column of the window's `rollout_stats` table."""


# Only thresholds whose meaning *is* the audit boundary are calibrated against it by default: "a
# rewarded rollout" should pass the audit. entropy_explosion.gibberish_logprob is not among them on
# purpose: on a real run most audit failures are plain wrong answers, and Youden's J then lifts the
# "garbled" cut to the policy's typical confidence (-3.0 -> -0.4 on the planted-exploit run), so
# every unsure rollout would count as gibberish. Pass it in `calibrations` where audits do track garbling.
GIBBERISH = Calibration("entropy_explosion", "gibberish_logprob", "mean_logprob")
CALIBRATIONS = (Calibration("reward_audit_gap", "rewarded_threshold", "reward"),)


def youden(values: np.ndarray, failed: np.ndarray, t: float) -> float:
    """Youden's J of `value < t` as a test for audit failure: true-positive rate minus false-positive rate."""
    below = values < t
    return float(below[failed].mean() - below[~failed].mean())


def best_cut(values: np.ndarray, failed: np.ndarray, current: float) -> tuple[float, float]:
    """(threshold, J) maximizing Youden's J over midpoints between distinct values; among equal J the
    one nearest the current value, so a threshold moves no further than the evidence asks."""
    vals = np.unique(values)
    cuts = (vals[:-1] + vals[1:]) / 2
    if len(cuts) == 0:
        return current, youden(values, failed, current)
    js = np.array([youden(values, failed, t) for t in cuts])
    top = np.flatnonzero(js >= js.max() - 1e-12)
    k = top[np.argmin(np.abs(cuts[top] - current))]
    return float(cuts[k]), float(js[k])


def recalibrate(
    suite: Suite,
    store: RolloutStore,
    branch: str,
    first_step: int,
    last_step: int,
    *,
    min_audited: int = 30,
    min_gain: float = 0.05,
    calibrations: tuple[Calibration, ...] = CALIBRATIONS,
) -> tuple[Suite, dict[str, Any]]:
    """Move each of `calibrations`' thresholds of the suite to the value that best separates audit-passing
    from audit-failing train rollouts of the window (Youden's J), when both classes have at least
    `min_audited` rollouts and the new J beats the current one by `min_gain`. Returns the revised
    suite (the same suite if nothing moved) and, per threshold, the old and new values and the counts."""
    evidence: dict[str, Any] = {}
    moves: dict[str, dict[str, float]] = {}
    w = open_window(store, branch, first_step, last_step)
    try:
        for c in calibrations:
            if (
                c.detector not in suite.detectors
                or suite.detectors[c.detector].rule
                or suite.detectors[c.detector].path
            ):
                continue
            old = float(suite.resolve(c.detector)[1][c.param])
            rows = w.con.execute(
                f"SELECT {c.value_sql}, NOT audit FROM rollout_stats WHERE audit IS NOT NULL "
                f"AND {c.value_sql} IS NOT NULL AND isfinite({c.value_sql})"
            ).fetchall()
            values = np.array([r[0] for r in rows], dtype=float)
            failed = np.array([r[1] for r in rows], dtype=bool)
            key = f"{c.detector}.{c.param}"
            rec: dict[str, Any] = {"old": old, "new": old, "passed": int((~failed).sum()), "failed": int(failed.sum())}
            evidence[key] = rec
            if rec["passed"] < min_audited or rec["failed"] < min_audited:
                rec["note"] = f"kept: fewer than {min_audited} audited passes or failures"
                continue
            t, j = best_cut(values, failed, old)
            j_old = youden(values, failed, old)
            rec.update(j_old=round(j_old, 4), j_new=round(j, 4))
            if j - j_old < min_gain:
                rec["note"] = f"kept: J {j_old:.3f} -> {j:.3f} gains less than {min_gain}"
                continue
            rec["new"], rec["note"] = t, f"moved: J {j_old:.3f} -> {j:.3f}"
            moves.setdefault(c.detector, {})[c.param] = t
    finally:
        w.con.close()
    if not moves:
        return suite, evidence
    # All moves of one recalibration make one revision: one new version whose parent is `suite`.
    detectors = {
        name: spec.model_copy(update={"params": {**spec.params, **moves[name]}}) if name in moves else spec
        for name, spec in suite.detectors.items()
    }
    return Suite(detectors=detectors, parent=suite.version), evidence


# -- (c) backtest -------------------------------------------------------------------------------------
WindowKey = tuple[str, int, int]  # (branch, first_step, last_step)


def stored_findings(store: RolloutStore) -> dict[tuple[str, WindowKey], list[dict[str, Any]]]:
    """Stored findings by (suite version, window); a window diagnosed clean maps to []."""
    out: dict[tuple[str, WindowKey], list[dict[str, Any]]] = {}
    for r in store.sql("SELECT suite_version, branch, first_step, last_step FROM diagnoses"):
        out.setdefault((r["suite_version"], (r["branch"], r["first_step"], r["last_step"])), [])
    for r in store.sql("SELECT * FROM findings ORDER BY suite_version, branch, first_step, last_step, name"):
        out.setdefault((r["suite_version"], (r["branch"], r["first_step"], r["last_step"])), []).append(r)
    return out


def backtest(
    store: RolloutStore,
    new: Suite,
    old: Suite,
    verdicts: tuple[PastVerdict, ...] | list[PastVerdict] = (),
    windows: list[WindowKey] | None = None,
) -> list[Flip]:
    """Rerun `new` on every past window and report each flip against `old`. Windows: those with stored
    findings (of any suite version) plus those of the verdicts, unless given. The old outcome of a
    window is its stored findings under old.version (the decisions of record) or, where `old` never
    diagnosed it (an intermediate revision), a rerun of `old`. Verdicts flip by the gate's rule: a
    promoted window that now has a validity finding `old` did not have becomes a reject; a reject
    whose every reason was an old validity finding that is gone, with no validity finding in its
    place, becomes reviewable (reasons that are not validity findings, such as "no_gain", stand)."""
    stored = stored_findings(store)
    if windows is None:
        windows = sorted({w for _, w in stored} | {(v.branch, v.first_step, v.last_step) for v in verdicts})
    flips: list[Flip] = []
    after: dict[WindowKey, list[Finding]] = {}
    before: dict[WindowKey, dict[str, bool]] = {}
    for win in windows:
        if (old.version, win) in stored:
            before[win] = {r["name"]: bool(r["validity"]) for r in stored[(old.version, win)]}
        else:
            before[win] = {f.name: f.validity for f in old.run(store, *win) if f.name != "detector_error"}
        after[win] = [f for f in new.run(store, *win) if f.name != "detector_error"]
        now = {f.name: f for f in after[win]}
        for name in sorted(set(now) - set(before[win])):
            flips.append(Flip("finding", *win, name, "absent", "present", now[name].message, now[name].validity))
        for name in sorted(set(before[win]) - set(now)):
            flips.append(
                Flip(
                    "finding",
                    *win,
                    name,
                    "present",
                    "absent",
                    f"{name} no longer fires under {new.version}",
                    before[win][name],
                )
            )
    for v in verdicts:
        win = (v.branch, v.first_step, v.last_step)
        now_valid = {f.name for f in after[win] if f.validity}
        old_valid = {n for n, valid in before[win].items() if valid}
        # Only a validity finding the old suite did not have flips a promote: one it had already was
        # overruled when the verdict was made, and is not this revision's doing.
        added = sorted(now_valid - old_valid)
        if v.decision == "promote" and added:
            flips.append(
                Flip(
                    "verdict",
                    *win,
                    "promote->reject",
                    "promote",
                    "reject",
                    f"new validity finding(s) under {new.version}: {', '.join(added)}",
                    True,
                )
            )
        if (
            v.decision == "reject"
            and v.reasons
            and set(v.reasons) <= old_valid
            and not now_valid
            and not set(v.reasons) & {f.name for f in after[win]}
        ):
            flips.append(
                Flip(
                    "verdict",
                    *win,
                    "reject->review",
                    "reject",
                    "review",
                    f"its reasons ({', '.join(v.reasons)}) no longer fire under {new.version}",
                    True,
                )
            )
    return flips


# -- the revision step ----------------------------------------------------------------------------------
def revise(
    suite: Suite,
    store: RolloutStore,
    branch: str,
    first_step: int,
    last_step: int,
    *,
    verdicts: tuple[PastVerdict, ...] | list[PastVerdict] = (),
    min_audited: int = 30,
    min_gain: float = 0.05,
    **induce_args: Any,
) -> tuple[Suite, list[Revision], Induction]:
    """One revision round over a window: (a) recalibrate, then (b) induce a detector where reward and
    audit disagree (rewarded = the suite's current `reward_audit_gap.rewarded_threshold`), each change
    (c) backtested against its parent. Returns the final suite, the revisions (none when nothing
    changed) and the induction, accepted or not, so a refusal is on record with its reason."""
    revisions: list[Revision] = []
    current = suite
    new, calib = recalibrate(current, store, branch, first_step, last_step, min_audited=min_audited, min_gain=min_gain)
    if new.version != current.version:
        evidence = {"window": [branch, first_step, last_step], "thresholds": calib}
        revisions.append(
            Revision(
                "recalibrate", current.version, new.version, new, evidence, backtest(store, new, current, verdicts)
            )
        )
        current = new
    if "reward_audit_gap" in current.detectors and not current.detectors["reward_audit_gap"].path:
        induce_args.setdefault("rewarded_threshold", current.resolve("reward_audit_gap")[1]["rewarded_threshold"])
    ind = induce(store, branch, first_step, last_step, **induce_args)
    if ind.accepted and ind.rule is not None:
        name = ind.rule.name
        if any(s.rule is not None and s.rule.clauses == ind.rule.clauses for s in current.detectors.values()):
            ind.reason += "; the suite already holds this rule"
        else:
            new = current.with_detector(name, DetectorSpec(rule=ind.rule))
            revisions.append(
                Revision(
                    "induce",
                    current.version,
                    new.version,
                    new,
                    ind.to_record(),
                    backtest(store, new, current, verdicts),
                )
            )
            current = new
    return current, revisions, ind


# -- (d) admission of detectors an agent wrote -------------------------------------------------------------
def admit(
    suite: Suite,
    store: RolloutStore,
    detectors: list[Any],
    branch: str,
    first_step: int,
    last_step: int,
    past_verdicts: list[PastVerdict],
) -> tuple[Suite, list[dict[str, Any]]]:
    """Each detector the agent wrote, in order: parse and statically check it, run it under
    check_detector on the round's window, confirm a validity claim against the window's audits (or
    keep it as a warning), then backtest the suite with it against the suite without it; a change to
    any past verdict refuses it. Returns the suite with the admitted ones and a record per detector."""
    records: list[dict[str, Any]] = []
    current = suite
    for k, raw in enumerate(detectors):
        rec: dict[str, Any] = {"proposed": raw, "admitted": False}
        records.append(rec)
        spec = _screened(current, raw, k, rec)
        if spec is not None:
            spec = _tried_on_window(current, store, rec["name"], spec, (branch, first_step, last_step), rec)
        if spec is None or not _backtest_clean(current, store, rec["name"], spec, past_verdicts, rec):
            continue
        current = current.with_detector(rec["name"], spec)
        rec.update(
            admitted=True,
            reason="passed check_detector and the backtest against past verdicts",
            suite_version=current.version,
        )
    return current, records


def _spec(query: agent.SqlQuery | agent.Predicate, params: dict[str, float]) -> DetectorSpec:
    return (
        DetectorSpec(sql=query, params=params)
        if isinstance(query, agent.SqlQuery)
        else DetectorSpec(python=query, params=params)
    )


def _screened(current: Suite, raw: Any, k: int, rec: dict[str, Any]) -> DetectorSpec | None:
    """The suite entry of a detector as written, or None with the reason in `rec`."""
    if k >= agent.PER_ROUND:
        rec["reason"] = f"more than {agent.PER_ROUND} detectors in one round"
        return None
    try:
        name, query, params = agent.parse(raw)
    except ValueError as e:
        rec["reason"] = str(e)
        return None
    rec["name"] = name
    spec = _spec(query, params)
    same = [n for n, s in current.detectors.items() if (s.sql, s.python) == (spec.sql, spec.python)]
    if sum(n.startswith(agent.PREFIX) for n in current.detectors) >= agent.PER_SUITE:
        rec["reason"] = f"the suite already holds {agent.PER_SUITE} agent detectors"
    elif name in current.detectors:
        rec["reason"] = f"the suite already has a detector named {name}"
    elif same:
        rec["reason"] = f"the same query is already in the suite as {same[0]}"
    else:
        return spec
    return None


def _tried_on_window(
    current: Suite, store: RolloutStore, name: str, spec: DetectorSpec, window: WindowKey, rec: dict[str, Any]
) -> DetectorSpec | None:
    """Run the detector on the round's window under check_detector; a validity claim the window's audits
    do not confirm is demoted to a plain detector. None (with the reason in `rec`) if it fails."""
    fn, params = current.with_detector(name, spec).resolve(name)
    w = open_window(store, *window, params)
    try:
        found = check_detector(fn, w)  # twice: deterministic, evidence ids exist, finite values
        hits = agent.flagged(w, spec.sql or spec.python)
        audit = dict(w.con.execute("SELECT id, audit FROM rollout_stats WHERE audit IS NOT NULL").fetchall())
    except Exception as e:  # noqa: BLE001 -- whatever the agent's code does, it is a refusal, not a crash
        rec["reason"] = f"{type(e).__name__}: {e}"
        return None
    finally:
        w.con.close()
    audited = [audit[i] for i in hits if i in audit]
    fail = sum(a is False for a in audited) / len(audited) if audited else 0.0
    rec["window"] = {
        "branch": window[0],
        "first_step": window[1],
        "last_step": window[2],
        "flagged": len(hits),
        "audited": len(audited),
        "audit_fail_share": round(fail, 4),
        "findings": [f.to_record() for f in found],
    }
    q = spec.sql or spec.python
    if q.validity and (len(audited) < agent.VALIDITY_MIN_AUDITED or fail < agent.VALIDITY_MIN_FAIL):
        spec = _spec(q.model_copy(update={"validity": False}), dict(spec.params))
        rec["validity_demoted"] = (
            f"claims validity, but the audits do not confirm it on the window ({len(audited)} audited "
            f"matches, {100 * fail:.0f}% failing; needs {agent.VALIDITY_MIN_AUDITED} and "
            f"{100 * agent.VALIDITY_MIN_FAIL:.0f}%): kept as a non-validity detector"
        )
    return spec


def _backtest_clean(
    current: Suite,
    store: RolloutStore,
    name: str,
    spec: DetectorSpec,
    past_verdicts: list[PastVerdict],
    rec: dict[str, Any],
) -> bool:
    """The detector runs on every past window and the suite with it changes no past verdict."""
    # A backtest reads a detector that raises as silent (its error is an info finding it drops), so
    # first the detector alone on every window the backtest will read: it must run on all of them.
    windows = sorted(
        {w for _, w in stored_findings(store)} | {(v.branch, v.first_step, v.last_step) for v in past_verdicts}
    )
    alone = Suite(detectors={name: spec})
    errors = [
        f"{b} {lo}-{hi}: {f.message}"
        for b, lo, hi in windows
        for f in alone.run(store, b, lo, hi)
        if f.name == "detector_error"
    ]
    if errors:
        rec["reason"] = f"fails on {len(errors)} past window(s), e.g. {errors[0]}"
        return False
    try:
        flips = backtest(store, current.with_detector(name, spec), current, list(past_verdicts), windows)
    except Exception as e:  # noqa: BLE001
        rec["reason"] = f"backtest failed: {type(e).__name__}: {e}"
        return False
    verdict_flips = [f for f in flips if f.what == "verdict"]
    rec["backtest"] = {
        "verdict_flips": [
            f"{f.branch} {f.first_step}-{f.last_step}: {f.old} -> {f.new} ({f.detail})" for f in verdict_flips
        ],
        "finding_flips": len(flips) - len(verdict_flips),
    }
    if verdict_flips:
        rec["reason"] = f"would change {len(verdict_flips)} past verdict(s)"
        return False
    return True
