"""One raced round on each of the gate's paths, run through the gate's own functions: shared by the simulated
arms of benchmarks/gate_simulation.py and the real arm pools of benchmarks/gate_calibration.py.

The paths:
- race_confirmation: the race's finalist confirmed beside a control replicate, whose pair with the control joins
  the noise bank (gate.finalist, gate.confirmed), where the confirmation could pass (gate.confirmation_power, as
  race._finalist asks);
- against_start: the control and its replicate carry an exploit, so both stages are compared with the round's
  start read (gate.comparators), under the noise the run banked in an earlier round, and the finalist has a
  second confirmation run (race._second_replicate_due), each of which must pass;
- own_noise: as against_start in a run that has banked no pair: the finalist's own runs measure the noise
  (gate.finalist_noise);
- sign: one stage, Holm across the round's candidates, with an A-A arm every round (gate.single_stage); refused
  for new runs (start.check_gate), measured to show why.
"""

from __future__ import annotations

from typing import Protocol

from evotrainer.backtest import gate
from evotrainer.backtest.statistics import Pair

PATHS = ("race_confirmation", "against_start", "own_noise", "sign")
Outcomes = dict[str, bool]


class Round(Protocol):
    """The arms of one round: `start` (the read of the policy they fork from), `arm(fix)` a fresh arm's final
    gate outcomes (the fix's harness when `fix`), `stopped(cand, control)` whether the race stops that candidate
    at one of its checkpoints (stopping.futile)."""

    start: Outcomes

    def arm(self, fix: bool = False) -> Outcomes: ...

    def stopped(self, cand: Outcomes, control: Outcomes) -> bool: ...


def one_round(arms: Round, path: str, k: int, bank: list[Pair], alpha: float, fix: bool) -> tuple[bool, bool]:
    """One raced round on `path`: (a candidate was promoted, the fix was the one promoted). Candidate 1 is the
    fix when `fix`; `bank` (the run's earlier A-A pairs) grows by this round's."""
    control, cands = arms.arm(), [arms.arm(fix and j == 0) for j in range(k)]
    level = 1.0 - alpha
    if path == "sign":
        aa = arms.arm()
        bank.append(Pair.of(aa, control))
        tests = gate.single_stage([Pair.of(c, control) for c in cands], gate.moderated(bank), level)
        passed = [j for j, (_, reasons) in enumerate(tests) if not reasons]
        return bool(passed), 0 in passed and fix
    exploit = path != "race_confirmation"
    first = arms.start if exploit else control
    # the race stops losers against the control's checkpoint reads, whatever the finalist is then compared with
    race = [None if arms.stopped(c, control) else Pair.of(c, first) for c in cands]
    banked = gate.moderated(bank)
    j, _ = gate.finalist(race, banked)
    if j is None:
        return False, False
    # race._finalist confirms only where the confirmation could pass at the race's own effect
    if gate.confirmation_power(race[j - 1], k, banked, level, runs=2 if exploit else 1) < gate.CONFIRM_POWER_MIN:
        return False, False
    runs = [cands[j - 1], arms.arm(fix and j == 1)]
    if exploit:  # compared with the start: the finalist's third run (race._second_replicate_due); the control's
        runs.append(arms.arm(fix and j == 1))  # replicate carries the exploit too: no A-A pair (gate.aa_pair_valid)
        ctlr = control
    else:
        ctlr = arms.arm()
        bank.append(Pair.of(ctlr, control))
    own = gate.moderated([Pair.of(r, runs[0]) for r in runs[1:]])
    noise, _ = gate.finalist_noise(gate.moderated(bank), own)
    stat, reasons = gate.confirmed(tuple(runs), (control, ctlr), arms.start, k, noise, level, (exploit, exploit))
    return not reasons, not reasons and fix and j == 1
