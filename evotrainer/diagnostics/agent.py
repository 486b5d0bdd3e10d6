"""Detectors an agent wrote (the LLM proposer's `detectors`): a SQL query over the window's train rollouts,
run on a read-only DuckDB copy with no file access and a time limit, or a Python predicate run in the
sandbox. Either flags rollouts by id. revision.admit checks one like any plugin (check_detector) and
backtests it against past verdicts before it joins the suite; every decision is a record.

What the agent's code can read is the window's train rollouts, their stats and the step metrics, copied
out: never the held-out rows, the evaluator's shards, the run's files or its config."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
from typing import Any, Literal

import duckdb
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evotrainer import sandbox
from evotrainer.diagnostics.detector import KNOB_PATH, Detector, Finding, Window, finding
from evotrainer.store.files import sql_str

PREFIX = "agent_"
# Window parameters of every agent detector (floats like every suite parameter): fire when more than
# max_share of the window's train rollouts are flagged, and at least min_matches of them.
AGENT_DEFAULTS: dict[str, float] = {"max_share": 0.05, "min_matches": 3}
PER_ROUND = 3  # detectors considered per round; more are refused unread
FLAGGED_MAX = 5000  # flagged ids a finding carries as a literal list; beyond it, it is not weighed
PER_SUITE = 8  # agent detectors a suite may hold: each one reruns on every window and in every backtest
SQL_SECONDS = 5.0
MAX_ROWS = 100_000
# What a query may name. `rollouts` is the train split of the window only (held-out rows are never
# copied); metrics exclude evaluator metrics (heldout/*, eval/*).
TABLES = ("rollouts", "rollout_stats", "metrics")
_TABLE_FUNCTIONS = frozenset({"unnest", "range", "generate_series"})
_FORBIDDEN_FUNCTION = re.compile(
    r"^(read_\w*|\w*_scan|glob|getenv|query|query_table|sniff_csv|parquet_\w+|duckdb_\w+|"
    r"pragma_\w+|current_setting|which_secret|load_\w*|file_\w*|http_\w*)$",
    re.I,
)
_NAME = re.compile(r"^[a-z][a-z0-9_]{2,47}$")
# A flagged rollout set that claims validity must be confirmed by the evaluator's audits on the window:
# at least this many audited matches, and this share of them failing the audit. An agent detector can
# then only make the gate reject what the evaluator's own audit already calls invalid.
VALIDITY_MIN_AUDITED = 3
VALIDITY_MIN_FAIL = 0.8


class _Query(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    severity: Literal["warning", "critical"] = "warning"
    """How serious a firing is."""
    validity: bool = False
    """Whether a firing makes a high training reward untrustworthy (the gate rejects on it)."""
    knobs: tuple[str, ...] = Field(min_length=1, max_length=4)
    """Harness knobs an intervention could change in answer (dotted paths)."""
    message: str = Field(min_length=1, max_length=300)
    """What the flagged rollouts have in common, in a sentence."""

    @field_validator("knobs")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        from evotrainer.harness.knobs import knob

        for k in v:
            if not KNOB_PATH.match(k):
                raise ValueError(f"knob {k!r} is not a dotted harness path such as reward_weights.format")
            try:
                knob(k)
            except KeyError as e:
                raise ValueError(str(e.args[0])) from None
        return v


class SqlQuery(_Query):
    """A detector as one DuckDB SELECT over `rollouts`, `rollout_stats` and `metrics` that returns the ids
    of the rollouts it flags (column `id`), most telling first."""

    query: str = Field(min_length=1, max_length=4000)

    @field_validator("query")
    @classmethod
    def _safe(cls, v: str) -> str:
        if (why := check_sql(v)) is not None:
            raise ValueError(why)
        return v


class Predicate(_Query):
    """A detector as Python source defining `flag(rollout: dict) -> bool`, run in the sandbox over the
    window's train rollouts (keys: id, step, task_id, prompt, turns, termination, rewards, reward,
    audit, completion_tokens, num_turns, info)."""

    source: str = Field(min_length=1, max_length=8000)

    @field_validator("source")
    @classmethod
    def _compiles(cls, v: str) -> str:
        if (why := check_predicate(v)) is not None:
            raise ValueError(why)
        return v


# -- static checks -----------------------------------------------------------------------------------------
def check_sql(query: str) -> str | None:
    """Why a query may not run (None: it may): one SELECT, naming only the window's train tables and
    no table function, file, URL, setting or environment variable. The runtime enforces the same
    again (a read-only copy holding only those tables, file access off); this check gives the reason."""
    con = duckdb.connect(":memory:", config={"enable_external_access": False})
    try:
        try:
            statements = con.extract_statements(query)
        except duckdb.Error as e:
            return f"does not parse: {str(e).splitlines()[0]}"
        if len(statements) != 1:
            return f"must be exactly one statement, got {len(statements)}"
        if statements[0].type != duckdb.StatementType.SELECT:
            return f"only a SELECT may run (read-only), got {statements[0].type.name}"
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [query]).fetchone()[0])
    finally:
        con.close()
    if tree.get("error"):
        return f"does not parse: {tree.get('error_message')}"
    tables, functions, table_functions, ctes = set(), set(), set(), set()
    _walk(tree, tables, functions, table_functions, ctes)
    for catalog, schema, name in sorted(tables):
        if catalog or schema not in ("", "main"):
            return (
                f"may not name a catalog or schema ({'.'.join(p for p in (catalog, schema, name) if p)}): "
                f"only {', '.join(TABLES)}"
            )
        if name not in TABLES and name not in ctes:
            what = (
                "held-out rows are the evaluator's"
                if "heldout" in name.lower() or "eval" in name.lower()
                else "files and URLs cannot be read"
                if re.search(r"[./:]", name)
                else "no such table"
            )
            return f"reads {name!r} ({what}); a detector reads only {', '.join(TABLES)}"
    if bad := sorted(table_functions - _TABLE_FUNCTIONS):
        return f"calls table function(s) {', '.join(bad)}: a detector reads only {', '.join(TABLES)}"
    if bad := sorted(f for f in functions if _FORBIDDEN_FUNCTION.match(f)):
        return f"calls {', '.join(bad)}: file, setting and environment functions are not available to detectors"
    return None


def _walk(node: Any, tables: set, functions: set, table_functions: set, ctes: set) -> None:
    if isinstance(node, dict):
        kind = node.get("type")
        if kind == "BASE_TABLE":
            tables.add((node.get("catalog_name") or "", node.get("schema_name") or "", node.get("table_name") or ""))
        elif kind == "TABLE_FUNCTION":
            table_functions.add(str((node.get("function") or {}).get("function_name", "")).lower())
        if node.get("class") == "FUNCTION":
            functions.add(str(node.get("function_name", "")).lower())
        for entry in (node.get("cte_map") or {}).get("map", []):
            ctes.add(entry.get("key"))
        for v in node.values():
            _walk(v, tables, functions, table_functions, ctes)
    elif isinstance(node, list):
        for v in node:
            _walk(v, tables, functions, table_functions, ctes)


def check_predicate(source: str) -> str | None:
    """Why Python source cannot be a predicate (None: it can). It is never imported here: compiled only."""
    try:
        code = compile(source, "<agent predicate>", "exec")
    except SyntaxError as e:
        return f"does not compile: {e.msg} (line {e.lineno})"
    if "flag" not in code.co_names and "flag" not in code.co_varnames:
        return "must define flag(rollout) -> bool"
    return None


# -- running ---------------------------------------------------------------------------------------------
def _readonly_copy(w: Window, directory: str) -> duckdb.DuckDBPyConnection:
    """A read-only DuckDB file holding the window's train rollouts, rollout_stats and non-evaluator
    metrics, opened with file access off and its configuration locked."""
    path = os.path.join(directory, "window.duckdb")
    # Copied by the window's own connection (execute, not the relation API: an earlier detector may have
    # left a result open on it), straight into the file: no rows pass through Python.
    alias = f"agent_copy_{os.getpid()}_{threading.get_ident()}"
    w.con.execute(f"ATTACH {sql_str(path)} AS {alias}")
    try:
        for name, sql in (
            ("rollouts", "SELECT * FROM rollouts WHERE split = 'train'"),
            ("rollout_stats", "SELECT * FROM rollout_stats"),
            ("metrics", "SELECT * FROM metrics WHERE name NOT LIKE 'heldout/%' AND name NOT LIKE 'eval/%'"),
        ):
            w.con.execute(f"CREATE TABLE {alias}.{name} AS {sql}")
    finally:
        w.con.execute(f"DETACH {alias}")
    return duckdb.connect(
        path,
        read_only=True,
        config={
            "enable_external_access": False,
            "autoload_known_extensions": False,
            "autoinstall_known_extensions": False,
            "threads": 1,
            "memory_limit": "1GB",
            "lock_configuration": True,
        },
    )


def flagged_by_sql(w: Window, query: str, seconds: float = SQL_SECONDS) -> list[str]:
    """Distinct ids the query returns (in its order), on a read-only copy, interrupted after `seconds`."""
    if (why := check_sql(query)) is not None:
        raise PermissionError(f"refused: {why}")
    directory = tempfile.mkdtemp(prefix="evotrainer-agent-sql-")
    try:
        con = _readonly_copy(w, directory)
        timer = threading.Timer(seconds, con.interrupt)
        timer.start()
        try:
            cur = con.execute(query)
            cols = [c[0].lower() for c in cur.description]
            if "id" not in cols:
                raise ValueError(f"the query must return a column `id` (the flagged rollouts), got {cols}")
            rows = cur.fetchmany(MAX_ROWS)
        except duckdb.InterruptException:
            raise TimeoutError(f"the query ran past its {seconds:.0f} s limit") from None
        finally:
            timer.cancel()
            con.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    k = cols.index("id")
    return list(dict.fromkeys(str(r[k]) for r in rows if r[k] is not None))


_RUNNER = """
import json, sys
{source}
_out = []
for _line in sys.stdin:
    _r = json.loads(_line)
    if flag(_r):
        _out.append(_r["id"])
