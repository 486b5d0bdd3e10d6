"""Two-factor remedies. A single-factor search cannot find a remedy that works only with a second knob moved (SWE's
regrade, which collapses at a learning rate the hand-set reference had to lower). Where a change was rejected while
its trial's window carried a finding its control's did not (what the change did besides what it was meant to), and
that finding names another knob, the change is proposed again with that knob moved by the finding's own remedy.
The pair is one hypothesis ("the change works once the other knob is moved"), one trial and one verdict, recorded as
such (Intervention.paired). It is proposed only on the harness the change was rejected under, and only while the
finding the change answered stands (or for an exploratory change). A pair rejected while its window newly carried a
finding that names its second knob again is proposed once more with that knob moved on by the finding's remedy, from
where the pair had set it: the same hypothesis with the second factor not yet far enough (swe_short_300k seed 4,
where the start read 0.91 on the gate tasks: the regrade fell below it at the naive 5e-4 and again with the step
halved, and with no third step the run ended on its base, half its tokens unspent)."""

from __future__ import annotations

from collections.abc import Callable

from evotrainer.diagnostics.detector import Finding
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Intervention, knob_value
from evotrainer.harness.knobs import knob
from evotrainer.proposers.proposer import Brief, PastTrial, intervention_key

Remedies = Callable[[Finding, Harness], list[Intervention]]


def pairs(brief: Brief, remedies: Remedies) -> list[Intervention]:
    """Two-factor candidates from this run's rejected trials, the latest first: each rejected single change with the
    first remedy (by `remedies`, the proposer's own ranking) of each finding its window newly carried, on a knob that
    finding names other than the change's own; each rejected pair with its second knob moved further (_further)."""
    h, standing = brief.harness, {f.name for f in brief.findings} | {"explore"}
    out: dict[str, Intervention] = {}
    for t in sorted(brief.history, key=lambda t: -t.round):
        iv = t.intervention
        if t.decision != "reject" or t.harness != h.version or iv.hypothesis.finding not in standing:
            continue
        if iv.paired is not None:
            for pair in _further(t, h, remedies):
                out.setdefault(intervention_key(pair), pair)
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


def _further(t: PastTrial, h: Harness, remedies: Remedies) -> list[Intervention]:
    """The rejected pair of `t` with its numeric second knob moved on in the direction the pair moved it: by the
    first remedy, on that knob, of each finding its window newly carried that names the knob, reckoned from the
    value the pair had set (the learning rate halved once more where the pair with the step halved still fell below
    the start). A switch, a choice, a filter or a reward term has no "further": its other settings are the catalog's
    to propose (and a reward term the pair added is no knob of the harness it was rejected under)."""
    second = t.intervention.paired
    if second.kind != "set_knob" or knob(second.target).type not in ("int", "float"):
        return []
    old, new = knob_value(h, second.target), second.value
    where, out = second.unbound().apply(h), []
    for f in t.new_findings:
        if second.target not in f.knobs:
            continue
        on = next((r for r in remedies(f, where) if r.target == second.target), None)
        if on is not None and (on.value - new) * (new - old) > 0:
            out.append(_pair(t, f, on, further=True))
    return out


def _pair(t: PastTrial, f: Finding, second: Intervention, further: bool = False) -> Intervention:
    iv, hyp = t.intervention, t.intervention.hypothesis
    alone = "" if further else " alone"
    moved = "moved further" if further else "moved"
    why = (
        f"{iv.describe()} was rejected{alone} in round {t.round} ({', '.join(t.reasons) or 'no win'}) with {f.name} "
        f"on its window and not on the control's; {f.name} names {second.target}: the change with that knob {moved}"
    )
    return Intervention(
        kind=iv.kind,
        target=iv.target,
        value=iv.value,
        hypothesis=hyp.model_copy(update={"rationale": why}),
        paired=second.unbound(),
    )
