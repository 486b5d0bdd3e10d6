"""Two-factor remedies. A single-factor search cannot find a remedy that works only with a second knob moved (SWE's
regrade, which collapses at a learning rate the hand-set reference had to lower). Where a change was rejected while
its trial's window carried a finding its control's did not (what the change did besides what it was meant to), and
that finding names another knob, the change is proposed again with that knob moved by the finding's own remedy.
The pair is one hypothesis ("the change works once the other knob is moved"), one trial and one verdict, recorded as
such (Intervention.paired). It is proposed only on the harness the change was rejected under, and only while the
finding the change answered stands (or for an exploratory change)."""

from __future__ import annotations

from collections.abc import Callable

from evotrainer.diagnostics.detector import Finding
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Intervention
from evotrainer.proposers.proposer import Brief, PastTrial, intervention_key

Remedies = Callable[[Finding, Harness], list[Intervention]]


def pairs(brief: Brief, remedies: Remedies) -> list[Intervention]:
    """Two-factor candidates from this run's rejected trials, the latest first: each rejected single change with the
    first remedy (by `remedies`, the proposer's own ranking) of each finding its window newly carried, on a knob that
    finding names other than the change's own."""
    h, standing = brief.harness, {f.name for f in brief.findings} | {"explore"}
    out: dict[str, Intervention] = {}
    for t in sorted(brief.history, key=lambda t: -t.round):
        iv = t.intervention
        if t.decision != "reject" or iv.paired is not None or t.harness != h.version:
            continue
        if iv.hypothesis.finding not in standing:
            continue
        for f in t.new_findings:
            second = next(
                (r for r in remedies(f, h) if r.target != iv.target and r.target in f.knobs),
                None,
            )
            if second is not None:
                pair = _pair(t, f, second)
                out.setdefault(intervention_key(pair), pair)
    return list(out.values())


def _pair(t: PastTrial, f: Finding, second: Intervention) -> Intervention:
    iv, hyp = t.intervention, t.intervention.hypothesis
    why = (
        f"{iv.describe()} was rejected alone in round {t.round} ({', '.join(t.reasons) or 'no win'}) with {f.name} on "
        f"its window and not on the control's; {f.name} names {second.target}: the change with that knob moved"
    )
    return Intervention(
        kind=iv.kind,
        target=iv.target,
        value=iv.value,
        hypothesis=hyp.model_copy(update={"rationale": why}),
        paired=second.unbound(),
    )
