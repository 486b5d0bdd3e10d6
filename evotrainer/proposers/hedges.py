"""The step a repair trains at. Where the segment carries an exploit (a validity finding), the round's remedy for it
is raced twice: as proposed, and paired with the learning rate lowered (loop.hedge_step), one hypothesis ("the
remedy, at a smaller step"), one more arm. Why, where no trial has failed yet (pairs.py pairs only after one has):
the control pays the exploit, so the round ends in a repair (gate.repair), which adopts a remedy that qualifies
without a win and trains the rest of the run under it at the step it was raced at; the race is the one read of that
step the loop gets, and the repair's rule (the best race read among qualifying remedies) then chooses between the
two. A step set for the old reward is no evidence for the new one: on swe_short_300k the regrade trained static from
each seed's base at half the naive rate led at every seed after one trial's tokens (+0.094, seed t [+0.012,
+0.176]; benchmarks/lr_horizon.py), while at the naive rate it fell below the base within one trial at three
seeds of five and at the other two was adopted as it was, and trailed the reference by 0.055 and 0.070; a lower
rate raced later in the run, after training at the naive one, did not win (HISTORY.md: "A move that fell,
turned"). The remedy alone goes first, so a round that can afford one candidate races it."""

from __future__ import annotations

from evotrainer.diagnostics.detector import Finding
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Intervention, knob_value
from evotrainer.proposers.proposer import Proposal

LR = "optimizer.learning_rate"
LR_FLOOR = 1e-7  # the catalog's lowest learning rate (heuristic.py's halvings stop there)


def hedge(proposals: list[Proposal], findings: list[Finding], h: Harness, step: float) -> Proposal | None:
    """The first of `proposals` that remedies an exploit among `findings`, as a single change of a knob other than
    the learning rate, paired with the learning rate times `step`; None where there is none, `step` is 0, or the
    rate would go below LR_FLOOR. A planted proposal (loop.planted) is the user's one change, and is not hedged."""
    exploits = {f.name for f in findings if f.validity}
    rate = float(f"{knob_value(h, LR) * step:.3g}")
    if not step or rate < LR_FLOOR:
        return None
    for p in proposals:
        iv = p.intervention
        if iv.hypothesis.finding not in exploits or iv.paired is not None or iv.target == LR or p.source == "planted":
            continue
        why = (
            f"{iv.describe()} remedies {iv.hypothesis.finding}; a repair trains on at the step it was raced at, and "
            f"the step was set under the reward that paid the exploit: the remedy with the learning rate x{step:g}"
        )
        second = Intervention(kind="set_knob", target=LR, value=rate, hypothesis=iv.hypothesis)
        paired = Intervention(
            kind=iv.kind,
            target=iv.target,
            value=iv.value,
            hypothesis=iv.hypothesis.model_copy(update={"rationale": why}),
            paired=second,
        )
        return Proposal(paired, "hedge", note=why)
    return None
