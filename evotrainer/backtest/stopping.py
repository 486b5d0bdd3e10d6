"""The race's stopping rule: where a racing candidate stops at a checkpoint because it cannot win. Stopping a loser
only saves its tokens; it promotes nothing (the gate reads the arms that ran their length)."""

from __future__ import annotations

from evotrainer.backtest.statistics import Pair, sign_p

# A candidate past the first checkpoint stops only when it is behind with this one-sided sign-test p: a
# real gain can trail for a while (on benchmarks/gate_calibration.py's arms a learning-rate fix did).
BEHIND_P = 0.1
FIRST_CHECKPOINT = "at the first checkpoint"  # in a stop's reason there, which benchmarks/trial_stops.py counts


def futile(cand: dict[str, bool], ref: dict[str, bool] | None, first: bool, against: str = "control") -> str:
    """Why a racing candidate stops at a checkpoint ("" to go on). Against the control (`against` "control"): at
    the first, not ahead of it on the gate tasks (a change that has not moved the policy past it yet rarely does
    later); at later ones, clearly behind it. On benchmarks/gate_calibration.py's arms, null candidates then ran
    9-11 of 20 steps while 99% of the learning-rate fixes ran them all. Against the start (`against` "start": a
    remedy raced beside a segment that carries an exploit, `ref` the policy the arms fork from): clearly behind it,
    at the first checkpoint too. There the control pays the exploit, so the mainline cannot go on from it, and a
    remedy level with the start after three steps is the arm the round's training would continue from; stopped,
    its steps are thrown away and the mainline starts again from the start (swe_short_300k on an AVX2 EPYC: both
    remedies level with the control three steps in, before its exploit reached the gate reads, stopped, and the
    run never left its base at seed 2). Stopping a loser can only lower the chance of a false promotion: no arm
    is promoted early, the winner runs its length and faces the gate."""
    if ref is None:
        return ""
    pair = Pair.of(cand, ref)
    if first and against == "control" and pair.wins <= pair.losses:
        return f"not ahead of the control {FIRST_CHECKPOINT} (delta {pair.delta:+.3f})"
    if (not first or against != "control") and sign_p(pair.losses, pair.wins) <= BEHIND_P:
        return f"behind the {against} (delta {pair.delta:+.3f}, sign-test p {sign_p(pair.losses, pair.wins):.3f})"
    return ""
