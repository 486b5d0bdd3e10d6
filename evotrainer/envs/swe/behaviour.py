"""Behaviour-shaped reward terms of the SWE agent (the paper's SWE run: +0.1 when it reads or searches before its first
edit, +0.15 when it runs the tests after its last edit), the detector that finds a behaviour succeeding episodes have
and failing ones lack, and the remedy that pays it. Each term pays once per episode, whatever the repetitions, so
running the tests ten times earns what running them once after the edit earns."""

from __future__ import annotations

from typing import Any

from evotrainer.diagnostics.detector import Finding, Window, finding, ids
from evotrainer.harness.harness import Harness
from evotrainer.harness.remedies import Remedy
from evotrainer.types import Task, Turn

_READ = ("cat", "grep")


def _commands(turns: list[Turn]) -> list[str]:
    """The command word of each valid action, in order (a malformed action did nothing)."""
    return [t.action.strip().partition(" ")[0] for t in turns if not t.tool_error]


def search_before_edit(task: Task, turns: list[Turn], info: dict[str, Any]) -> float:
    """1 when the episode edits and a read or search (`cat`, `grep`) comes before its first edit."""
    cmds = _commands(turns)
    return float("replace" in cmds and any(c in _READ for c in cmds[: cmds.index("replace")]))


def test_after_edit(task: Task, turns: list[Turn], info: dict[str, Any]) -> float:
    """1 when the episode edits and runs the tests after its last edit."""
    cmds = _commands(turns)
    last = len(cmds) - 1 - cmds[::-1].index("replace") if "replace" in cmds else None
    return float(last is not None and "test" in cmds[last + 1 :])


TERMS = {"search_before_edit": search_before_edit, "test_after_edit": test_after_edit}
# The bonus each term gets when it is added: the paper's SWE run.
WEIGHTS = {"search_before_edit": 0.1, "test_after_edit": 0.15}


def missing_behaviour(w: Window) -> list[Finding]:
    """A behaviour term the harness does not pay, present in most succeeding episodes (the correctness term, else the
    audit) and absent from most failing ones: the policy may be failing for want of it. One finding per term, citing
    failing episodes that lack it; the remedy pays it a small bonus, which replay measures before any trial."""
    p = w.params
    out = []
    for term in TERMS:
        row = w.con.execute(
            "SELECT count(*) FILTER (WHERE o >= 0.5), avg(b) FILTER (WHERE o >= 0.5), "
            "count(*) FILTER (WHERE o < 0.5), avg(b) FILTER (WHERE o < 0.5) "
            "FROM (SELECT coalesce(rewards['correct'], audit::DOUBLE) AS o, "
            f"rewards['{term}'] AS b FROM rollout_stats) WHERE o IS NOT NULL AND b IS NOT NULL"
        ).fetchone()
        n_ok, rate_ok, n_fail, rate_fail = row
        paid = w.scalar("SELECT max(value) FROM metrics WHERE name = ?", [f"reward_weights/{term}"])
        if n_ok < p["min_episodes"] or n_fail < p["min_episodes"] or paid:
            continue
        if rate_ok - rate_fail < p["min_gap"]:
            continue
        ev = ids(
            w,
            f"SELECT id FROM rollout_stats WHERE coalesce(rewards['correct'], audit::DOUBLE) < 0.5 "
            f"AND rewards['{term}'] < 0.5 ORDER BY step DESC, id",
        )
        out.append(
            finding(
                w,
                "missing_behaviour",
                "warning",
                rate_ok - rate_fail,
                p["min_gap"],
                ev,
                (f"reward_weights.{term}",),
                f"'{term}' holds in {100 * rate_ok:.0f}% of the {n_ok} succeeding episodes and {100 * rate_fail:.0f}% "
                f"of the {n_fail} failing ones (gap {rate_ok - rate_fail:.2f}, at least {p['min_gap']:g}); "
                "the reward does not pay it.",
            )
        )
    return out


def _bonus(h: Harness, f: Finding) -> Any:
    term = f.knobs[0].split(".", 1)[1] if f.knobs else ""
    return WEIGHTS.get(term)


BEHAVIOUR_BONUS = Remedy(
    "add_reward_term",
    "reward_weights.{term}",
    _bonus,
    "heldout/accuracy",
    "up",
    "failing episodes lack a behaviour succeeding ones have: a small bonus for it (the paper's SWE run: +0.1 search "
    "before the first edit, +0.15 tests after the last)",
)
