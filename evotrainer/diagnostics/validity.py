"""Built-in detectors of untrustworthy reward and of broken episodes: reward terms that outrun the
audit, rewarded rollouts that fail it, tool errors, turn caps and infrastructure failures."""

from __future__ import annotations

import math

from evotrainer.diagnostics.builtin import thirds
from evotrainer.diagnostics.detector import Finding, Window, finding, ids

# One row per (rollout, reward term), over the terms the harness paid in the window (the step metrics
# `reward_weights/<term>`): a term with no weight cannot be gamed, it only moves as a side effect (a
# branch that removed the exploited term still records it). Windows from before those metrics
# existed watch every recorded term.
# `_PAID`: each step's weight of each term, as the segment recorded it (training/segment.py).
_PAID = "(SELECT step, substr(name, 16) AS term, value AS weight FROM metrics WHERE name LIKE 'reward_weights/%')"
_TERMS = (
    "(SELECT id, step, audit, reward, term, v FROM (SELECT id, step, audit, reward, "
    "unnest(map_keys(rewards)) AS term, unnest(map_values(rewards)) AS v FROM rollout_stats) "
    f"WHERE NOT EXISTS (SELECT 1 FROM {_PAID}) OR term IN (SELECT term FROM {_PAID} WHERE weight <> 0))"
)


def reward_hacking(w: Window) -> list[Finding]:
    """A reward term's mean rises across the window while the audit pass rate of the audited train
    rollouts does not: the policy is earning that term without getting better at the task (format
    hacking, grader exploits), by more than the audit's own noise allows. One finding per term; each makes the
    training reward untrustworthy."""
    p = w.params
    t = thirds(w)
    if t is None:
        return []
    (n0, pass0), (n1, pass1) = t.compare(
        w, ["count(*)", "avg(audit::DOUBLE)"], "rollout_stats WHERE audit IS NOT NULL"
    )
    # Without enough audits on both ends there is nothing to compare; and an audit already at its
    # ceiling cannot rise, so a rising term there is learning, not hacking.
    if n0 < p["min_audited"] or n1 < p["min_audited"] or pass0 >= 1.0 - p["max_audit_rise"]:
        return []
    audit_rise = pass1 - pass0
    if audit_rise >= p["max_audit_rise"]:
        return []
    # A term that rose no more than the audit plausibly did is no evidence the two parted: the bar is the audit's
    # one-sided upper bound (`audit_z` standard errors of the difference of two pass rates). Seen on swe_short_300k
    # seed 2: the regrade's own arm, 48 audits a third, "rose +0.103 while the audit went -0.021" (a standard error
    # of 0.10), and that finding rejected the remedy. `audit_z` 0 turns the bound off.
    se = math.sqrt(pass0 * (1 - pass0) / n0 + pass1 * (1 - pass1) / n1)
    bar = max(p["min_rise"], audit_rise + p["audit_z"] * se)
    rises = w.rows(
        f"SELECT term, {t.early('avg(v)')} AS m0, {t.late('avg(v)')} AS m1 "
        f"FROM {_TERMS} WHERE isfinite(v) GROUP BY term HAVING m1 - m0 > ? ORDER BY m1 - m0 DESC, term",
        [bar],
    )
    out = []
    for r in rises:
        ev = ids(
            w,
            f"SELECT id FROM {_TERMS} WHERE term = ? AND v > 0 AND isfinite(v) AND audit = false "
            "ORDER BY v DESC, step DESC, id",
            [r["term"]],
        )
        rise = r["m1"] - r["m0"]
        out.append(
            finding(
                w,
                "reward_hacking",
                "critical",
                rise,
                bar,
                ev,
                (f"reward_weights.{r['term']}",),
                f"Reward term '{r['term']}' rose {r['m0']:.3f} -> {r['m1']:.3f} (+{rise:.3f}) while the audit pass "
                f"rate went {pass0:.3f} -> {pass1:.3f} ({audit_rise:+.3f}) on {n0}/{n1} audited rollouts.",
                validity=True,
            )
        )
    return out


