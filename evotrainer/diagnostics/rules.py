"""Induced detectors as data: a rule of one or two {feature, op, threshold} clauses over per-rollout
features that DuckDB computes from the `rollouts` view, and the detector that runs a rule over a window."""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evotrainer.diagnostics.detector import KNOB_PATH, Detector, Finding, Window, finding, ids
from evotrainer.store.files import sql_str
from evotrainer.types import TERMINATIONS

# Numeric columns of a rollout. `text` (below) is the rollout's actions joined by newlines: what the
# policy wrote, without prompt or observations, so a pattern found in it is the policy's behaviour.
COLUMNS: dict[str, str] = {
    "completion_tokens": "completion_tokens",
    "max_action_tokens": "max_action_tokens",
    "num_turns": "num_turns",
    "mean_logprob": "list_avg(list_transform(turns, lambda t: t.mean_logprob))",
    "min_turn_logprob": "list_min(list_transform(turns, lambda t: t.mean_logprob))",
    "tool_errors": "len(list_filter(turns, lambda t: t.tool_error))",
    "chars": "length(text)",
}
# Character classes (RE2) whose count, or longest run, in the text is a feature. A few named classes
# instead of free regexes: a rule stays readable, and a stored suite cannot carry an arbitrary regex.
CLASSES: dict[str, str] = {
    "digits": "[0-9]",
    "letters": "[A-Za-z]",
    "spaces": r"\s",
    "symbols": r"[^A-Za-z0-9\s]",
    "non_ascii": r"[^\x00-\x7F]",
}
_REAL_COLUMNS = frozenset({"mean_logprob", "min_turn_logprob"})
TEXT_SQL = "array_to_string(list_transform(turns, lambda t: coalesce(t.action, '')), chr(10))"
# The first identifier of an action: the tool a multi-turn policy called (`ls`, `submit`, ...).
FIRST_WORD_RE = r"^\s*([A-Za-z_][\w-]*)"
# Window parameters of every rule detector; suite revision may recalibrate them like any threshold.
RULE_DEFAULTS: dict[str, float] = {"max_share": 0.05, "min_matches": 3}


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Feature(_Data):
    """One per-rollout number. kind: `column` (a COLUMNS entry), `count_class` / `run_class` (how many
    characters of a CLASSES entry the text holds / its longest run), `termination` (1 if the rollout
    ended so), `first_word` (turns whose action starts with that identifier), `count` (occurrences of
    a literal substring in the text, non-overlapping, as str.count counts)."""

    kind: Literal["column", "count_class", "run_class", "termination", "first_word", "count"]
    arg: str

    @model_validator(mode="after")
    def _check(self) -> Feature:
        known = {"column": COLUMNS, "count_class": CLASSES, "run_class": CLASSES, "termination": TERMINATIONS}.get(
            self.kind
        )
        if known is not None and self.arg not in known:
            raise ValueError(f"feature {self.kind}: unknown {self.arg!r}; known: {sorted(known)}")
        if self.kind in ("first_word", "count") and not 0 < len(self.arg) <= 64:
            raise ValueError(f"feature {self.kind}: the pattern must be 1 to 64 characters, got {self.arg!r}")
        return self

    def sql(self) -> str:
        """The feature as a DuckDB expression over a row with the rollout's columns and `text`."""
        a = self.arg
        if self.kind == "column":
            return COLUMNS[a]
        if self.kind == "count_class":
            return f"len(regexp_extract_all(text, {sql_str(CLASSES[a])}))"
        if self.kind == "run_class":
            runs = f"regexp_extract_all(text, {sql_str('(?:' + CLASSES[a] + ')+')})"
            return f"coalesce(list_max(list_transform({runs}, lambda x: length(x))), 0)"
        if self.kind == "termination":
            return f"(termination = {sql_str(a)})::INTEGER"
        if self.kind == "first_word":
            return (
                f"len(list_filter(turns, lambda t: "
                f"regexp_extract(coalesce(t.action, ''), {sql_str(FIRST_WORD_RE)}, 1) "
                f"= {sql_str(a)}))"
            )
        # Byte lengths: exact for any text, and the same count as Python's str.count.
        return f"((strlen(text) - strlen(replace(text, {sql_str(a)}, ''))) // strlen({sql_str(a)}))"

    @property
    def integer(self) -> bool:
        """Integer-valued: its thresholds are kept integers (`count >= 2`, not `>= 1.5`)."""
        return not (self.kind == "column" and self.arg in _REAL_COLUMNS)

    def describe(self) -> str:
        return {
            "column": self.arg,
            "count_class": f"count({self.arg})",
            "run_class": f"longest_run({self.arg})",
            "termination": f"termination={self.arg}",
            "first_word": f"turns_starting({self.arg!r})",
            "count": f"count({self.arg!r})",
        }[self.kind]


