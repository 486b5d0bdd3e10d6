"""What a run spent on arms that end discarded: every branch off the mainline's lineage (race losers,
confirmations, A-A arms, the control or the winner the mainline did not continue from, a rolled-back
segment). summary.json, `evotrainer status` and the report give it as discarded_step_share and
discarded_token_share; the trial stage keeps it under loop.max_trial_share, paced over loop.trial_phases."""

from __future__ import annotations

from dataclasses import dataclass

from evotrainer.store.ledger import Ledger


@dataclass(frozen=True)
class Spend:
    steps: int
    steps_discarded: int
    tokens: int
    tokens_discarded: int

    @property
    def step_share(self) -> float:
        return self.steps_discarded / self.steps if self.steps else 0.0

    @property
    def token_share(self) -> float:
        return self.tokens_discarded / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict[str, float]:
        return {
            "training_steps": self.steps,
            "discarded_steps": self.steps_discarded,
            "discarded_step_share": round(self.step_share, 4),
            "arm_generated_tokens": self.tokens,
            "discarded_generated_tokens": self.tokens_discarded,
            "discarded_token_share": round(self.token_share, 4),
        }


def lineage(ledger: Ledger, head: str) -> set[str]:
    """The branches the mainline passed through to reach `head` (head and base included)."""
    parent = {b["id"]: b["parent"] for b in ledger.branches()}
    out, at = set(), head
    while at is not None and at not in out:
        out.add(at)
        at = parent.get(at)
    return out


def spend(ledger: Ledger, kept: set[str], undecided: frozenset[str] = frozenset()) -> Spend:
    """Training steps and generated tokens (training and the arm's own evaluations) of every branch, and
    of those not in `kept`; `undecided` branches (a trial in flight) count in neither share."""
    tokens = {
        r["item"]: int(r["g"])
        for r in ledger.rows(
            "SELECT item, sum(generated_tokens) AS g FROM charges WHERE stage IN ('train', 'trial') GROUP BY item"
        )
    }
    steps = steps_d = toks = toks_d = 0
    for b in ledger.branches():
        if b["id"] in undecided or b["kind"] == "base":
            continue
        n, t = b["last_step"] - b["first_step"] + 1, tokens.get(b["id"], 0)
        steps, toks = steps + n, toks + t
        if b["id"] not in kept:
            steps_d, toks_d = steps_d + n, toks_d + t
    return Spend(steps, steps_d, toks, toks_d)


def race_allowance(share: float, discarded: int, reserve: int, spent: int, budget: int, phases: int) -> float:
    """Tokens a round's race may take now: the trial share (`share` tokens) less what discarded arms took and
    the `reserve` a race's winner would need for its confirmation, paced over `phases` equal parts of the
    token budget. What is left is spread evenly over the tokens left in the run, and the part the run is in
    may take all of its own: (tokens left in this part) / (tokens left in the run) of it. A part that does not
    spend its portion leaves it to the later ones; the last part (and one part: no pacing) may take it all.
    Unpaced, the early rounds raced until the share was gone and later rounds only trained the mainline,
    while the paper's premise is that bottlenecks shift as the policy learns."""
    pool = share - discarded - reserve
    if pool <= 0 or spent >= budget:
        return float(pool)
    part_end = min(phases, spent * phases // budget + 1) * budget / phases
    return pool * (part_end - spent) / (budget - spent)
