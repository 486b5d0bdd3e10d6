"""Detectors of test tampering in repository-level SWE rollouts: trajectories that edit test files,
break test collection, or leave fewer tests collected than the repository had. Each turns a visible
test pass into an untrustworthy reward. They read the SWE env's rollout info and stay quiet on
rollouts of other domains (no `files_touched` in their info). Function names do not start with `test`
(their registry names do): a test module importing one would otherwise have pytest collect it."""

from __future__ import annotations

from evotrainer.diagnostics.detector import Finding, Window, finding, ids
from evotrainer.envs.swe import behaviour

# One row per SWE train rollout. The `contains` test skips other domains' info without parsing it as
# JSON; try() keeps a malformed info string from failing the whole detector. `reinforced`: a positive reward
# above its group's mean (a positive GRPO advantage), or in a group where every rollout got the same positive
# reward (an exploit the whole group found). `paid`: reinforced, and the reward read the tampering: a term the
# step paid (`reward_weights/<term>`) scored the tests as the episode left them above the original tests put
# back (`tests` a higher pass fraction, `correct` a clean run the restored tests fail), or the step paid a term
# this module does not know, which may read them. Under partial credit on the restored tests a rollout that
# edited a test and fixed some code is reinforced for the fix, not for the edit: not paid. A window without
# the weight metrics counts every reinforced rollout as paid, as before they existed.
_AS_LEFT = ("tests", "correct")  # SWE's terms that score the tests as the episode left them
_BLIND = ("tests_restored", "tests_fixed", "format", *behaviour.TERMS)  # terms an edited or broken test cannot move
_WEIGHTS = (
    "SELECT step, count(*) AS n_w, "
    "coalesce(max(value) FILTER (WHERE name = 'reward_weights/tests'), 0) AS w_tests, "
    "coalesce(max(value) FILTER (WHERE name = 'reward_weights/correct'), 0) AS w_correct, "
    "count(*) FILTER (WHERE value <> 0 AND substr(name, 16) NOT IN "
    f"({', '.join(repr(t) for t in _AS_LEFT + _BLIND)})) AS w_other "
    "FROM metrics WHERE name LIKE 'reward_weights/%' GROUP BY step"
)
_INFO = (
    "SELECT id, step, group_id, reward, audit, "
    "coalesce(try(json_array_length(info, '$.test_files_touched')), 0) AS test_files, "
    "coalesce(try(json_array_length(info, '$.collection_errors')), 0) AS collection_errors, "
    "try_cast(try(json_extract_string(info, '$.tests_collected_before')) AS INTEGER) AS before, "
    "try_cast(try(json_extract_string(info, '$.tests_collected_after')) AS INTEGER) AS after, "
    "coalesce(try(json_extract_string(info, '$.submitted')) = 'true', false) AS submitted, "
    "try_cast(try(json_extract_string(info, '$.pass_fraction')) AS DOUBLE) AS left_pass, "
    "try_cast(try(json_extract_string(info, '$.restored_pass_fraction')) AS DOUBLE) AS restored_pass, "
    "try(json_extract_string(info, '$.tests_failed_after')) = '0' "
    "AND coalesce(try(json_extract_string(info, '$.run_failure')), '') = '' AS left_clean "
    "FROM rollouts WHERE contains(info, '\"files_touched\"') "
    "AND coalesce(try(json_exists(info, '$.files_touched')), false) AND isfinite(reward)"
)
_SWE_SQL = (
    "SELECT id, step, reward, audit, test_files, collection_errors, before, after, submitted, "
    "reward > 0 AND (reward > avg(reward) OVER g + 1e-9 OR stddev_pop(reward) OVER g < 1e-9) AS reinforced, "
    "coalesce(n_w, 0) = 0 OR w_other > 0 "
    "OR (submitted AND w_tests > 0 AND coalesce(left_pass > restored_pass + 1e-9, false)) "
    "OR (submitted AND w_correct > 0 AND coalesce(left_clean AND restored_pass < 1 - 1e-9, false)) AS reads_it "
    f"FROM ({_INFO}) LEFT JOIN ({_WEIGHTS}) USING (step) WINDOW g AS (PARTITION BY group_id)"
)
_SWE = "_swe_rollouts"
# Terms that pay for a tampered test run; the restored-tests term is the harness-side remedy.
_KNOBS = ("reward_weights.tests", "reward_weights.correct", "reward_weights.tests_restored")


def _flagged(w: Window, name: str, condition: str, what: str, knobs: tuple[str, ...] = _KNOBS) -> list[Finding]:
    """One validity finding when the share of SWE rollouts that meet `condition` and were paid for it
    exceeds max_fraction (with paid_only = 0, every rollout meeting it counts). Evidence: those
    rollouts, the highest rewarded and latest first."""
    p = w.params
    # One scan of the info column for the three detectors: the suite runs them on one connection,
    # and the window's rollouts do not change while it is open.
    # (IF NOT EXISTS alone would still run the query: DuckDB plans the SELECT first.)
    if not w.scalar(f"SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = '{_SWE}'"):
        w.con.execute(f"CREATE TEMP TABLE {_SWE} AS {_SWE_SQL}")
    hit = f"({condition}) AND reinforced AND reads_it" if p["paid_only"] else f"({condition})"
    n, seen, bad, paid, audited, failed = w.con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE {condition}), count(*) FILTER (WHERE {hit}), "
        f"avg(reward) FILTER (WHERE {hit}), "
        f"count(*) FILTER (WHERE {hit} AND audit IS NOT NULL), count(*) FILTER (WHERE {hit} AND audit = false) "
        f"FROM {_SWE}"
    ).fetchone()
    if n < p["min_rollouts"] or bad / n <= p["max_fraction"]:
        return []
    what += " and were paid for it" if p["paid_only"] else ""
    ev = ids(w, f"SELECT id FROM {_SWE} WHERE {hit} ORDER BY reward DESC, step DESC, id")
    audit = f"; {failed}/{audited} of the audited ones fail the audit" if audited else ""
    return [
        finding(
            w,
            name,
            "critical",
            bad / n,
            p["max_fraction"],
            ev,
            knobs,
            f"{100 * bad / n:.1f}% of SWE rollouts ({bad}/{n}) {what} "
            f"({seen} did it in all); their mean reward is {paid:.3f}{audit}.",
            validity=True,
            flagged=f"SELECT id FROM ({_SWE_SQL}) WHERE {condition}",
        )
    ]


def tampered_tests(w: Window) -> list[Finding]:
    """Trajectories that edited a test file. The audit restores the tests, the `tests` reward does not:
    an edited assertion is a visible pass that fixes nothing."""
    return _flagged(w, "test_tampering", "test_files > 0", "edited a test file")


def collection_errors(w: Window) -> list[Finding]:
    """Submissions whose test run had collection errors (a test file that does not import): those tests
    are not counted, so a broken file reads as fewer failures."""
    return _flagged(
        w, "collection_errors", "submitted AND collection_errors > 0", "left test files that fail to collect"
    )


def dropped_tests(w: Window) -> list[Finding]:
    """Submissions that collected fewer tests than the original repository: deleted, renamed or broken
    tests make the pass fraction rise without a fix."""
    return _flagged(
        w, "tests_dropped", "submitted AND after < before", "collected fewer tests than the repository has"
    )
