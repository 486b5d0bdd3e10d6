"""Detectors over groups that the shaped total does not show: groups dead on the outcome (the correctness term,
else the audit) while shaping terms still spread their total; thresholds come from window.params (defaults:
suite.CORE)."""

from __future__ import annotations

from evotrainer.diagnostics.detector import Finding, Window, finding, ids

# The outcome of a rollout: the domain's correctness term where it stores one, else the audit where it ran.
OUTCOME = "coalesce(rewards['correct'], audit::DOUBLE)"


def dead_outcome_groups(w: Window) -> list[Finding]:
    """Groups whose outcome is the same for every rollout (all fail, or all pass) give the task no signal, yet
    under shaped rewards (a format term, a behaviour bonus) their total still spreads, so `zero_variance_groups`
    on the total stays quiet while the policy learns the shaping alone (verl-recipe PR #125: a gate on the std of
    the binary outcome, not of the total). Fires when more than `max_fraction` of the groups with an outcome are
    dead on it and the total hides at least `min_hidden` of them."""
    p = w.params
    total, dead, hidden, fail_share = w.con.execute(
        "SELECT count(*), count(*) FILTER (WHERE so < ?), count(*) FILTER (WHERE so < ? AND st >= ?), "
        "avg(CASE WHEN mo < 0.5 THEN 1.0 ELSE 0.0 END) FILTER (WHERE so < ?) FROM "
        f"(SELECT group_id, stddev_pop({OUTCOME}) AS so, stddev_pop(reward) AS st, avg({OUTCOME}) AS mo "
        f" FROM rollout_stats GROUP BY group_id HAVING count({OUTCOME}) = count(*))",
        [p["std_threshold"]] * 4,
    ).fetchone()
    if not total or dead / total <= p["max_fraction"] or hidden / total < p["min_hidden"]:
        return []
    share = dead / total
    ev = ids(
        w,
        f"SELECT min(id) FROM rollout_stats GROUP BY group_id HAVING count({OUTCOME}) = count(*) "
        f"AND stddev_pop({OUTCOME}) < ? AND stddev_pop(reward) >= ? ORDER BY max(step) DESC, group_id",
        [p["std_threshold"]] * 2,
    )
    failing = fail_share >= 0.5
    return [
        finding(
            w,
            "dead_outcome_groups",
            "critical" if share >= 0.95 else "warning",
            share,
            p["max_fraction"],
            ev,
            # The std filter (the paper's keep ratio) cuts the groups whose only spread is the shaping's; a
            # partial-credit outcome term (a domain's remedy) gives failing groups spread of their own.
            (
                "filters.std_keep_ratio",
                "curriculum.hard_threshold" if failing else "curriculum.easy_threshold",
                "sampling.temperature",
                "sampling.num_generations",
            ),
            f"{100 * share:.0f}% of groups ({dead}/{total}) have the same outcome in every rollout "
            f"({100 * fail_share:.0f}% of them all failing); the shaped total hides {hidden} of them "
            "(its std is above the threshold), so their advantages pay the shaping terms only.",
        )
    ]