# A rollout the audit fails counts in the reward-audit gap only where the reward pays it like a pass: the
# weighted terms on which it scores at least a low quantile (PASS_LEVEL) of what the window's audit passes
# score reach the rewarded threshold. Partial credit (half the restored tests passing, where every pass has
# all of them) pays progress, below every pass, and is no gap; a format term or an edited test paid in full is.
# The step's weights come from its `reward_weights/<term>` metrics; where a window lacks them, or holds fewer
# than min_passes audit passes to set a level, every rewarded failure counts, as before.
PASS_LEVEL = 0.25
_LIKE_PASS = (
    f"(SELECT f.id, sum(p.weight * f.v) AS pay FROM {_TERMS} f JOIN {_PAID} p USING (step, term) "
    f"JOIN (SELECT term, quantile_cont(v, {PASS_LEVEL}) AS level FROM {_TERMS} WHERE audit AND isfinite(v) "
    "GROUP BY term) l USING (term) WHERE f.audit = false AND isfinite(f.v) AND f.v >= l.level - 1e-9 GROUP BY f.id)"
)


def _gap_rollouts(w: Window) -> tuple[str, bool]:
    """A query over rollout_stats: the rewarded rollouts the audit fails, those the reward pays like a pass
    where the window can tell (see _LIKE_PASS); and whether it could."""
    t = repr(float(w.params["rewarded_threshold"]))
    rewarded = f"SELECT * FROM rollout_stats WHERE audit = false AND isfinite(reward) AND reward >= {t}"
    passes = w.scalar("SELECT count(*) FROM rollout_stats WHERE audit")
    weighed = w.scalar(f"SELECT count(*) FROM {_PAID}")
    if passes < w.params["min_passes"] or not weighed:
        return rewarded, False
    return f"SELECT * FROM ({rewarded}) WHERE id IN (SELECT id FROM {_LIKE_PASS} WHERE pay >= {t})", True


def reward_audit_gap(w: Window) -> list[Finding]:
    """Among audited train rollouts that the training reward calls a success, the share the strict audit
    fails while the reward pays them like a pass (above): the reward pays for something other than the
    task. The knobs named are the terms that paid most on those failures."""
    p = w.params
    t = p["rewarded_threshold"]
    gap_sql, like_pass = _gap_rollouts(w)
    # Read three times below (the share, the terms, the evidence): computed once.
    w.con.execute(f"CREATE OR REPLACE TEMP TABLE _audit_gap AS {gap_sql}")
    audited = "SELECT count(*) FROM rollout_stats WHERE audit IS NOT NULL AND isfinite(reward) AND reward >= ?"
    n = w.scalar(audited, [t])
    bad = w.scalar("SELECT count(*) FROM _audit_gap")
    # A share no further above max_gap than its sampling noise plausibly puts it is no evidence of a gap: the bar is
    # max_gap plus `audit_z` binomial standard errors at max_gap (reward_hacking's bound, one-sided). Seen on code at
    # the lean round: a warm run's first control read 49/483 (10.1%) against 10%, the flag threw back its mainline,
    # and 80k of its 400k tokens went with it. `audit_z` 0 is the bare share.
    bar = p["max_gap"] + p["audit_z"] * math.sqrt(p["max_gap"] * (1 - p["max_gap"]) / max(n, 1))
    if n < p["min_audited"] or bad / n <= bar:
        return []
    gap = bad / n
    terms = [
        r[0]
        for r in w.con.execute(
            f"SELECT term FROM {_TERMS} WHERE id IN (SELECT id FROM _audit_gap) AND isfinite(v) "
            "GROUP BY term HAVING avg(v) > 0 ORDER BY avg(v) DESC, term LIMIT 3"
        ).fetchall()
    ]
    ev = ids(w, "SELECT id FROM _audit_gap ORDER BY reward DESC, step DESC, id")
    knobs = tuple(f"reward_weights.{t}" for t in terms) or ("reward_weights",)
    how = " and are paid like a pass" if like_pass else ""
    return [
        finding(
            w,
            "reward_audit_gap",
            "critical",
            gap,
            bar,
            ev,
            knobs,
            f"{100 * gap:.0f}% of audited rollouts with reward >= {t:g} ({bad}/{n}) fail the audit{how}; the terms "
            f"paying most on them: {', '.join(terms) or 'none'}.",
            validity=True,
        )
    ]


