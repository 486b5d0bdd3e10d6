"""The detector contract: a plain function over a window of rollouts (DuckDB over the store) and step
metrics that returns findings citing rollout ids."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import duckdb

Severity = Literal["info", "warning", "critical"]
# A finding cites at most this many rollouts, the most telling first.
MAX_EVIDENCE = 8
# A knob a finding implicates: a dotted harness path (harness/knobs.py), e.g. `reward_weights.format`.
KNOB_PATH = re.compile(r"^[A-Za-z_]\w*(\.[\w-]+)+$")


@dataclass(frozen=True)
class Finding:
    """One thing a detector saw. `evidence` holds a few rollout ids, the most telling first; `knobs`
    names the harness knobs (dotted paths, see harness/knobs.py) an intervention could change;
    `validity` marks findings that make a high training reward untrustworthy (the gate rejects on them).
    `flagged`: for a finding about particular rollouts, a query over the window returning all their ids
    (what lets the suite ask whether the window's own reward pays them; "" for aggregate findings).
    `demoted`: set when a validity finding's flagged rollouts are not paid by the reward while the
    audit fails them: the finding stays as a warning, and this says why, with its figures."""

    name: str
    severity: Severity
    value: float
    threshold: float
    evidence: tuple[str, ...]
    knobs: tuple[str, ...]
    message: str
    validity: bool = False
    branch: str = ""
    first_step: int = 0
    last_step: int = 0
    flagged: str = ""
    demoted: str = ""

    def to_record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "severity": self.severity,
            "value": float(self.value),
            "threshold": float(self.threshold),
            "evidence": list(self.evidence),
            "knobs": list(self.knobs),
            "message": self.message,
            "validity": self.validity,
            "branch": self.branch,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "flagged": self.flagged,
            "demoted": self.demoted,
        }


@dataclass
class Window:
    """What a detector reads (built by diagnostics/window.py open_window). `con` holds, restricted to
    the window: views `rollouts` (ROLLOUT_SCHEMA, train split) and `heldout` (audited held-out
    rollouts), the table `metrics` (long form: run, branch, step, name, value), the table
    `rollout_stats` (the train rollouts without their text: aggregate over this one, it is scanned
    once) and `shards` (path, step) for reading a few steps' text. `params` are the detector's
    calibrated parameters. check_detector (below) checks a detector against this contract."""

    con: duckdb.DuckDBPyConnection
    branch: str
    first_step: int
    last_step: int
    params: dict[str, float] = field(default_factory=dict)

    def rows(self, sql: str, args: list[Any] | None = None) -> list[dict[str, Any]]:
        cur = self.con.execute(sql, args or [])
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]

    def scalar(self, sql: str, args: list[Any] | None = None) -> Any:
        row = self.con.execute(sql, args or []).fetchone()
        return row[0] if row else None


# A detector: window -> findings. Parameters (thresholds) come in window.params, defaults from the suite.
Detector = Callable[[Window], list[Finding]]


# -- helpers for writing detectors ------------------------------------------------------------------------
def finding(
    w: Window,
    name: str,
    severity: Severity,
    value: float,
    threshold: float,
    evidence: list[str],
    knobs: tuple[str, ...],
    message: str,
    validity: bool = False,
    flagged: str = "",
) -> Finding:
    return Finding(
        name=name,
        severity=severity,
        value=float(value),
        threshold=float(threshold),
        evidence=tuple(evidence[:MAX_EVIDENCE]),
        knobs=knobs,
        message=message,
        validity=validity,
        branch=w.branch,
        first_step=w.first_step,
        last_step=w.last_step,
        flagged=flagged,
    )


def ids(w: Window, sql: str, args: list[Any] | None = None) -> list[str]:
    """The first column of a query, capped at MAX_EVIDENCE (the query orders: most telling first)."""
    return [r[0] for r in w.con.execute(sql + f" LIMIT {MAX_EVIDENCE}", args or []).fetchall()]


# -- the checker ---------------------------------------------------------------------------------------
class DetectorCheckError(AssertionError):
    """A detector broke the contract of diagnostics/detector.py."""


def check_detector(fn: Detector, window: Window) -> list[Finding]:
    """Run `fn` twice on `window` and check the contract: a list of Finding, the same both times,
    finite value and threshold, a known severity, at most MAX_EVIDENCE evidence ids that all exist in
    the window, non-empty dotted knob paths, and the window's branch and steps. Returns the findings."""
    first, second = fn(window), fn(window)
    name = getattr(fn, "__name__", repr(fn))
    if not isinstance(first, list) or not all(isinstance(f, Finding) for f in first):
        raise DetectorCheckError(f"{name}: must return a list of Finding, got {first!r:.200}")
    if [f.to_record() for f in first] != [f.to_record() for f in second]:
        raise DetectorCheckError(f"{name}: two runs on the same window disagree (detectors must be deterministic)")
    for f in first:
        where = f"{name} -> {f.name}"
        if not f.name or not isinstance(f.message, str) or not f.message:
            raise DetectorCheckError(f"{where}: name and message must be non-empty")
        if f.severity not in ("info", "warning", "critical"):
            raise DetectorCheckError(f"{where}: unknown severity {f.severity!r}")
        for attr in ("value", "threshold"):
            v = getattr(f, attr)
            if not isinstance(v, float) or not math.isfinite(v):
                raise DetectorCheckError(f"{where}: {attr} must be a finite float, got {v!r}")
        if not f.knobs or not all(isinstance(k, str) and KNOB_PATH.match(k) for k in f.knobs):
            raise DetectorCheckError(f"{where}: knobs must be non-empty dotted harness paths, got {f.knobs!r}")
        if len(f.evidence) > MAX_EVIDENCE or len(set(f.evidence)) != len(f.evidence):
            raise DetectorCheckError(
                f"{where}: evidence must be at most {MAX_EVIDENCE} distinct ids, got {len(f.evidence)}"
            )
        if f.evidence:
            found = {
                r[0]
                for r in window.con.execute(
                    "SELECT id FROM (SELECT id FROM rollouts UNION ALL SELECT id FROM heldout) "
                    "WHERE id IN (SELECT unnest(?::VARCHAR[]))",
                    [list(f.evidence)],
                ).fetchall()
            }
            missing = [i for i in f.evidence if i not in found]
            if missing:
                raise DetectorCheckError(f"{where}: evidence ids not in the window: {missing}")
        if (f.branch, f.first_step, f.last_step) != (window.branch, window.first_step, window.last_step):
            raise DetectorCheckError(f"{where}: branch/first_step/last_step must be the window's")
    return first
