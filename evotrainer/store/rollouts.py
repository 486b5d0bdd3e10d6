"""The rollout store: append-only Parquet shards written atomically (write, fsync, rename), queried in
place with DuckDB. Step metrics live beside rollouts, in long form (one row per metric)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from evotrainer.store.files import atomic_write_bytes
from evotrainer.types import Rollout

TURN = pa.struct(
    [
        ("action", pa.string()),
        ("tokens", pa.int32()),
        ("mean_logprob", pa.float64()),
        ("observation", pa.string()),
        ("tool_error", pa.bool_()),
    ]
)
ROLLOUT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("run", pa.string()),
        ("branch", pa.string()),
        ("step", pa.int64()),
        ("harness_version", pa.string()),
        ("task_id", pa.string()),
        ("split", pa.string()),
        ("group_id", pa.string()),
        ("difficulty", pa.int32()),
        ("prompt", pa.string()),
        ("turns", pa.list_(TURN)),
        ("num_turns", pa.int32()),
        ("completion_tokens", pa.int32()),
        ("max_action_tokens", pa.int32()),
        ("termination", pa.string()),
        ("rewards", pa.map_(pa.string(), pa.float64())),
        ("reward", pa.float64()),
        ("audit", pa.bool_()),
        ("info", pa.string()),
        ("gen_seconds", pa.float64()),
        ("env_seconds", pa.float64()),
    ]
)
METRIC_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("branch", pa.string()),
        ("step", pa.int64()),
        ("name", pa.string()),
        ("value", pa.float64()),
    ]
)
# Findings are evidence too: every diagnosis is kept with the suite version that made it, so a revised
# suite can be backtested against the decisions the old one supported.
FINDING_SCHEMA = pa.schema(
    [
        ("suite_version", pa.string()),
        ("branch", pa.string()),
        ("first_step", pa.int64()),
        ("last_step", pa.int64()),
        ("name", pa.string()),
        ("severity", pa.string()),
        ("value", pa.float64()),
        ("threshold", pa.float64()),
        ("evidence", pa.list_(pa.string())),
        ("knobs", pa.list_(pa.string())),
        ("message", pa.string()),
        ("validity", pa.bool_()),
        ("flagged", pa.string()),
        ("demoted", pa.string()),
    ]
)
# One row per diagnosis, findings or not: a window diagnosed clean is a decision of record too.
DIAGNOSIS_SCHEMA = pa.schema(
    [
        ("suite_version", pa.string()),
        ("branch", pa.string()),
        ("first_step", pa.int64()),
        ("last_step", pa.int64()),
        ("findings", pa.int64()),
    ]
)


# A reward term named in SQL: `rewards['x']`, `rewards.x`, `rewards."x"`, `element_at(rewards, 'x')` or
# `map_extract(rewards, 'x')`. DuckDB reads a key the map lacks as NULL, so a misspelt term would filter every
# row out without a word.
_TERM_IN_SQL = re.compile(
    r"""\brewards\s*\[\s*'(?P<index>(?:[^']|'')*)'\s*\]"""
    r"""|\brewards\s*\.\s*(?:"(?P<quoted>(?:[^"]|"")*)"|(?P<bare>[A-Za-z_]\w*))"""
    r"""|\b(?:element_at|map_extract)\s*\(\s*rewards\s*,\s*'(?P<call>(?:[^']|'')*)'""",
    re.IGNORECASE,
)


def reward_terms_named(sql: str) -> list[str]:
    """The reward terms a SQL condition reads from the `rewards` map, in order, each once."""
    names = []
    for m in _TERM_IN_SQL.finditer(sql):
        quote = '"' if m["quoted"] is not None else "'"
        name = next(g for g in (m["index"], m["quoted"], m["bare"], m["call"]) if g is not None)
        names.append(name.replace(quote * 2, quote))
    return list(dict.fromkeys(names))


