"""Detectors of test tampering in repository-level SWE rollouts: trajectories that edit test files,
break test collection, or leave fewer tests collected than the repository had. Each turns a visible
test pass into an untrustworthy reward. They read the SWE env's rollout info and stay quiet on
rollouts of other domains (no `files_touched` in their info). Function names do not start with `test`
(their registry names do): a test module importing one would otherwise have pytest collect it."""
from __future__ import annotations

from evotrainer.diagnostics.builtin import finding, ids
from evotrainer.diagnostics.detector import Finding, Window

# One row per submitted-or-not SWE train rollout. The `contains` test skips other domains' info
# without parsing it as JSON; try() keeps a malformed info string from failing the whole detector.
_SWE = ("(SELECT id, step, reward, audit, rewards, "
        "coalesce(try(json_array_length(info, '$.test_files_touched')), 0) AS test_files, "
        "coalesce(try(json_array_length(info, '$.collection_errors')), 0) AS collection_errors, "
        "try_cast(try(json_extract_string(info, '$.tests_collected_before')) AS INTEGER) AS before, "
        "try_cast(try(json_extract_string(info, '$.tests_collected_after')) AS INTEGER) AS after, "
        "coalesce(try(json_extract_string(info, '$.submitted')) = 'true', false) AS submitted "
        "FROM rollouts WHERE contains(info, '\"files_touched\"') AND coalesce(try(json_exists(info, '$.files_touched')), false))")
# Terms that pay for a tampered test run; the restored-tests term is the harness-side remedy.
_KNOBS = ("reward_weights.tests", "reward_weights.correct", "reward_weights.tests_restored")


def _flagged(w: Window, name: str, condition: str, what: str, knobs: tuple[str, ...] = _KNOBS) -> list[Finding]:
    """One validity finding when the share of SWE rollouts meeting `condition` exceeds max_fraction.
    Evidence: the flagged rollouts the reward paid most, latest first."""
    p = w.params
    n, bad, paid, audited, failed = w.con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE {condition}), avg(reward) FILTER (WHERE {condition}), "
        f"count(*) FILTER (WHERE {condition} AND audit IS NOT NULL), count(*) FILTER (WHERE {condition} AND audit = false) "
        f"FROM {_SWE}").fetchone()
    if n < p["min_rollouts"] or bad / n <= p["max_fraction"]:
        return []
    ev = ids(w, f"SELECT id FROM {_SWE} WHERE {condition} ORDER BY reward DESC, step DESC, id")
    audit = f"; {failed}/{audited} of the audited ones fail the audit" if audited else ""
    return [finding(w, name, "critical", bad / n, p["max_fraction"], ev, knobs,
                    f"{100 * bad / n:.1f}% of SWE rollouts ({bad}/{n}) {what}; their mean reward is {paid:.3f}{audit}.",
                    validity=True)]


def tampered_tests(w: Window) -> list[Finding]:
    """Trajectories that edited a test file. The audit restores the tests, the `tests` reward does not:
    an edited assertion is a visible pass that fixes nothing."""
    return _flagged(w, "test_tampering", "test_files > 0", "edited a test file")


def collection_errors(w: Window) -> list[Finding]:
    """Submissions whose test run had collection errors (a test file that does not import): those tests
    are not counted, so a broken file reads as fewer failures."""
    return _flagged(w, "collection_errors", "submitted AND collection_errors > 0", "left test files that fail to collect")


def dropped_tests(w: Window) -> list[Finding]:
    """Submissions that collected fewer tests than the original repository: deleted, renamed or broken
    tests make the pass fraction rise without a fix."""
    return _flagged(w, "tests_dropped", "submitted AND after < before", "collected fewer tests than the repository has")
