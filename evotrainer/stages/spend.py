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
    """Tokens a round's race may take now: the trial share (`share` tokens) reached by the part of the run it
    starts in, less what discarded arms took and the `reserve` a race's winner would need for its confirmation.
    The token budget is cut into `phases` equal parts, and by the end of part p discarded arms, confirmations
    included, may have taken p / phases of the share: a part that spends less leaves it to the later ones, and
    none can spend a later part's portion. Paced on the race alone, a confirmation (three arms) could take what
    the later parts had left: in the README main job rounds 1 and 7 confirmed, and rounds 8-19 raced nothing.
    One part (no pacing) is the whole share at any time."""
    part = phases if spent >= budget else min(phases, spent * phases // budget + 1)
    return share * part / phases - discarded - reserve


def library_share(share: float, won: int, lost: int) -> float:
    """The trial share (`share`) as other runs' trials in this context leave it (loop.trial_share_by_library): what a
    trial is worth is the chance it wins, whose posterior mean under a uniform prior is (won + 1) / (won + lost + 2);
    the share scales by it relative to the uninformed 1/2, so an empty record leaves it as set and a record of wins
    does not raise it past what the user allowed."""
    return share * min(1.0, 2 * (won + 1) / (won + lost + 2))
