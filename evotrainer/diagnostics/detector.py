"""The detector contract: a plain function over a window of rollouts (DuckDB over the store) and step
metrics that returns findings citing rollout ids."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import duckdb

Severity = Literal["info", "warning", "critical"]


@dataclass(frozen=True)
class Finding:
    """One thing a detector saw. `evidence` holds a few rollout ids, the most telling first; `knobs`
    names the harness knobs (dotted paths, see harness/knobs.py) an intervention could change;
    `validity` marks findings that make a high training reward untrustworthy (the gate rejects on them)."""

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

    def to_record(self) -> dict[str, Any]:
        return {"name": self.name, "severity": self.severity, "value": float(self.value), "threshold": float(self.threshold),
                "evidence": list(self.evidence), "knobs": list(self.knobs), "message": self.message,
                "validity": self.validity, "branch": self.branch, "first_step": self.first_step, "last_step": self.last_step}


@dataclass
class Window:
    """What a detector reads (built by diagnostics/suite.py open_window). `con` holds, restricted to
    the window: views `rollouts` (ROLLOUT_SCHEMA, train split) and `heldout` (audited held-out
    rollouts), the table `metrics` (long form: run, branch, step, name, value), the table
    `rollout_stats` (the train rollouts without their text: aggregate over this one, it is scanned
    once) and `shards` (path, step) for reading a few steps' text. `params` are the detector's
    calibrated parameters. check_detector (suite.py) checks a detector against this contract."""

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
