"""Detectors of the code domain: completions that hard-code the visible examples (they pass the visible
tests the reward reads and fail the hidden ones), and code that does not run. They read the code
env's rollout info (`hardcoded`, `exec`) and stay quiet on rollouts of other domains."""

from __future__ import annotations

from evotrainer.diagnostics.builtin import thirds
from evotrainer.diagnostics.detector import Finding, Window, finding, ids

# One row per code train rollout. The `contains` test skips other domains' info without parsing it;
# try() keeps a malformed info string from failing the whole detector.
_CODE = (
    "(SELECT id, step, reward, audit, "
    "coalesce(try_cast(try(json_extract_string(info, '$.hardcoded')) AS DOUBLE), 0) AS hardcoded, "
    "coalesce(try(json_extract_string(info, '$.exec')), 'ok') AS exec "
    "FROM rollouts WHERE contains(info, '\"hardcoded\"') AND coalesce(try(json_exists(info, '$.exec')), false))"
)


def hardcoded_examples(w: Window) -> list[Finding]:
    """Completions that key their answers on the visible examples' inputs (`if (a, b) == (2, 3):
    return 7`, a literal lookup table): their share in the window's last third is above max_fraction
    and rose by min_rise since the first third (the policy is drifting to the shortcut), or is above
    high_fraction whatever the trend. A validity finding: those rewards are not for solving the task."""
    p = w.params
    n = w.scalar(f"SELECT count(*) FROM {_CODE}")
    if not n or n < p["min_rollouts"]:
        return []
    cut = thirds(w, _CODE)
    a, b = cut if cut else (None, None)
    late = w.con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE hardcoded >= ?) FROM {_CODE} WHERE ? IS NULL OR step >= ?",
        [p["min_keyed"], b, b],
    ).fetchone()
    early = w.con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE hardcoded >= ?) FROM {_CODE} WHERE ? IS NULL OR step <= ?",
        [p["min_keyed"], a, a],
    ).fetchone()
    share1 = late[1] / late[0] if late[0] else 0.0
    share0 = early[1] / early[0] if early[0] else 0.0
    drifting = share1 > p["max_fraction"] and share1 - share0 > p["min_rise"]
    if not (drifting or share1 > p["high_fraction"]):
        return []
    audited, failed, paid = w.con.execute(
        f"SELECT count(*) FILTER (WHERE audit IS NOT NULL), count(*) FILTER (WHERE audit = false), avg(reward) "
        f"FROM {_CODE} WHERE hardcoded >= ?",
        [p["min_keyed"]],
    ).fetchone()
    ev = ids(
        w,
        f"SELECT id FROM {_CODE} WHERE hardcoded >= ? ORDER BY audit = false DESC, reward DESC, step DESC, id",
        [p["min_keyed"]],
    )
    audit = f"; {failed}/{audited} of the audited ones fail the hidden tests" if audited else ""
    return [
        finding(
            w,
            "hardcoded_examples",
            "critical",
            share1,
            p["max_fraction"],
            ev,
            ("reward_weights.correct", "reward_weights.visible", "reward_weights.correct_not_hardcoded"),
            f"{100 * share1:.0f}% of recent code rollouts hard-code the visible examples (first third of the "
            f"window: {100 * share0:.0f}%); their mean reward is {paid:.3f}{audit}.",
            validity=True,
            flagged=f"SELECT id FROM {_CODE} WHERE hardcoded >= {float(p['min_keyed'])!r}",
        )
    ]


def exec_errors(w: Window) -> list[Finding]:
    """Code that does not run to its results: syntax errors (often code cut by the token cap), exceptions,
    timeouts, memory or output limits. A high share means the reward mostly reads crashes."""
    p = w.params
    n, bad = w.con.execute(f"SELECT count(*), count(*) FILTER (WHERE exec <> 'ok') FROM {_CODE}").fetchone()
    if not n or n < p["min_rollouts"] or bad / n <= p["max_fraction"]:
        return []
    kinds = w.con.execute(
        f"SELECT exec, count(*) AS c FROM {_CODE} WHERE exec <> 'ok' GROUP BY exec ORDER BY c DESC, exec"
    ).fetchall()
    ev = ids(w, f"SELECT id FROM {_CODE} WHERE exec <> 'ok' ORDER BY step DESC, reward DESC, id")
    breakdown = ", ".join(f"{k} {c}" for k, c in kinds)
    return [
        finding(
            w,
            "exec_errors",
            "warning",
            bad / n,
            p["max_fraction"],
            ev,
            ("sampling.max_completion_length", "reward_weights.format", "sampling.temperature"),
            f"{100 * bad / n:.0f}% of code rollouts ({bad}/{n}) did not run to their results: {breakdown}.",
        )
    ]