class Clause(_Data):
    feature: Feature
    op: Literal[">=", "<="]
    threshold: float

    def sql(self) -> str:
        return f"({self.feature.sql()}) {self.op} {float(self.threshold)!r}"

    def describe(self) -> str:
        t = int(self.threshold) if float(self.threshold).is_integer() else round(self.threshold, 4)
        return f"{self.feature.describe()} {self.op} {t}"


class Rule(_Data):
    """An induced detector: rewarded rollouts (reward >= min_reward) that satisfy every clause look like
    the rewarded-but-audit-failed rollouts it was induced from. `knobs` are the reward terms that paid
    those rollouts at induction; `evidence` keeps how it was validated (held-back precision, recall,
    support, the window), so a suite carries the reason for each detector it holds."""

    clauses: tuple[Clause, ...] = Field(min_length=1, max_length=2)
    min_reward: float
    knobs: tuple[str, ...] = ()
    evidence: dict[str, float | int | str] = Field(default_factory=dict)

    @field_validator("knobs")
    @classmethod
    def _dotted(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [k for k in v if not KNOB_PATH.match(k)]
        if bad:
            raise ValueError(f"knobs must be dotted harness paths, got {bad}")
        return v

    def sql(self) -> str:
        return " AND ".join(c.sql() for c in self.clauses)

    def describe(self) -> str:
        return " and ".join(c.describe() for c in self.clauses)

    @property
    def name(self) -> str:
        """A detector name that says what the rule tests, plus a hash of the exact clauses."""
        slug = re.sub(r"[^a-z0-9]+", "_", self.describe().lower().replace(">=", " ge ").replace("<=", " le ")).strip(
            "_"
        )
        digest = hashlib.sha256(repr([c.model_dump() for c in self.clauses]).encode()).hexdigest()[:6]
        return f"induced_{slug[:48].rstrip('_')}_{digest}"


def rule_rows(where: str = "") -> str:
    """A query for the window's train rollouts with their `text`, for feature expressions to read."""
    return (
        f"SELECT id, step, task_id, group_id, reward, rewards, audit, termination, completion_tokens, "
        f"max_action_tokens, num_turns, turns, {TEXT_SQL} AS text FROM rollouts {where}"
    )


# The rewarded train rollouts a rule reads (the parameter is the rule's min_reward), and one row per
# (rollout, reward term) of a source.
_REWARDED = f"({rule_rows('WHERE isfinite(reward) AND reward >= ?')}) AS r"
_TERMS_OF = "SELECT unnest(map_keys(rewards)) AS term, unnest(map_values(rewards)) AS v{extra} FROM {src}"


def run_rule(w: Window, rule: Rule, name: str) -> list[Finding]:
    """Fires when more than `max_share` of the window's rewarded train rollouts (and at least
    `min_matches`) satisfy the rule; audited or not, since the point of the rule is to catch what the
    audit would fail without auditing it. Evidence: matching rollouts, audit failures first."""
    p = w.params
    n, hits, audited, failed = w.con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE m), count(*) FILTER (WHERE m AND audit IS NOT NULL), "
        f"count(*) FILTER (WHERE m AND audit = false) "
        f"FROM (SELECT coalesce({rule.sql()}, false) AS m, audit FROM {_REWARDED})",
        [rule.min_reward],
    ).fetchone()
    if not n or hits < p["min_matches"] or hits / n <= p["max_share"]:
        return []
    ev = ids(
        w,
        f"SELECT id FROM {_REWARDED} WHERE coalesce({rule.sql()}, false) ORDER BY "
        "CASE WHEN audit = false THEN 0 WHEN audit IS NULL THEN 1 ELSE 2 END, step DESC, id",
        [rule.min_reward],
    )
    knobs = paying_terms(w, rule) or rule.knobs or ("reward_weights",)
    e = rule.evidence
    validated = (
        f" (held-back precision {e['precision']:.2f}, recall {e['recall']:.2f})"
        if "precision" in e and "recall" in e
        else ""
    )
    audit_note = f"; {failed} of the {audited} audited ones fail the audit" if audited else ""
    return [
        finding(
            w,
            name,
            "critical",
            hits / n,
            p["max_share"],
            ev,
            knobs,
            f"{hits} of {n} rewarded rollouts ({100 * hits / n:.0f}%) match the induced rule "
            f"`{rule.describe()}`{validated}{audit_note}.",
            validity=True,
            flagged=f"SELECT id FROM ({rule_rows()}) WHERE coalesce({rule.sql()}, false)",
        )
    ]


