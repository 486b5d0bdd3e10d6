"""The round's records: the mainline, a branch row, and one model per stage result. Each stage's result is
stored as JSON in the ledger (stages.result) and read back through these models, so a renamed or missing
key fails loudly where it is read. The JSON keys are the ones ledgers have always held: old runs load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from evotrainer.backtest.trial import ArmResult
from evotrainer.backtest.verdict import Regression
from evotrainer.diagnostics.detector import Finding
from evotrainer.diagnostics.suite import Suite
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Intervention
from evotrainer.proposers.proposer import Proposal
from evotrainer.records import Record
from evotrainer.stages.noise import NoiseBank

SEED_STRIDE = 7919
"""A prime between a run's seed families: the arms of a round (race.arm_seed) and the attempts at a round
(Mainline.seed), so no two draw the same tasks and sampling noise."""


class Peak(Record):
    """A checkpoint the mainline passed through, with its read on the gate tasks (stages/guard.py)."""

    branch: str
    checkpoint: str
    step: int
    outcomes: dict[str, bool]
    attempt: int = 0
    """The highest Mainline.attempt the mainline has trained from here with: going back here, it trains on the
    next, so it does not replay the steps that fell to the same draws."""

    @property
    def accuracy(self) -> float:
        return sum(self.outcomes.values()) / max(1, len(self.outcomes))


class Mainline(Record):
    """Where training continues from: a branch's checkpoint, its harness and suite, and what the next
    round needs to know (the measured noise, whether an A-A control is due, findings carried in)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("raced", "promoted_at", "exploited", "peak")

    branch: str
    checkpoint: str
    harness: Harness
    suite: Suite
    step: int
    noise: NoiseBank | None = None
    aa_due: bool = True
    carry: list[Finding] = []
    raced: int | None = None
    """Rounds that raced candidates so far (None: none yet, or a run from before run-level error control): each
    spends a share of the run's error rate (gate.round_alpha)."""
    promoted_at: list[int] | None = None
    """Which of those raced rounds promoted (their indices among raced rounds): a promotion earns wealth back."""
    attempt: int = 0
    """How many times the mainline rolled back to this checkpoint: the next round trains on other seeds,
    so a rollback buys information instead of replaying the same segment to the same verdicts."""
    exploited: ArmResult | None = None
    """The segment this checkpoint trained under this harness, which carried an exploit (a validity finding) that
    the round's control, on seeds of its own, carried again: the next round diagnoses that segment again instead of
    training a third copy of the exploit, and spends its tokens on its next remedy, or ends the run where none fits
    (None: no such segment, or the mainline has moved, or was rolled back for something else)."""
    peak: Peak | None = None
    """The mainline's best read on the gate tasks so far, which the guard stage reads each new head against and
    rolls back to (None: nothing read yet, or a run from before the guard)."""

    def seed(self, base: int) -> int:
        """The seed the round's segment and arms derive theirs from."""
        return base + SEED_STRIDE * 1000 * self.attempt

    def at(self, branch: str, checkpoint: str, step: int) -> Mainline:
        """The mainline moved to another checkpoint (a fresh start: no rollback to it yet)."""
        update = {"branch": branch, "checkpoint": checkpoint, "step": step, "attempt": 0, "exploited": None}
        return self.model_copy(update=update)

    def retried(self) -> Mainline:
        """The mainline where it was, after its round's training was thrown away: the next tries other seeds."""
        return self.model_copy(update={"attempt": self.attempt + 1, "exploited": None})


class BranchRecord(Record):
    """One row of the ledger's branches table."""

    id: str
    parent: str | None
    round: int
    kind: str
    checkpoint: str
    harness_version: str
    suite_version: str
    first_step: int
    last_step: int
    seed: int
    heldout_accuracy: float | None

    @classmethod
    def of(cls, arm: ArmResult, rnd: int, parent: str | None, suite_version: str, seed: int) -> BranchRecord:
        return cls(
            id=arm.branch,
            parent=parent,
            round=rnd,
            kind=arm.role,
            checkpoint=arm.checkpoint,
            harness_version=arm.harness_version,
            suite_version=suite_version,
            first_step=arm.first_step,
            last_step=arm.last_step,
            seed=seed,
            heldout_accuracy=arm.accuracy,
        )


