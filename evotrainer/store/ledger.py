"""The run's ledger: branches, trials, verdicts, budget charges and finished stages, in one SQLite file.

SQLite because the ledger is small, relational and must be transactional: a stage's outputs (its
branches, trials, verdict, charges) and the mark that the stage is done are written in one
transaction, so a run killed at any point has either all of a stage's records or none of them, and
`resume` redoes exactly the stages that have no mark. Rollouts stay in the Parquet store; the ledger
cites them by id. Primary keys make every write idempotent (a redone stage replaces, never duplicates)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS stages (
    round INTEGER NOT NULL, stage TEXT NOT NULL, result TEXT NOT NULL, finished REAL NOT NULL,
    PRIMARY KEY (round, stage));
CREATE TABLE IF NOT EXISTS branches (
    id TEXT PRIMARY KEY, parent TEXT, round INTEGER NOT NULL, kind TEXT NOT NULL, checkpoint TEXT NOT NULL,
    harness_version TEXT NOT NULL, suite_version TEXT NOT NULL, first_step INTEGER NOT NULL,
    last_step INTEGER NOT NULL, seed INTEGER NOT NULL, heldout_accuracy REAL);
CREATE TABLE IF NOT EXISTS trials (
    id TEXT PRIMARY KEY, round INTEGER NOT NULL, candidate TEXT NOT NULL, control TEXT NOT NULL,
    intervention TEXT NOT NULL, source TEXT NOT NULL, skill_id TEXT, signature TEXT NOT NULL, replay TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS verdicts (
    trial TEXT PRIMARY KEY, round INTEGER NOT NULL, decision TEXT NOT NULL, reasons TEXT NOT NULL,
    statistic TEXT NOT NULL, noise TEXT NOT NULL, findings TEXT NOT NULL, budget TEXT NOT NULL,
    evaluator_hash TEXT NOT NULL, decided REAL NOT NULL);
CREATE TABLE IF NOT EXISTS charges (
    round INTEGER NOT NULL, stage TEXT NOT NULL, item TEXT NOT NULL, generated_tokens INTEGER NOT NULL,
    trained_tokens INTEGER NOT NULL, seconds REAL NOT NULL, llm_input_tokens INTEGER NOT NULL DEFAULT 0,
    llm_output_tokens INTEGER NOT NULL DEFAULT 0, llm_cost REAL NOT NULL DEFAULT 0, PRIMARY KEY (round, stage, item));
CREATE TABLE IF NOT EXISTS status (id INTEGER PRIMARY KEY CHECK (id = 0), round INTEGER, stage TEXT, detail TEXT,
    updated REAL, pid INTEGER);
"""

STAGES = ("train", "diagnose", "revise", "propose", "replay", "trial", "gate", "promote", "remember", "guard")


# Columns added after the first release, with their defaults: an older ledger gains them on open.
_ADDED_CHARGE_COLUMNS = {
    "llm_input_tokens": "INTEGER NOT NULL DEFAULT 0",
    "llm_output_tokens": "INTEGER NOT NULL DEFAULT 0",
    "llm_cost": "REAL NOT NULL DEFAULT 0",
}


@dataclass(frozen=True)
class Charge:
    """What a stage spent. The llm_* fields are an LLM proposer's prompt and completion tokens and
    their cost (at llm.price_*); its seconds are in `seconds`, so the time budget covers them."""

    generated_tokens: int = 0
    trained_tokens: int = 0
    seconds: float = 0.0
    llm_input_tokens: int = 0
    llm_output_tokens: int = 0
    llm_cost: float = 0.0

    def __add__(self, o: Charge) -> Charge:
        return Charge(
            self.generated_tokens + o.generated_tokens,
            self.trained_tokens + o.trained_tokens,
            self.seconds + o.seconds,
            self.llm_input_tokens + o.llm_input_tokens,
            self.llm_output_tokens + o.llm_output_tokens,
            self.llm_cost + o.llm_cost,
        )