def paying_terms(w: Window, rule: Rule) -> tuple[str, ...]:
    """The reward terms that paid the rule's matches (as knobs): terms paying the matches at least
    half what they pay the other rewarded rollouts (so `correct`, which only honest rollouts earn,
    drops out), the one tracking the total reward most closely over the window first (the term the
    reward is made of), at most three."""
    match = f"coalesce({rule.sql()}, false)"
    rows = w.con.execute(
        f"WITH m AS ({_TERMS_OF.format(extra='', src=f'{_REWARDED} WHERE {match}')}), "
        f"o AS ({_TERMS_OF.format(extra='', src=f'{_REWARDED} WHERE NOT {match}')}), "
        f"a AS ({_TERMS_OF.format(extra=', reward', src='rollout_stats WHERE isfinite(reward)')}) "
        "SELECT m.term FROM (SELECT term, avg(v) AS mv FROM m WHERE isfinite(v) GROUP BY term) m "
        "LEFT JOIN (SELECT term, avg(v) AS ov FROM o WHERE isfinite(v) GROUP BY term) o USING (term) "
        "LEFT JOIN (SELECT term, corr(v, reward) AS c FROM a WHERE isfinite(v) GROUP BY term) a USING (term) "
        "WHERE m.mv > 0 AND m.mv >= 0.5 * coalesce(o.ov, 0) ORDER BY coalesce(a.c, -2) DESC, m.term LIMIT 3",
        [rule.min_reward, rule.min_reward],
    ).fetchall()
    return tuple(f"reward_weights.{r[0]}" for r in rows)


def detector(rule: Rule, name: str) -> Detector:
    """The rule as a plain detector function (what Suite.resolve hands to the run loop)."""

    def induced(w: Window) -> list[Finding]:
        return run_rule(w, rule, name)

    induced.__name__ = name
    return induced


def feature_values(
    w: Window, features: list[Feature], where: str = "", args: list[Any] | None = None
) -> list[dict[str, Any]]:
    """id, audit, reward, task_id, group_id, step, text and f0..fN (the features) of the window's
    train rollouts matching `where`: induction fits and scores on exactly the SQL that detection runs."""
    cols = ", ".join(f"({f.sql()})::DOUBLE AS f{i}" for i, f in enumerate(features))
    return w.rows(
        f"SELECT id, audit, reward, rewards, task_id, group_id, step, text{', ' + cols if cols else ''} "
        f"FROM ({rule_rows(where)}) ORDER BY id",
        args,
    )