def atomic_write_parquet(table: pa.Table, path: Path) -> None:
    """Readers see the whole shard or nothing: the temporary name does not match *.parquet, and
    rename is atomic within a directory. A killed writer leaves at most a hidden .tmp file."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(path, sink.getvalue().to_pybytes())


class RolloutStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.rollout_dir = self.root / "rollouts"
        self.metric_dir = self.root / "metrics"
        self.finding_dir = self.root / "findings"
        self.diagnosis_dir = self.root / "diagnoses"
        for d in (self.rollout_dir, self.metric_dir, self.finding_dir, self.diagnosis_dir):
            d.mkdir(parents=True, exist_ok=True)
            _remove_orphans(d)

    # -- writing ---------------------------------------------------------------------------------
    def append(self, rollouts: Iterable[Rollout], shard: str) -> Path:
        """Write one shard. Shard names are deterministic (branch and step), so re-running a step
        after a crash replaces its shard instead of duplicating its rollouts."""
        recs = [r.to_record() for r in rollouts]
        for rec in recs:
            rec["rewards"] = [(d["term"], d["value"]) for d in rec["rewards"]]
        path = self.rollout_dir / f"{shard}.parquet"
        atomic_write_parquet(pa.Table.from_pylist(recs, schema=ROLLOUT_SCHEMA), path)
        return path

    def append_metrics(self, run: str, branch: str, step: int, metrics: dict[str, float], shard: str) -> Path:
        rows = [{"run": run, "branch": branch, "step": step, "name": k, "value": float(v)} for k, v in metrics.items()]
        path = self.metric_dir / f"{shard}.parquet"
        atomic_write_parquet(pa.Table.from_pylist(rows, schema=METRIC_SCHEMA), path)
        return path

    def append_findings(
        self, findings: Iterable[Any], suite_version: str, shard: str, branch: str, first_step: int, last_step: int
    ) -> Path:
        """Findings of one diagnosis (a window under one suite version), then its diagnosis row, which
        is written last and so marks the diagnosis complete. The shard name identifies it: diagnosing
        the same window again with the same suite replaces rather than duplicates."""
        rows = [{**f.to_record(), "suite_version": suite_version} for f in findings]
        path = self.finding_dir / f"{shard}.parquet"
        atomic_write_parquet(pa.Table.from_pylist(rows, schema=FINDING_SCHEMA), path)
        atomic_write_parquet(
            pa.Table.from_pylist(
                [
                    {
                        "suite_version": suite_version,
                        "branch": branch,
                        "first_step": first_step,
                        "last_step": last_step,
                        "findings": len(rows),
                    }
                ],
                schema=DIAGNOSIS_SCHEMA,
            ),
            self.diagnosis_dir / f"{shard}.parquet",
        )
        return path

    # -- reading ---------------------------------------------------------------------------------
    def connect(self) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB with views `rollouts` and `metrics` over the shards (read in place)."""
        con = duckdb.connect(":memory:")
        for view, d, schema in (
            ("rollouts", self.rollout_dir, ROLLOUT_SCHEMA),
            ("metrics", self.metric_dir, METRIC_SCHEMA),
            ("findings", self.finding_dir, FINDING_SCHEMA),
            ("diagnoses", self.diagnosis_dir, DIAGNOSIS_SCHEMA),
        ):
            if any(d.glob("*.parquet")):
                con.execute(
                    f"CREATE VIEW {view} AS SELECT * FROM read_parquet('{d.as_posix()}/*.parquet', union_by_name=true)"
                )
            else:
                con.register(f"_empty_{view}", schema.empty_table())
                con.execute(f"CREATE VIEW {view} AS SELECT * FROM _empty_{view}")
        return con

    def unreadable(self) -> list[tuple[Path, str]]:
        """(shard, why) for each shard whose Parquet footer does not read (truncated, overwritten): a
        footer-only read per shard, for a resumed run's check and to name the file behind a failed query."""
        out = []
        for d in (self.rollout_dir, self.metric_dir, self.finding_dir, self.diagnosis_dir):
            for p in sorted(d.glob("*.parquet")):
                try:
                    pq.read_metadata(p)
                except (pa.ArrowException, OSError) as e:
                    out.append((p, f"not a whole Parquet file ({p.stat().st_size} bytes; {str(e).split('. ')[0]})"))
        return out

    def sql(self, query: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        con = self.connect()
        try:
            cur = con.execute(query, params or [])
            cols = [c[0] for c in cur.description]
            return [dict(zip(cols, row)) for row in cur.fetchall()]
        finally:
            con.close()

    def query(
        self, where: str | None = None, limit: int | None = None, order: str = "step, id"
    ) -> list[dict[str, Any]]:
        q = "SELECT * FROM rollouts"
        if where:
            q += f" WHERE {where}"
        q += f" ORDER BY {order}"
        if limit is not None:
            q += f" LIMIT {int(limit)}"
        rows = self.sql(q)
        for r in rows:
            r["rewards"] = dict(r["rewards"]) if r.get("rewards") is not None else {}
            r["info"] = json.loads(r["info"]) if r.get("info") else {}
        return rows

    def metrics(self, branch: str | None = None) -> dict[int, dict[str, float]]:
        """Step metrics as {step: {name: value}}."""
        q = "SELECT step, name, value FROM metrics" + (" WHERE branch = ?" if branch else "") + " ORDER BY step"
        out: dict[int, dict[str, float]] = {}
        for r in self.sql(q, [branch] if branch else None):
            out.setdefault(r["step"], {})[r["name"]] = r["value"]
        return out

    def reward_terms(self) -> list[str]:
        """Every reward term the stored rollouts carry, sorted."""
        rows = self.sql("SELECT DISTINCT unnest(map_keys(rewards)) AS term FROM rollouts")
        return sorted(r["term"] for r in rows if r["term"] is not None)

    def count(self, where: str | None = None) -> int:
        return self.sql("SELECT count(*) AS n FROM rollouts" + (f" WHERE {where}" if where else ""))[0]["n"]


def _remove_orphans(d: Path) -> None:
    """Delete temporary files of writers that no longer exist (killed mid-write)."""
    for tmp in d.glob(".*.tmp"):
        try:
            pid = int(tmp.name.rsplit(".", 2)[-2])
        except ValueError:
            continue
        if pid == os.getpid() or not _alive(pid):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
