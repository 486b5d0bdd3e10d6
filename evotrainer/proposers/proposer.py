"""The proposer contract. A proposer reads a Brief (findings with their evidence, the harness, the
run's history of interventions and verdicts, the matching skills) and returns Proposals: single-factor
interventions, each with the hypothesis it tests. `screen` applies the same checks to every proposer's
output (heuristic or LLM), so what reaches a trial is valid whoever wrote it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from evotrainer.diagnostics.detector import Finding
from evotrainer.harness.harness import Harness
from evotrainer.harness.inert import inert
from evotrainer.harness.interventions import Intervention, InterventionError
from evotrainer.store.ledger import Charge


def signature(findings: list[Finding]) -> tuple[str, ...]:
    """What a round's findings look like, for skill retrieval and for "rejected under the same
    signature": the sorted names of the warning / critical findings (info findings are context)."""
    return tuple(sorted({f.name for f in findings if f.severity != "info"}))


def similarity(a: tuple[str, ...] | list[str], b: tuple[str, ...] | list[str]) -> float:
    """Jaccard similarity of two signatures (1.0 for two empty ones)."""
    sa, sb = set(a), set(b)
    return 1.0 if not sa and not sb else len(sa & sb) / len(sa | sb)


def intervention_key(iv: Intervention) -> str:
    """Identity of an intervention's change (not of its hypothesis): kind, target and value, and its pair's."""
    own = f"{iv.kind}:{iv.target}={json.dumps(iv.value, sort_keys=True, default=str)}"
    return own if iv.paired is None else f"{own} + {intervention_key(iv.paired)}"


def change_key(iv: Intervention) -> str:
    """What an intervention sets, whatever its kind (add_filter or set_knob): its key less the kind."""
    return intervention_key(iv).split(":", 1)[1]


@dataclass(frozen=True)
class PastTrial:
    """One trial of this run, as the proposer sees it."""

    round: int
    intervention: Intervention
    signature: tuple[str, ...]
    decision: str  # promote | reject | abandoned
    reasons: tuple[str, ...]
    effect: float | None  # candidate minus control held-out accuracy on the gate tasks
    harness: str = ""  # the mainline's harness version the trial was run under
    step: int = 0  # the mainline step it forked from
    # Findings (warning or critical) on the candidate's window that its control's did not carry: what the change
    # did besides what it was meant to (where one names another knob, proposers/pairs.py pairs the two).
    new_findings: tuple[Finding, ...] = ()
    run: str = ""  # another run's, from the skill library's losses (Brief.losses); "" for this run's


@dataclass(frozen=True)
class SkillMatch:
    """A skill whose trigger signature resembles this round's, with the evidence a ranker needs."""

    skill_id: str
    intervention: Intervention
    signature: tuple[str, ...]
    similarity: float
    wins: int
    losses: int
    mean_effect: float
    quarantined: bool
    domains: tuple[str, ...]


@dataclass(frozen=True)
class Brief:
    """Everything a proposer may read. It holds no held-out task, hidden test or evaluator data: the
    evidence rollouts are training rollouts of the mainline (see loop.py, which builds it)."""

    run: str
    round: int
    domain: str
    harness: Harness
    findings: list[Finding]
    signature: tuple[str, ...]
    evidence: dict[str, dict[str, Any]] = field(default_factory=dict)  # rollout id -> full record
    metrics: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # name -> (step, value) series
    history: list[PastTrial] = field(default_factory=list)
    skills: list[SkillMatch] = field(default_factory=list)
    limit: int = 2  # how many candidates the round can trial
    explore: float = 0.34  # share of candidates for knobs the run has not tried
    step: int = 0  # the mainline's step now
    expiry: int = 0  # steps after which a rejection no longer blocks (0: only a promotion lifts it)
    losses: list[PastTrial] = field(default_factory=list)  # other runs' rejections on this harness (the library)


@dataclass(frozen=True)
class Proposal:
    """A candidate for a trial. `source`: `skill` (from the library), `catalog` (a known remedy for
    a finding), `pair` (a rejected change with a second knob, pairs.py), `explore` (an untried knob), `llm` or
    `planted` (loop.planted); `skill_id` links a skill's evidence."""

    intervention: Intervention
    source: str
    skill_id: str | None = None
    note: str = ""