class Adoption(Record):
    """A skill the run started under without a trial (loop.adopt_skills, SkillLibrary.adoptable): what it set,
    the harness version it was applied to and the one it made, and the trials that won it in this context."""

    skill: str
    intervention: Intervention
    harness_from: str
    harness_to: str
    won: list[str]
    """`run/trial` of each win in this context (the same domain, model and harness version), and of each repair,
    marked `(repair)`; for a regrade adopted across domains (loop.adopt_skills `across`), every win or repair it
    has anywhere, each marked with its decision and domain."""


class StartResult(Record):
    OMIT_NONE: ClassVar[tuple[str, ...]] = ("adopted",)
    head: Mainline
    final_accuracy: float
    evaluator_hash: str
    warm_start_seconds: float = 0.0
    """Building (or loading) the starting policy: a one-time cost, cached across runs, kept out of the budget."""
    adopted: list[Adoption] | None = None
    """The skills adopted at the start, in order (None where loop.adopt_skills is off or none qualified)."""


class DiagnoseResult(Record):
    findings: list[Finding]


class ReviseResult(Record):
    suite: Suite
    accepted: bool
    revisions: list[dict[str, Any]]
    refused_for_flips: list[dict[str, Any]]
    induction: dict[str, Any]
    findings: list[Finding]


class ProposalRecord(Record):
    intervention: Intervention
    source: str
    skill_id: str | None
    note: str
    key: str

    def proposal(self) -> Proposal:
        return Proposal(self.intervention, self.source, self.skill_id, self.note)


class ProposeResult(Record):
    signature: list[str]
    proposals: list[ProposalRecord]
    spares: list[ProposalRecord] | None = None
    """Screened proposals beyond loop.candidates, best first: where the replay drops a proposal (it changes nothing
    on the segment's rollouts, or worsens the audit AUC), the next spare is replayed in its place, so a no-op does
    not leave the round's slot empty (None: none, and a ledger written before spares)."""
    refused: list[dict[str, Any]]
    skills_matched: list[str]
    suite: Suite
    detectors: list[dict[str, Any]]
    OMIT_NONE: ClassVar[tuple[str, ...]] = ("spares",)


class ReplayDecision(Record):
    index: int
    replay: dict[str, Any] | None
    why: str


class ReplayResult(Record):
    kept: list[ReplayDecision]
    dropped: list[ReplayDecision]

    def survivors(self, proposals: list[Proposal]) -> list[Survivor]:
        """The proposals that go on to a trial (of the round's proposals, then its spares), each with its replay."""
        return [Survivor(proposals[k.index], k.replay) for k in self.kept]


@dataclass(frozen=True)
class Survivor:
    """A proposal that reaches the trial, with its replay report (None: not replayable). Rebuilt from the
    propose and replay results wherever a stage needs it, never stored itself."""

    proposal: Proposal
    replay: dict[str, Any] | None


class TrialResult(Record):
    OMIT_DEFAULT: ClassVar[tuple[str, ...]] = ("raced",)

    arms: list[ArmResult]
    abandoned: str | None = None
    cap: str = ""
    """The budget cap that abandoned the trial (generated_tokens, trained_tokens, seconds); "" when it ran."""
    finalist: int | None = None
    """The candidate (1-based) the race sent to its confirmation; None when none went."""
    note: str = ""
    """Why no confirmation ran, or how the trial was limited to keep within loop.max_trial_share."""
    raced: Literal["control", "start"] = "control"
    """What the candidates raced at the checkpoints: the control's reads, or the start's (race.race_reads)."""

    def arm(self, branch: str) -> ArmResult | None:
        return next((a for a in self.arms if a.branch == branch), None)


class VerdictLine(Record):
    trial: str
    decision: str
    reasons: list[str]
    delta: float


class GateResult(Record):
    noise: NoiseBank
    aa_measured: bool | None = None
    """None in ledgers written before it was recorded: then an A-A arm that ran counts as measured."""
    control_findings: list[Finding] = []
    control_rejected: list[str] = []
    verdicts: list[VerdictLine]