print("\\n" + json.dumps({{"flagged": _out}}))
"""


def flagged_by_predicate(w: Window, source: str) -> list[str]:
    """Ids of the window's train rollouts the predicate flags, run in the sandbox (evotrainer/sandbox):
    no network, a private directory, and under bwrap no view of the run, the store or the evaluator.
    Without bwrap the job could read the machine's files, so a predicate is refused there."""
    if (why := check_predicate(source)) is not None:
        raise ValueError(why)
    if not sandbox.mechanisms().get("bwrap"):
        raise PermissionError(
            "Python predicates need the bwrap sandbox (a private filesystem view); use a SQL detector"
        )
    rows = w.rows(
        "SELECT id, step, task_id, prompt, turns, termination, rewards, reward, audit, completion_tokens, "
        "num_turns, info FROM rollouts ORDER BY step, id"
    )
    lines = []
    for r in rows:
        r["rewards"] = dict(r["rewards"]) if r["rewards"] is not None else {}
        r["info"] = json.loads(r["info"]) if r["info"] else {}
        lines.append(json.dumps(r, default=str))
    directory = tempfile.mkdtemp(prefix="evotrainer-agent-py-")
    try:
        res = sandbox.run_python(
            _RUNNER.format(source=source),
            directory,
            sandbox.Limits(cpu_seconds=10, wall_seconds=20, memory_mb=1024, output_bytes=4_000_000),
            stdin="\n".join(lines) + "\n",
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if not res.ok:
        raise RuntimeError(f"the predicate failed in the sandbox ({res.termination}): {res.stderr.strip()[-400:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])["flagged"]
    audit = {r["id"]: r["audit"] for r in rows}
    step = {r["id"]: r["step"] for r in rows}
    # Most telling first, as the rule detectors order: audit failures, then unaudited, latest steps first.
    return sorted(
        dict.fromkeys(i for i in out if i in audit),
        key=lambda i: ({False: 0, None: 1, True: 2}[audit[i]], -step[i], i),
    )


def _fire(w: Window, name: str, q: _Query, flagged: list[str]) -> list[Finding]:
    p = w.params
    known = {r[0]: (r[1], r[2]) for r in w.con.execute("SELECT id, audit, step FROM rollout_stats").fetchall()}
    hits = [i for i in flagged if i in known]  # ids the window does not hold are not evidence
    n = len(known)
    if not n or len(hits) < p["min_matches"] or len(hits) / n <= p["max_share"]:
        return []
    audited = [known[i][0] for i in hits if known[i][0] is not None]
    note = f"; {sum(a is False for a in audited)} of the {len(audited)} audited ones fail the audit" if audited else ""
    return [
        finding(
            w,
            name,
            q.severity,
            len(hits) / n,
            p["max_share"],
            hits,
            q.knobs,
            f"{len(hits)} of {n} train rollouts ({100 * len(hits) / n:.0f}%) flagged by the agent's detector: "
            f"{q.message}{note}",
            validity=q.validity,
            # The agent's code ran once; the suite weighs its flags by id, never by running it again.
            flagged=_ids_query(hits),
        )
    ]


def _ids_query(ids: list[str]) -> str:
    """A query returning these ids (a finding's `flagged`); "" past FLAGGED_MAX, which leaves it unweighed."""
    if len(ids) > FLAGGED_MAX:
        return ""
    return "SELECT unnest([" + ", ".join(sql_str(i) for i in ids) + "]::VARCHAR[]) AS id"


def sql_detector(q: SqlQuery, name: str) -> Detector:
    """The SQL query as a plain detector function (what Suite.resolve hands to the run loop)."""

    def agent_sql(w: Window) -> list[Finding]:
        return _fire(w, name, q, flagged_by_sql(w, q.query))

    agent_sql.__name__ = name
    return agent_sql


def predicate_detector(p: Predicate, name: str) -> Detector:
    def agent_predicate(w: Window) -> list[Finding]:
        return _fire(w, name, p, flagged_by_predicate(w, p.source))

    agent_predicate.__name__ = name
    return agent_predicate


# -- what the agent wrote -> a query and its parameters ------------------------------------------------------
def parse(raw: Any) -> tuple[str, SqlQuery | Predicate, dict[str, float]]:
    """(suite name, query, params) of one detector as the agent wrote it:
    {name, sql | python, severity, validity, knobs, message, max_share?, min_matches?}. Raises
    ValueError with the reasons an agent can act on. revision.admit turns it into a suite entry."""
    if not isinstance(raw, dict):
        raise ValueError(
            f"a detector is an object with name, sql or python, severity, knobs, message; got {type(raw).__name__}"
        )
    raw = dict(raw)
    name = str(raw.pop("name", "")).lower()
    if not _NAME.match(name):
        raise ValueError(f"name {name!r}: 3 to 48 lowercase letters, digits or _, starting with a letter")
    sql, python = raw.pop("sql", None), raw.pop("python", None)
    if (sql is None) == (python is None):
        raise ValueError(f"{name}: give exactly one of `sql` or `python`")
    params = {}
    for k in AGENT_DEFAULTS:
        if k in raw:
            try:
                params[k] = float(raw.pop(k))
            except (TypeError, ValueError):
                raise ValueError(f"{name}: {k} must be a number") from None
    if not 0.0 <= params.get("max_share", 0.0) < 1.0 or params.get("min_matches", 1.0) < 1:
        raise ValueError(f"{name}: max_share must be in [0, 1) and min_matches at least 1")
    try:
        query = SqlQuery(query=sql, **raw) if sql is not None else Predicate(source=python, **raw)
    except ValidationError as e:
        raise ValueError(
            f"{name}: "
            + "; ".join(
                f"{'.'.join(str(x) for x in err['loc'][-1:]) or 'detector'}: "
                f"{err['msg'].removeprefix('Value error, ')}"
                for err in e.errors()
            )
        ) from None
    return PREFIX + name, query, params


def flagged(w: Window, query: SqlQuery | Predicate) -> list[str]:
    """The rollout ids a query flags on a window, whichever kind it is."""
    return flagged_by_sql(w, query.query) if isinstance(query, SqlQuery) else flagged_by_predicate(w, query.source)
