"""The remedy contract: a catalog entry mapping a finding to one single-factor change of the harness, with the
reward-term remedies shared by the heuristic proposer's catalog and the domains that bring remedies for their own
findings (envs/domains.py). A leaf below both: it imports no proposer and no domain."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from evotrainer.diagnostics.detector import Finding
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Kind, knob_value

# The signal most remedies hope to move: the evaluator-owned held-out accuracy.
ACC = "heldout/accuracy"


@dataclass(frozen=True)
class Remedy:
    """One catalog entry: a single-factor change, computed from the harness (None: not applicable). A target
    `reward_weights.{term}` stands for each reward term the finding names in its knobs."""

    kind: Kind
    target: str
    value: Callable[[Harness, Finding], Any]
    signal: str
    direction: str
    rationale: str


def scale(path: str, factor: float, lo: float, hi: float, integer: bool = False) -> Callable[[Harness, Finding], Any]:
    """A value: the knob's current value times `factor`, kept within [lo, hi] (rounded to 3 significant digits,
    or to an integer)."""

    def value(h: Harness, f: Finding) -> Any:
        v = min(max(knob_value(h, path) * factor, lo), hi)
        return int(round(v)) if integer else float(f"{v:.3g}")

    return value


def const(v: Any) -> Callable[[Harness, Finding], Any]:
    """A value: always `v`."""
    return lambda h, f: v


# The generic remedies of a term that pays for something other than the task (the heuristic's reward_hacking).
DROP_TERM = Remedy(
    "remove_reward_term",
    "reward_weights.{term}",
    const(None),
    ACC,
    "up",
    "the term rises while the audit does not: it pays for something other than the task",
)
REWEIGHT_TERM = Remedy(
    "set_reward_weight",
    "reward_weights.{term}",
    lambda h, f: float(f"{h.reward_weights.get(f.knobs[0].split('.', 1)[1], 1.0) / 4:.3g}"),
    ACC,
    "up",
    "a smaller weight makes the exploit worth less than solving the task",
)
# Regrade a term to an audited variant of it: a grader that scores the same thing without the exploit's channel.
# The proposer picks the variant from the domains' audited variants (envs/domains.py); the value here is unused.
REGRADE = Remedy(
    "replace_reward_term",
    "reward_weights.{term}",
    const(None),
    ACC,
    "up",
    "the reward pays for a channel the audit does not back; regrade it so the exploit earns nothing",
)
# A domain's exploit finding (its reward pays a channel the audit does not back): close the channel first
# (regrade), then the generic hacking remedies (drop the term, lower its weight).
EXPLOIT_REMEDIES = (REGRADE, DROP_TERM, REWEIGHT_TERM)


def partial_credit(term: str, outcomes: tuple[str, ...], weight: float = 0.5) -> Remedy:
    """A domain's partial-credit outcome term (a share of the tests, where the outcome is all of them), added where
    the harness pays one of the all-or-nothing `outcomes` and the finding names the term (so the run's domain has
    it): a failing group whose rollouts get partway apart gets spread of its own, without a judge."""

    def value(h: Harness, f: Finding) -> Any:
        pays = any(h.reward_weights.get(t) for t in outcomes)
        return weight if pays and f"reward_weights.{term}" in f.knobs else None

    return Remedy(
        "add_reward_term",
        f"reward_weights.{term}",
        value,
        "frac_reward_zero_std",
        "down",
        f"dead groups dominate: {term} pays partway progress on the outcome, so failing groups spread",
    )
