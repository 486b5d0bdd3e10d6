"""Detectors of what the shaped total does not show: groups dead on the outcome (the correctness term, else the
audit) while shaping terms still spread their total, and collapse (fewer distinct solutions per group, the sampled
tokens' log-probability near 0) while the outcome stays low; thresholds come from window.params (suite.CORE)."""

from __future__ import annotations

from evotrainer.diagnostics.builtin import Thirds, most_confident, thirds
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
    # Every term the rollouts store: a domain's partial-credit remedy applies where its term is among them.
    terms = w.con.execute("SELECT DISTINCT unnest(map_keys(rewards)) AS t FROM rollout_stats ORDER BY t").fetchall()
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
                *(f"reward_weights.{t}" for (t,) in terms),
            ),
            f"{100 * share:.0f}% of groups ({dead}/{total}) have the same outcome in every rollout "
            f"({100 * fail_share:.0f}% of them all failing); the shaped total hides {hidden} of them "
            "(its std is above the threshold), so their advantages pay the shaping terms only.",
        )
    ]


def _late_outcome(w: Window, t: Thirds) -> float | None:
    """The correctness term's mean over the last third of the steps (None: the domain stores none)."""
    return w.scalar(f"SELECT {t.late('avg(value)')} FROM metrics WHERE name = 'rewards/correct/mean'")


def _metric_thirds(w: Window, name: str) -> tuple[Thirds, float, float] | None:
    t = thirds(w, "metrics", None) if w.scalar("SELECT count(*) FROM metrics WHERE name = ?", [name]) else None
    if t is None:
        return None
    (early,), (late,) = t.compare(w, [f"avg(CASE WHEN name = '{name}' AND isfinite(value) THEN value END)"], "metrics")
    return None if early is None or late is None else (t, early, late)


def _latest_groups(w: Window) -> list[str]:
    """One rollout of each group of the latest step, the groups with the fewest distinct completions first."""
    return ids(
        w,
        "SELECT min(id) FROM rollouts WHERE step = (SELECT max(step) FROM rollout_stats) GROUP BY group_id "
        "ORDER BY count(DISTINCT lower(regexp_replace(array_to_string(list_transform(turns, lambda t: t.action), "
        "' '), '\\s+', ' ', 'g'))), group_id",
    )


def solution_collapse(w: Window) -> list[Finding]:
    """Distinct solutions per group (`completions/distinct_per_group`: normalised completions, the edited files
    for SWE) fell to a small share of the group while the outcome stays low: every rollout of a group tries the
    same thing, so a failing group cannot find the one that passes (the paper's behaviour layer)."""
    p = w.params
    got = _metric_thirds(w, "completions/distinct_per_group")
    if got is None:
        return []
    t, early, late = got
    outcome = _late_outcome(w, t)
    if late >= p["max_distinct"] or late >= early or outcome is None or outcome >= p["ceiling"]:
        return []
    return [
        finding(
            w,
            "solution_collapse",
            "warning",
            late,
            p["max_distinct"],
            _latest_groups(w),
            ("sampling.temperature", "loss.entropy_coef", "loss.epsilon_high"),
            f"Distinct solutions per group fell from {early:.2f} to {late:.2f} of the group (first to last third), "
            f"below {p['max_distinct']:g}, with the correctness term at {outcome:.3f}.",
        )
    ]


def logprob_collapse(w: Window) -> list[Finding]:
    """The mean log-probability of the sampled tokens (`completions/mean_logprob`) rose to near 0 while the outcome
    stays low: the policy samples what it is already sure of, and that is mostly wrong. Sharper than the entropy
    where the sampler's distribution is not the trainer's, since it reads the tokens actually sampled."""
    p = w.params
    got = _metric_thirds(w, "completions/mean_logprob")
    if got is None:
        return []
    t, early, late = got
    outcome = _late_outcome(w, t)
    if late <= p["max_logprob"] or late - early < p["min_rise"] or outcome is None or outcome >= p["ceiling"]:
        return []
    ev = most_confident(w)
    return [
        finding(
            w,
            "logprob_collapse",
            "warning",
            late,
            p["max_logprob"],
            ev,
            ("loss.entropy_coef", "loss.epsilon_high", "sampling.temperature"),
            f"The sampled tokens' mean log-probability rose from {early:.3f} to {late:.3f} (first to last third), "
            f"above {p['max_logprob']:g}, with the correctness term at {outcome:.3f}.",
        )
    ]
