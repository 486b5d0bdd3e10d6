"""The skill library: promoted interventions kept as reusable remedies, shared across runs (by default the runs
of one project: `<run.out_dir>/skills`).

A skill is one JSON file in the library directory: what the remedy set (the value, not a step: "learning rate
x3" misapplies once the knob has moved, and says nothing of where the knob should be), the trigger signature
(the findings that called for it), the contexts it was tried in (domain, model, the harness it was applied to
and the value it replaced), evidence (every trial that used it: run, round, decision, effect, and whether the
trial was the skill reused) and lineage. A skill is offered first where its signature matches, in any domain;
where the harness already holds its value it is not offered. A new skill is quarantined until it has won twice.

A loss is the other half of what a project learns: every rejected trial, one JSON file per change (`r-*.json`) with
the same evidence. A later run in the same context (domain, model, the harness version the change was tried on)
does not pay for the same trial again while its policy is near the step the loss was found at
(proposers.proposer.standing): on SWE every cold run spent its trial share on the same three losing moves.
Writes are atomic (temp file, fsync, rename) under a lock file, so concurrent runs do not lose each other's
evidence. A run reads the library as it found it at its start, and its own trials: overlapping runs learn from each
other at their next start, and a resumed run decides as the killed one would have (SkillLibrary.as_found)."""

from __future__ import annotations

import fcntl
import hashlib
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from itertools import count
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evotrainer.config import PolicySection
from evotrainer.errors import ConfigError
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Hypothesis, Intervention, knob_value
from evotrainer.proposers.proposer import SkillMatch, similarity
from evotrainer.store.files import atomic_write_text

WINS_TO_LEAVE_QUARANTINE = 2
FOR = ("promote", "repair")
"""The evidence decisions that create a skill and count for its adoption (against `reject`)."""
GLOBAL_LIBRARY = Path("~/.evotrainer/skills")
"""A library shared by every project of this user: read and written only where loop.skills_dir names it."""
PROJECT_LIBRARY = "skills"
"""The project's library, a directory of this name beside its runs (in run.out_dir): the default."""
AUDIT_GAP = "reward_audit_gap"
"""The core finding every regrade answers, whatever the domain: the reward pays what the evaluator's audit fails."""


def model_name(policy: PolicySection) -> str:
    """The model a run trains, as a skill's context records it: the pretrained model's name, the checkpoint
    directory's, or the from-scratch kind."""
    return policy.pretrained or (Path(policy.path).name if policy.path else policy.kind)


def library_dir(skills_dir: str | Path | None, out_dir: str | Path) -> Path:
    """The library a run uses: loop.skills_dir where set, else the project's, beside the runs."""
    return Path(skills_dir).expanduser() if skills_dir is not None else Path(out_dir) / PROJECT_LIBRARY