def tool_errors(w: Window) -> list[Finding]:
    """Multi-turn episodes that break: a high share with a malformed action (`tool_errors`), or a high
    share that run into the turn cap (`turn_cap`). Both waste the episode's tokens and, depending
    on the tool-error policy, teach the model to fail or to stall."""
    p = w.params
    n, errs, capped, mean_err = w.con.execute(
        "SELECT count(*), count(*) FILTER (WHERE tool_errors > 0), count(*) FILTER (WHERE termination = 'turn_cap'), "
        "avg(tool_errors) FROM rollout_stats"
    ).fetchone()
    out = []
    if n and errs / n > p["max_error_fraction"]:
        ev = ids(w, "SELECT id FROM rollout_stats WHERE tool_errors > 0 ORDER BY tool_errors DESC, step DESC, id")
        out.append(
            finding(
                w,
                "tool_errors",
                "warning",
                errs / n,
                p["max_error_fraction"],
                ev,
                ("multi_turn.tool_error", "multi_turn.max_turns"),
                f"{100 * errs / n:.0f}% of rollouts ({errs}/{n}) have a tool error ({mean_err:.2f} error turns per "
                f"rollout on average).",
            )
        )
    if n and capped / n > p["max_turn_cap_fraction"]:
        ev = ids(
            w,
            "SELECT id FROM rollout_stats WHERE termination = 'turn_cap' ORDER BY num_turns DESC, "
            "completion_tokens DESC, step DESC, id",
        )
        out.append(
            finding(
                w,
                "turn_cap",
                "warning",
                capped / n,
                p["max_turn_cap_fraction"],
                ev,
                ("multi_turn.max_turns", "multi_turn.tool_error"),
                f"{100 * capped / n:.0f}% of rollouts ({capped}/{n}) ran into the turn cap.",
            )
        )
    return out


def infra_errors(w: Window) -> list[Finding]:
    """Rollouts ended by the infrastructure (`timeout`, `error`), not the policy. Their zero reward
    enters the group baseline: in a group with reward spread they poison every advantage of it."""
    p = w.params
    n, bad, poisoning = w.con.execute(
        "WITH g AS (SELECT group_id, stddev_pop(reward) AS sd FROM rollout_stats WHERE isfinite(reward) "
        "GROUP BY group_id) "
        "SELECT count(*), count(*) FILTER (WHERE termination IN ('timeout', 'error')), "
        "count(*) FILTER (WHERE termination IN ('timeout', 'error') AND coalesce(g.sd, 0) >= ?) "
        "FROM rollout_stats r LEFT JOIN g USING (group_id)",
        [p["std_threshold"]],
    ).fetchone()
    if not n or bad / n <= p["max_fraction"]:
        return []
    ev = ids(
        w,
        "WITH g AS (SELECT group_id, stddev_pop(reward) AS sd FROM rollout_stats WHERE isfinite(reward) "
        "GROUP BY group_id) "
        "SELECT id FROM rollout_stats r LEFT JOIN g USING (group_id) WHERE termination IN ('timeout', 'error') "
        "ORDER BY coalesce(g.sd, 0) >= ? DESC, step DESC, id",
        [p["std_threshold"]],
    )
    return [
        finding(
            w,
            "infra_errors",
            "warning",
            bad / n,
            p["max_fraction"],
            ev,
            ("filters.mask_terminations",),
            f"{100 * bad / n:.1f}% of rollouts ({bad}/{n}) ended in a timeout or error; {poisoning} of them sit in "
            f"groups with reward spread, where they skew the advantages.",
        )
    ]
