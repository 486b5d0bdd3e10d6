"""The level a round's candidates are tested at under the run's error control, shared by the trial (whether a
confirmation can pass, race._finalist) and the gate (decide.gate_stage)."""

from __future__ import annotations

from evotrainer.backtest import gate
from evotrainer.config import GateSection
from evotrainer.stages.results import Mainline
from evotrainer.store.ledger import Ledger


def with_history(ledger: Ledger, head: Mainline, rnd: int) -> Mainline:
    """`head` with the raced rounds before `rnd` and which of them promoted, read from the ledger's verdicts where
    the mainline does not carry them (a run written before the run's error control, resumed by this version: its
    raced rounds have spent part of the run's error rate, and its count goes on from them rather than from 1)."""
    if head.raced is not None or rnd == 1:
        return head
    by_round: dict[int, bool] = {}
    for v in ledger.verdicts():
        if v["round"] < rnd:
            by_round[v["round"]] = by_round.get(v["round"], False) or v["decision"] == "promote"
    found = [t for t, r in enumerate(sorted(by_round), 1) if by_round[r]]
    return head.model_copy(update={"raced": len(by_round) or None, "promoted_at": found or None})


def round_level(section: GateSection, head: Mainline, races: bool) -> tuple[float, dict]:
    """The level this round's candidates are tested at, and what the verdicts record of it: under
    gate.error_control run, 1 - this raced round's share of the run's error rate (gate.round_alpha, from the
    raced rounds before it and which of them promoted); under `round`, gate.level itself."""
    if section.error_control == "round" or not races:
        return section.level, {}
    t = (head.raced or 0) + 1
    alpha = gate.round_alpha(1.0 - section.level, t, head.promoted_at or [])
    return 1.0 - alpha, {"raced_round": t, "run_level": section.level}