class Evidence(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run: str
    round: int
    trial: str
    decision: str
    """promote or reject (a trial's verdict); repair (a rejected remedy whose harness the mainline took in place of
    one that pays an exploit: the gate's repair, neither a win nor a loss); or adopt (a run started under it:
    `adoptable`)."""
    effect: float | None = None
    """Candidate minus control held-out accuracy (gate tasks)."""
    domain: str = ""
    signature: list[str] = Field(default_factory=list)
    model: str = ""
    """The policy the trial trained (decide.model_name): a pretrained model's name, a checkpoint's, or `tiny`."""
    harness: str = ""
    """The version of the harness the intervention was applied to."""
    before: Any = None
    """The value the intervention replaced there."""
    reused: bool = False
    """The trial's proposal was this skill, offered from the library (not found afresh)."""
    step: int | None = None
    """The mainline step the trial forked from (its candidate's first step); None in evidence written before it was
    kept. A loss blocks the same change in another run only near this step (proposers.proposer.standing)."""


def in_context(evidence: list[Evidence], domain: str, model: str, harness: str) -> list[Evidence]:
    """The trials among `evidence` in one context: this domain and model, applied to this harness version."""
    return [e for e in evidence if (e.domain, e.model, e.harness) == (domain, model, harness)]


class Loss(BaseModel):
    """Every rejected trial of one change (any run, any context): what a later run need not try again there."""

    model_config = ConfigDict(extra="forbid")
    id: str
    intervention: Intervention
    """The change as it was tried (unbound: its value, not the value it replaced)."""
    evidence: list[Evidence] = Field(default_factory=list)

    def evidence_in(self, domain: str, model: str, harness: str) -> list[Evidence]:
        """Its rejected trials in one context (in_context)."""
        return in_context(self.evidence, domain, model, harness)


class Skill(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    kind: str
    target: str
    value: Any = None
    """What the remedy set: the knob's value, the term's weight, the replacing term."""
    factor: float | None = None
    """Skills written before values were kept: new / old, applied to the current value when reused. New skills keep
    the value (None here)."""
    hypothesis: Hypothesis
    paired: Intervention | None = None
    """A two-factor remedy's second change, as it set it (interventions.Intervention.paired)."""
    signature: list[str]
    domains: list[str]
    evidence: list[Evidence] = Field(default_factory=list)
    lineage: dict[str, Any] = Field(default_factory=dict)
    """Where it came from: the run, round and trial that first promoted it, and its source (catalog, explore, llm)."""

    @property
    def wins(self) -> int:
        return sum(e.decision == "promote" for e in self.evidence)

    @property
    def losses(self) -> int:
        return sum(e.decision == "reject" for e in self.evidence)

    @property
    def repairs(self) -> int:
        """Repairs it made (evidence `repair`): neither wins nor losses, but a reason to adopt it (`adoptable`)."""
        return sum(e.decision == "repair" for e in self.evidence)

    @property
    def quarantined(self) -> bool:
        return self.wins < WINS_TO_LEAVE_QUARANTINE

    @property
    def mean_effect(self) -> float:
        e = [x.effect for x in self.evidence if x.effect is not None]
        return sum(e) / len(e) if e else 0.0

    @property
    def reuses(self) -> list[Evidence]:
        """The trials that were this skill offered from the library: where it was reused and what it bought."""
        return [e for e in self.evidence if e.reused]

    def evidence_in(self, domain: str, model: str, harness: str) -> list[Evidence]:
        """The trials of it in one context (in_context)."""
        return in_context(self.evidence, domain, model, harness)

    @property
    def models(self) -> list[str]:
        return sorted({e.model for e in self.evidence if e.model})

    def instantiate(self, h: Harness) -> Intervention:
        """This skill as an intervention on harness h: its value (a skill from before values were kept applies its
        factor to h's current value). ValueError where h already holds it: there is nothing to remedy."""
        value = self.value
        if self.factor is not None:
            current = knob_value(h, self.target)
            value = type(current)(
                round(current * self.factor) if isinstance(current, int) else float(f"{current * self.factor:.3g}")
            )
        elif self.kind == "set_knob" and knob_value(h, self.target) == value:
            raise ValueError(f"{self.target} is already {value!r}")
        return Intervention(
            kind=self.kind, target=self.target, value=value, hypothesis=self.hypothesis, paired=self.paired
        )


def skill_id(iv: Intervention) -> str:
    """The skill of an intervention: its kind, target and the value it set (and its pair's, for a two-factor one)."""
    pair = None if iv.paired is None else [iv.paired.kind, iv.paired.target, iv.paired.value]
    key = json.dumps([iv.kind, iv.target, iv.value, pair], sort_keys=True, default=str)
    return "k-" + hashlib.sha256(key.encode()).hexdigest()[:10]


def standing(evidence: list[Evidence]) -> int:
    """Trials won or repaired (FOR) less trials lost: what adoption weighs."""
    return sum(e.decision in FOR for e in evidence) - sum(e.decision == "reject" for e in evidence)


def exposed_term(h: Harness, variants: Mapping[str, tuple[str, ...]]) -> tuple[str, str] | None:
    """The term a regrade plays in this domain: h's paid term with the heaviest weight (then by name) among those
    the domain declares an audited variant for (`variants`: its DomainSpec.audited_variants), and the first such
    variant h does not pay. None where h pays no such term."""
    paid = sorted((w, t) for t, w in h.reward_weights.items() if w > 0)
    exposed = [(t, v) for _, t in reversed(paid) for v in variants.get(t, ()) if v not in h.reward_weights]
    return exposed[0] if exposed else None


def carried(s: Skill, term: str, variant: str) -> Intervention:
    """A regrade skill learned elsewhere as an intervention on this domain's exposed term (exposed_term). Its paired
    change stays behind: a paired learning rate was set for its own domain's scale (SWE's 5e-4 halved is 2.5x
    code's 1e-4)."""
    hyp = Hypothesis(
        finding=AUDIT_GAP,
        signal=s.hypothesis.signal,
        direction=s.hypothesis.direction,
        rationale=f"skill {s.id} ({s.target} -> {s.value} in {', '.join(s.domains)}) carried to this domain's "
        f"exposed term: the reward pays a channel the audit does not back; regrade it",
    )
    return Intervention(kind="replace_reward_term", target=f"reward_weights.{term}", value=variant, hypothesis=hyp)


def evidence_key(e: Evidence) -> str:
    """A trial's evidence as one string: its run and trial (what a run's view of the library is made of)."""
    return f"{e.run}/{e.trial}"


def run_name(name: str, seen: list[str]) -> str:
    """The name a run's evidence carries in a library that held the evidence `seen` (evidence_key) when the run
    first opened it: `name`, or `name~N` (the next free) where another run's evidence was already there under it (a
    run of the same name in another project sharing the library, or one run again with --overwrite). Evidence is
    united by (run, trial): two runs under one name would lose each other's trials and read each other's as their
    own."""
    taken = {k.rsplit("/", 1)[0] for k in seen}  # trial ids hold no "/"; a run's name may
    return next(n for i in count(1) if (n := name if i == 1 else f"{name}~{i}") not in taken)


class SkillLibrary:
    def __init__(self, root: str | Path, seen: frozenset[str] | None = None, run: str = ""):
        """`seen`: the evidence (evidence_key) this library is read as holding, besides run `run`'s own; None reads
        every record. A run reads the library as it found it at its start (as_found), so that other runs' writes
        since then change none of its decisions, and a killed run resumes to the decisions it would have made."""
        self.root = Path(root).expanduser()
        self.seen, self.run = seen, run

    def evidence_keys(self) -> list[str]:
        """Every trial's evidence here, skills' and losses' (evidence_key), sorted."""
        return sorted({evidence_key(e) for r in [*self.all(), *self.all_losses()] for e in r.evidence})

    def as_found(self, seen: list[str], run: str) -> SkillLibrary:
        """This library read as holding only the evidence `seen` and run `run`'s own; it writes as this one does."""
        return SkillLibrary(self.root, frozenset(seen), run)

    def _visible(self, records: list[Any]) -> list[Any]:
        if self.seen is None:
            return records
        out = []
        for r in records:
            kept = [e for e in r.evidence if e.run == self.run or evidence_key(e) in self.seen]
            if kept:
                out.append(r.model_copy(update={"evidence": kept}))
        return out

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self, prefix: str, model: type[Skill] | type[Loss], what: str) -> list[Any]:
        """Every `<prefix>*.json` record here, read as `model`; one that does not parse names its file and the fix."""
        out = []
        for p in sorted(self.root.glob(f"{prefix}*.json")) if self.root.is_dir() else []:
            try:
                out.append(model.model_validate_json(p.read_text()))
            except ValidationError as e:
                raise ConfigError(
                    f"{what} file {p} is not a valid {what} ({e.error_count()} errors); remove or fix it"
                ) from None
        return out

    def all(self) -> list[Skill]:
        return self._visible(self._read("k-", Skill, "skill"))

    def get(self, sid: str) -> Skill:
        p = self.root / f"{sid}.json"
        if not p.is_file():
            raise ConfigError(f"no skill {sid!r} in {self.root}; `evotrainer skills list` shows the ids")
        return Skill.model_validate_json(p.read_text())

    def _write(self, skill: Skill) -> None:
        atomic_write_text(self.root / f"{skill.id}.json", skill.model_dump_json(indent=2))

    def record(
        self, iv: Intervention, ev: Evidence, *, source: str, create: bool, sid: str | None = None
    ) -> Skill | None:
        """Add a trial's outcome to the skill of this intervention. A promotion creates the skill
        (quarantined) when it does not exist; a rejection only counts against an existing one.
        Recording the same trial twice (a resumed run) changes nothing. `sid`: the skill a proposal
        came from (its instantiated value may round differently from the template)."""
        sid = sid or skill_id(iv)
        with self._locked():
            path = self.root / f"{sid}.json"
            if path.is_file():
                skill = Skill.model_validate_json(path.read_text())
            elif create:
                skill = Skill(
                    id=sid,
                    kind=iv.kind,
                    target=iv.target,
                    value=iv.value,
                    hypothesis=iv.hypothesis,
                    paired=iv.unbound().paired,
                    signature=ev.signature,
                    domains=[ev.domain],
                    lineage={"run": ev.run, "round": ev.round, "trial": ev.trial, "source": source},
                )
            else:
                return None
            if any((e.run, e.trial) == (ev.run, ev.trial) for e in skill.evidence):
                return skill
            skill.evidence.append(ev)
            if ev.domain and ev.domain not in skill.domains:
                skill.domains.append(ev.domain)
            if ev.decision in FOR:
                # The trigger signature grows to every signature it has won or repaired under.
                skill.signature = sorted(set(skill.signature) | set(ev.signature))
            self._write(skill)
            return skill

    def match(
        self,
        signature: tuple[str, ...],
        domain: str,
        h: Harness,
        model: str = "",
        variants: Mapping[str, tuple[str, ...]] | None = None,
    ) -> list[SkillMatch]:
        """Skills whose trigger signature overlaps this one, in any domain, best first: similarity, then won in the
        same domain, then with the same model, then out of quarantine, then net wins. A skill whose value h already
        holds, or for a knob h does not have, is not offered; a regrade of a term h does not pay is offered as the
        term it plays here (carried, by `variants`: the domain's audited variants), where h has one."""
        out = []
        for s in self.all():
            sim = similarity(s.signature, signature)
            if sim <= 0:
                continue
            try:
                iv = s.instantiate(h)
            except (AttributeError, KeyError, TypeError, ValueError):
                continue  # a skill for a knob this harness does not have
            if iv.kind == "replace_reward_term" and iv.target.split(".", 1)[1] not in h.reward_weights:
                if (exposed := exposed_term(h, variants or {})) is None:
                    continue
                iv = carried(s, *exposed)
            out.append(
                (
                    (domain in s.domains, model in s.models),
                    SkillMatch(
                        s.id,
                        iv,
                        tuple(s.signature),
                        sim,
                        s.wins,
                        s.losses,
                        s.mean_effect,
                        s.quarantined,
                        tuple(s.domains),
                    ),
                )
            )
        out.sort(
            key=lambda t: (
                -t[1].similarity,
                not t[0][0],
                not t[0][1],
                t[1].quarantined,
                -(t[1].wins - t[1].losses),
                t[1].skill_id,
            )
        )
        return [m for _, m in out]

    def record_loss(self, iv: Intervention, ev: Evidence) -> Loss:
        """Add a rejected trial to the loss record of its change (created on the first). The same trial twice (a
        resumed run) changes nothing."""
        lid = "r-" + skill_id(iv)[2:]
        with self._locked():
            path = self.root / f"{lid}.json"
            loss = (
                Loss.model_validate_json(path.read_text())
                if path.is_file()
                else Loss(id=lid, intervention=iv.unbound())
            )
            if all((e.run, e.trial) != (ev.run, ev.trial) for e in loss.evidence):
                loss.evidence.append(ev)
                atomic_write_text(path, loss.model_dump_json(indent=2))
            return loss

    def all_losses(self) -> list[Loss]:
        return self._visible(self._read("r-", Loss, "loss record"))

    def losses_in(
        self, domain: str, model: str, harness: str, *, besides: str = ""
    ) -> list[tuple[Intervention, Evidence]]:
        """Rejected trials of other runs than `besides` (a run's own are in its ledger) in this context: the same
        domain and model, tried on this harness version; none of a change whose skill won or repaired as many trials
        in this context as it lost there (its standing is not negative: it is offered, not blocked). Oldest first."""
        out, skills = [], {s.id: s for s in self.all()}
        for loss in self.all_losses():
            here = loss.evidence_in(domain, model, harness)
            skill = skills.get("k-" + loss.id.removeprefix("r-"))
            won = skill.evidence_in(domain, model, harness) if skill else []
            if len(here) > sum(e.decision in FOR for e in won):
                out += [(loss.intervention, e) for e in here if e.run != besides]
        return out

    def record_in(self, domain: str, model: str, harness: str, *, besides: str = "") -> tuple[int, int]:
        """Trials of other runs than `besides` in this context (the same domain and model, on this harness version):
        how many won or repaired (a skill's evidence), and how many lost (the losses' evidence)."""
        won = sum(
            e.decision in FOR and e.run != besides for s in self.all() for e in s.evidence_in(domain, model, harness)
        )
        lost = sum(e.run != besides for x in self.all_losses() for e in x.evidence_in(domain, model, harness))
        return won, lost

    def adoptable(self, domain: str, model: str, h: Harness) -> Skill | None:
        """The skill a run starting under harness h adopts without a trial (loop.adopt_skills), if any: one that
        won or repaired more trials than it lost in this very context (the same domain and model, applied to h
        itself, whose version hashes its content and lineage). Its trigger recurring is then not a guess: the same
        start has shown it. A repair counts beside a win because what it showed is about h: h's control paid an
        exploit, and this remedy closed it, valid on every run and not below the start; starting under h would
        train the exploit again. Best first: net standing there, then its mean effect, then its id. Where h
        already holds its value, or has no such knob, it is not offered."""
        best = None
        for s in self.all():
            here = s.evidence_in(domain, model, h.version)
            net = standing(here)
            if net <= 0:
                continue
            try:
                s.instantiate(h).apply(h)
            except (AttributeError, KeyError, TypeError, ValueError):
                continue
            key = (net, s.mean_effect, s.id)
            if best is None or key > best[0]:
                best = (key, s)
        return None if best is None else best[1]

    def adoptable_across(
        self, domain: str, model: str, h: Harness, variants: Mapping[str, tuple[str, ...]]
    ) -> tuple[Skill, Intervention] | None:
        """A regrade learned in another context (another domain, model or harness) that a run starting under h adopts
        as what it did, not by the names it did it with (loop.adopt_skills `across`): h's exposed term replaced by
        its audited variant (exposed_term, carried). Code's `correct` and SWE's `tests` are the same role, the term
        whose channel the domain knows an exploit for; by names no skill could cross. Adopted where it won or
        repaired more trials than it lost over all its contexts, and not more lost than won in this domain and model
        (start.held_against records the loss). Best first: net standing, mean effect, id."""
        if (exposed := exposed_term(h, variants)) is None:
            return None
        best = None
        for s in self.all():
            here = [e for e in s.evidence if (e.domain, e.model) == (domain, model)]
            net = standing(s.evidence)
            if s.kind != "replace_reward_term" or net <= 0 or standing(here) < 0:
                continue
            key = (net, s.mean_effect, s.id)
            if best is None or key > best[0]:
                best = (key, s)
        return None if best is None else (best[1], carried(best[1], *exposed))

    def merge(self, other: SkillLibrary) -> int:
        """Add another library's skills and losses to this one, evidence united by (run, trial): a project's
        libraries gathered into one, or one run's library handed to the next. Merging twice changes nothing. Returns
        how many records (skills and losses) it read."""
        return self.take(other.all(), other.all_losses())

    def take(self, skills: list[Skill], losses: list[Loss]) -> int:
        """Merge these skills and losses (merge, skills.exchange.import_file); returns how many records it read."""
        self._unite(skills)
        for loss in losses:
            for e in loss.evidence:
                self.record_loss(loss.intervention, e)
        return len(skills) + len(losses)

    def _unite(self, incoming: list[Skill]) -> None:
        """Each incoming skill written here, its evidence united by (run, trial) with this library's of the same id."""
        with self._locked():
            for s in incoming:
                path = self.root / f"{s.id}.json"
                if path.is_file():
                    mine = Skill.model_validate_json(path.read_text())
                    have = {(e.run, e.trial) for e in mine.evidence}
                    mine.evidence += [e for e in s.evidence if (e.run, e.trial) not in have]
                    mine.domains = sorted(set(mine.domains) | set(s.domains))
                    mine.signature = sorted(set(mine.signature) | set(s.signature))
                    s = mine
                self._write(s)