class Rollback(Record):
    """The mainline went back to where the round started: the control carries an exploit and nothing valid won,
    or the new head (`branch`) is significantly below the round's start (reasons ["regression"], its statistic);
    or, in the guard stage, below the mainline's best read (reasons ["decline"]: it went back to that checkpoint)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("regression",)
    branch: str
    reasons: list[str]
    rolled_back_to: str
    regression: Regression | None = None


class Repair(Record):
    """Nothing won and the control carries an exploit, but a raced remedy for it was valid on every run and not
    significantly below the round's start (gate.repair): the mainline adopts that candidate's harness (`harness`)
    instead of going back to the one that pays the exploit. Its policy continues from the candidate's checkpoint
    (`continues_from`), or where the round started when the candidate stopped early. No gain is claimed."""

    trial: str
    harness: str
    closes: list[str]
    continues_from: str


class PromoteResult(Record):
    OMIT_NONE: ClassVar[tuple[str, ...]] = ("repaired",)
    head: Mainline
    promoted: str | None
    rejected: Rollback | None = None
    repaired: Repair | None = None


class RememberResult(Record):
    skills: list[dict[str, Any]]


def skill_note(s: dict[str, Any]) -> str:
    """One skill a round's remember stage touched, as the console and the report say it."""
    held = "; held against its adoption: the round rolled back under it" if s.get("held") else ""
    quarantined = ", quarantined" if s["quarantined"] else ""
    library = f"{s['wins']} won, {s['losses']} lost"
    if "run_wins" in s:  # notes written before a run's own counts were kept carry the library's only
        library = f"this run {s['run_wins']} won, {s['run_losses']} lost; library {library}"
    return f"{s['skill']} ({library}{quarantined}{held})"


class GuardResult(Record):
    """Stage 10 (stages/guard.py): the round's new head read on the gate tasks, against the mainline's best read
    so far; where it is significantly below that, the mainline goes back there (`rollback`)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("accuracy", "outcomes", "rollback")
    head: Mainline
    accuracy: float | None = None
    """The new head's read on the gate tasks (None: not read, `note` says why)."""
    outcomes: dict[str, bool] | None = None
    """That read by gate task, for the run's ending (guard.ending) to test against the best read (None: not read,
    or recorded before the ending tested)."""
    rollback: Rollback | None = None
    note: str = ""


class Stop(Record):
    """Why the run stops ("": it goes on), and the budget cap that stopped it ("" when none did)."""

    reason: str = ""
    cap: str = ""


class FinalResult(Record):
    accuracy: float
    evaluator_hash: str
    head: Mainline
    stop_reason: str
    rounds: int
    ended_on_best: str | None = None
    """Where the last head read below the mainline's best read on the gate tasks, why the run ended on that best
    (stages/guard.py, `ending`); None (not written) where it ended on its last head."""
    cut_by_seconds: bool | None = None
    """True when budget.seconds, a safety net, ended the run before the budget that decides (tokens, rounds) did:
    its decisions are a shorter run's, and depend on the machine's speed. Written only then (None is not
    written), so the records of runs it did not cut are what they were before it existed."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("cut_by_seconds", "ended_on_best")


def seconds_cut_note(rounds: int) -> str:
    """What a run that budget.seconds cut says at its end, in `evotrainer status` and in the report."""
    return (
        f"CUT SHORT by budget.seconds, a safety net, after {rounds} round(s): the decisions are those of a shorter "
        "run and depend on this machine's speed; raise budget.seconds to let the token budget decide"
    )


def past_budget_note(cap: str, used: float, over: float) -> str:
    """What a run that went past a cap of its budget says at its end, in the console and in the report."""
    return (
        f"spent {used:,.0f} against budget.{cap} {used - over:,.0f}: {over:,.0f} past it (the budget is checked "
        "between steps and stages; the step or read that crossed it ran to its end)"
    )


# The model of each stage's result, by stage name (`train` is the segment's ArmResult).
STAGE_RESULTS: dict[str, type[BaseModel]] = {
    "start": StartResult,
    "train": ArmResult,
    "diagnose": DiagnoseResult,
    "revise": ReviseResult,
    "propose": ProposeResult,
    "replay": ReplayResult,
    "trial": TrialResult,
    "gate": GateResult,
    "promote": PromoteResult,
    "remember": RememberResult,
    "guard": GuardResult,
    "final": FinalResult,
}


def stage_results(rows: list[dict[str, Any]]) -> dict[tuple[int, str], BaseModel]:
    """Typed results of the ledger's `stages` rows (round, stage, result JSON), by (round, stage)."""
    return {(r["round"], r["stage"]): STAGE_RESULTS[r["stage"]].model_validate_json(r["result"]) for r in rows}


def read_stage(ledger: Any, rnd: int, stage: str) -> BaseModel | None:
    """The typed result of one finished stage of a run's ledger (None while it has not finished)."""
    done = ledger.stage_result(rnd, stage)
    return None if done is None else STAGE_RESULTS[stage].model_validate(done)