class Ledger:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we open transactions ourselves (BEGIN IMMEDIATE) so that a stage's
        # records commit together; WAL keeps `evotrainer status` readers off the writer's back.
        self.con = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        self.con.execute("PRAGMA journal_mode=WAL")
        self.con.execute("PRAGMA synchronous=FULL")
        self.con.executescript(SCHEMA)
        have = {r[1] for r in self.con.execute("PRAGMA table_info(charges)")}
        for col, decl in _ADDED_CHARGE_COLUMNS.items():
            if col not in have:
                self.con.execute(f"ALTER TABLE charges ADD COLUMN {col} {decl}")

    def close(self) -> None:
        self.con.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.con.execute("BEGIN IMMEDIATE")
        try:
            yield self.con
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        self.con.execute("COMMIT")

    # -- meta ---------------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self.con.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])

    def record_skill_library(self, path: str) -> None:
        """The skill library the run reads and writes, as it opens; a resume under another adds it."""
        if path not in (libraries := self.skill_libraries()):
            self.set_meta("skill_libraries", json.dumps([*libraries, path]))

    def skill_libraries(self) -> list[str]:
        """Every skill library the run has read and written, first first ([] in ledgers from before)."""
        return json.loads(self.get_meta("skill_libraries") or "[]")

    def _per_library(self, key: str, path: str, make: Callable[[], Any]) -> Any:
        """`make()` recorded under meta `key` for the library at `path` on the run's first call for that path, the
        record read back on every later one (a resume), so a resumed run decides as the killed one did."""
        held = json.loads(self.get_meta(key) or "{}")
        if path not in held:
            held[path] = make()
            self.set_meta(key, json.dumps(held))
        return held[path]

    def library_seen(self, path: str, found: Callable[[], list[str]]) -> list[str]:
        """The evidence the skill library at `path` held when the run first opened it (SkillLibrary.evidence_keys)."""
        return self._per_library("skill_library_seen", path, found)

    def library_run(self, path: str, choose: Callable[[], str]) -> str:
        """The name this run's evidence carries in the skill library at `path` (`choose()`: skills.library.run_name),
        fixed when the run first opens that library, so a killed run resumes under the name it wrote with. Kept per
        library: a run resumed under another library (loop.skills_dir changed) is named against what that one holds."""

        def named() -> str:
            # A ledger from before names were kept per library named its first library's run alone.
            old = self.get_meta("skill_library_run") if path == (self.skill_libraries() or [path])[0] else None
            return old if old is not None else choose()

        return self._per_library("skill_library_runs", path, named)

    # -- stages -------------------------------------------------------------------------------------
    def stage_result(self, rnd: int, stage: str) -> dict[str, Any] | None:
        row = self.con.execute("SELECT result FROM stages WHERE round = ? AND stage = ?", [rnd, stage]).fetchone()
        return json.loads(row[0]) if row else None

    def finish_stage(
        self,
        rnd: int,
        stage: str,
        result: dict[str, Any],
        *,
        charges: dict[str, Charge] | None = None,
        branches: list[dict[str, Any]] = (),
        trials: list[dict[str, Any]] = (),
        verdicts: list[dict[str, Any]] = (),
    ) -> None:
        """A stage's records and its done mark, in one transaction."""
        with self.transaction() as c:
            for b in branches:
                c.execute(
                    "INSERT OR REPLACE INTO branches VALUES (:id, :parent, :round, :kind, :checkpoint, "
                    ":harness_version, :suite_version, :first_step, :last_step, :seed, :heldout_accuracy)",
                    b,
                )
            for t in trials:
                c.execute(
                    "INSERT OR REPLACE INTO trials VALUES (:id, :round, :candidate, :control, :intervention, :source, "
                    ":skill_id, :signature, :replay)",
                    _json_fields(t, ("intervention", "signature", "replay")),
                )
            for v in verdicts:
                c.execute(
                    "INSERT OR REPLACE INTO verdicts VALUES (:trial, :round, :decision, :reasons, :statistic, :noise, "
                    ":findings, :budget, :evaluator_hash, :decided)",
                    _json_fields(
                        {**v, "decided": time.time()}, ("reasons", "statistic", "noise", "findings", "budget")
                    ),
                )
            for item, ch in (charges or {}).items():
                c.execute(
                    "INSERT OR REPLACE INTO charges (round, stage, item, generated_tokens, trained_tokens, seconds, "
                    "llm_input_tokens, llm_output_tokens, llm_cost) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        rnd,
                        stage,
                        item,
                        ch.generated_tokens,
                        ch.trained_tokens,
                        ch.seconds,
                        ch.llm_input_tokens,
                        ch.llm_output_tokens,
                        ch.llm_cost,
                    ],
                )
            c.execute(
                "INSERT OR REPLACE INTO stages VALUES (?, ?, ?, ?)",
                [rnd, stage, json.dumps(result, default=str), time.time()],
            )
            # Fault injection for the resume tests: die inside the transaction, after the writes and
            # before the commit, which is the worst moment for a verdict write to be interrupted.
            if os.environ.get("EVOTRAINER_KILL_AT") == f"{rnd}:{stage}":
                os.kill(os.getpid(), signal.SIGKILL)

    def last_finished(self) -> tuple[int, str] | None:
        row = self.con.execute("SELECT round, stage FROM stages ORDER BY finished DESC LIMIT 1").fetchone()
        return (row[0], row[1]) if row else None

    # -- status (for `evotrainer status`; not part of the record) ------------------------------------
    def set_status(self, rnd: int, stage: str, detail: str = "") -> None:
        self.con.execute(
            "INSERT OR REPLACE INTO status VALUES (0, ?, ?, ?, ?, ?)", [rnd, stage, detail, time.time(), os.getpid()]
        )

    def status(self) -> dict[str, Any] | None:
        row = self.con.execute("SELECT round, stage, detail, updated, pid FROM status").fetchone()
        return dict(zip(("round", "stage", "detail", "updated", "pid"), row)) if row else None

    # -- reads --------------------------------------------------------------------------------------
    def rows(self, sql: str, args: list[Any] | None = None) -> list[dict[str, Any]]:
        cur = self.con.execute(sql, args or [])
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]

    def branches(self) -> list[dict[str, Any]]:
        return self.rows("SELECT * FROM branches ORDER BY round, id")

    def trials(self) -> list[dict[str, Any]]:
        return [
            _parse(t, ("intervention", "signature", "replay"))
            for t in self.rows("SELECT * FROM trials ORDER BY round, id")
        ]

    def verdicts(self) -> list[dict[str, Any]]:
        return [
            _parse(v, ("reasons", "statistic", "noise", "findings", "budget"))
            for v in self.rows("SELECT * FROM verdicts ORDER BY round, trial")
        ]

    def spent(self) -> Charge:
        g, t, s, li, lo, lc = self.con.execute(
            "SELECT coalesce(sum(generated_tokens), 0), coalesce(sum(trained_tokens), 0), coalesce(sum(seconds), 0), "
            "coalesce(sum(llm_input_tokens), 0), coalesce(sum(llm_output_tokens), 0), coalesce(sum(llm_cost), 0) "
            "FROM charges"
        ).fetchone()
        return Charge(int(g), int(t), float(s), int(li), int(lo), float(lc))

    def spent_by_stage(self) -> dict[str, Charge]:
        out = {}
        for r in self.rows(
            "SELECT stage, sum(generated_tokens) g, sum(trained_tokens) t, sum(seconds) s, sum(llm_input_tokens) li, "
            "sum(llm_output_tokens) lo, sum(llm_cost) lc FROM charges GROUP BY stage"
        ):
            out[r["stage"]] = Charge(
                int(r["g"]), int(r["t"]), float(r["s"]), int(r["li"]), int(r["lo"]), float(r["lc"])
            )
        return out


def _json_fields(d: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: (json.dumps(v, default=str) if k in keys else v) for k, v in d.items()}


def _parse(d: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: (json.loads(v) if k in keys and v is not None else v) for k, v in d.items()}