@dataclass(frozen=True)
class ProposerOutput:
    """Everything a proposer produces in one round: its proposals; detectors it wrote (as written: the
    loop admits or refuses each after the same checks and backtest as induced ones); and what it spent
    besides the policy's compute (an LLM's tokens, cost and seconds), charged to the propose stage. `spares`: its
    next proposals beyond the limit, best first, which the replay takes in order where it drops one (a proposer
    may give none)."""

    proposals: list[Proposal]
    detectors: list[dict[str, Any]] = field(default_factory=list)
    charges: dict[str, Charge] = field(default_factory=dict)
    spares: list[Proposal] = field(default_factory=list)


class Proposer(Protocol):
    name: str

    def propose(self, brief: Brief) -> ProposerOutput: ...


@dataclass(frozen=True)
class Refusal:
    """A proposal that did not pass screening, and why (recorded in the ledger, fed back to an LLM)."""

    proposal: Proposal
    reason: str


def rejected_under(t: PastTrial, h: Harness) -> bool:
    """Whether t was rejected while the mainline ran harness h (a trial recorded without one counts)."""
    return t.decision == "reject" and (not t.harness or t.harness == h.version)


def standing(t: PastTrial, brief: Brief) -> bool:
    """Whether a past rejection still blocks its intervention: it expires once the mainline has moved on,
    by a promotion (another harness) or by brief.expiry steps; the skill library keeps it as evidence. Another
    run's loss (brief.losses) blocks within brief.expiry steps of where it was found, before as after: a policy
    that far from it, trained from the same start under the same harness, is the one it was found on."""
    return rejected_under(t, brief.harness) and (not brief.expiry or abs(brief.step - t.step) < brief.expiry)


# An exploratory move answers no finding, so the findings of the round that rejected it say nothing about where it
# could win: its rejection blocks it (or a pair built from it, which keeps its hypothesis) as an exploratory move
# again under any signature, or it would come back each time the findings change. A remedy that a finding
# motivates is blocked where that same finding motivates it again, under any signature: a signature that changed
# around the finding (a finding that came or went beside it) is no new evidence for it, as it is none for an
# exploratory move. Another finding that motivates it is new evidence. An exploit's remedy is blocked only under
# the signature it was rejected under: while the exploit stands the reward pays for it, and the remedy is worth
# trying again when anything changes.
def _where(run: str) -> str:
    return "on this run" if not run else f"in run {run} (the skill library's losses, this harness and step range)"


def _exploratory(iv: Intervention) -> bool:
    return iv.hypothesis.finding == "explore"


def screen(proposals: list[Proposal], brief: Brief) -> tuple[list[Proposal], list[Refusal]]:
    """Keep proposals that apply to the harness as exactly one change that can act (harness/inert.py), are not
    duplicates, and were not rejected since the mainline last moved on under the same signature, or under any as an
    exploratory move or as a remedy of the same finding (an exploit's: under the same signature only); bind each to
    the harness."""
    kept: list[Proposal] = []
    refused: list[Refusal] = []
    seen: set[str] = set()
    blocking = [t for t in (*brief.history, *brief.losses) if standing(t, brief)]
    rejected = {(intervention_key(t.intervention), t.signature): t.run for t in reversed(blocking)}
    exploits = {f.name for f in brief.findings if f.validity}
    motivated = {
        (intervention_key(t.intervention), t.intervention.hypothesis.finding): t.run for t in reversed(blocking)
    }
    for p in proposals:
        key, finding = intervention_key(p.intervention), p.intervention.hypothesis.finding
        try:
            bound = p.intervention.bind(brief.harness)
            why = inert(brief.harness, bound.apply(brief.harness))
        except InterventionError as e:
            refused.append(Refusal(p, str(e)))
            continue
        if key in seen:
            refused.append(Refusal(p, "duplicate of an earlier proposal this round"))
        elif why:
            refused.append(Refusal(p, why))
        elif (key, brief.signature) in rejected:
            where = _where(rejected[key, brief.signature])
            refused.append(Refusal(p, f"already rejected {where} under the same signature {list(brief.signature)}"))
        elif (key, finding) in motivated and finding not in exploits:
            kind = "an exploratory move" if _exploratory(p.intervention) else f"a remedy of {finding}"
            refused.append(
                Refusal(p, f"already rejected {_where(motivated[key, finding])} as {kind} (under any signature)")
            )
        else:
            seen.add(key)
            kept.append(Proposal(bound, p.source, p.skill_id, p.note))
    return kept, refused
