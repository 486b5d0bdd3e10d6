"""The gate's records: each test's statistic with the validity figures beside it, the noise estimate a verdict
was made under, and the ledger's verdict and trial rows, typed. The JSON keys are the ones ledgers have always
held, so a run written before these models loads with them (and theirs load in the older readers)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Discriminator, Tag

from evotrainer.backtest.statistics import Noise, Pair
from evotrainer.diagnostics.detector import Finding
from evotrainer.harness.interventions import Intervention
from evotrainer.records import Record
from evotrainer.store.ledger import Charge, Ledger


class Validity(Record):
    """What the validity rules read (gate.validity_reasons), both arms measured under one reward function: the
    share of rewarded audited train rollouts that fail the audit, the reward's rise over the arm's steps, and the
    train-audit pass rate; None where the arm had no audited rollout."""

    gap_candidate: float | None = None
    gap_control: float | None = None
    reward_rise_candidate: float | None = None
    reward_rise_control: float | None = None
    audit_pass_candidate: float | None = None
    audit_pass_control: float | None = None


class Disagreements(Record):
    """Held-out rollout ids where the arms disagree (the candidate's, then the control's), so a reader can open
    the trajectories."""

    candidate_won: list[str] = []
    candidate_lost: list[str] = []


class Statistic(Validity):
    """A verdict's statistic: its test's figures (a subclass each), the validity figures, the evidence and both
    arms' gate accuracies (filled by the gate stage around what the test returned)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("raced_round", "run_level")  # a verdict from before run-level control
    test: str
    level: float
    delta: float
    """The effect on record: candidate minus the arm it was tested against, on the gate tasks."""
    evidence: Disagreements = Disagreements()
    candidate_accuracy: float | None = None
    control_accuracy: float | None = None
    raced_round: int | None = None
    """The round's index among the run's raced rounds, which sets its share of the run's error rate."""
    run_level: float | None = None
    """1 - the run's error rate that `level` was spent from (gate.error_control run); None: a per-round level."""


class PairFigures(Record):
    """One comparison on the gate tasks (statistics.Pair) with its accuracy difference."""

    wins: int
    losses: int
    n: int
    delta: float


def pair_figures(pair: Pair) -> dict[str, Any]:
    """PairFigures' fields of a Pair, for a record that holds them."""
    return {"wins": pair.wins, "losses": pair.losses, "n": pair.n, "delta": pair.delta}


class RaceStage(PairFigures):
    p_adjusted: float
    """The race's p, Bonferroni-adjusted for the round's candidates."""


class ConfirmStage(PairFigures):
    p: float


class NoiseTest(Statistic):
    """A test under the run's noise model: its p, and the model's phi, A-A pairs and degrees of freedom."""

    candidates: int
    p: float
    phi: float
    noise_pairs: int
    dof: float


class TwoStage(NoiseTest):
    """The finalist's test: the race combined with its confirmation on fresh seeds (gate.two_stage)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = (*Statistic.OMIT_NONE, "against", "start_accuracy", "second_stage")
    test: Literal["two_stage"] = "two_stage"
    stage1: RaceStage
    stage2: ConfirmStage
    selected_delta: float
    """The race's delta, inflated by its selection; the one on record is the confirmation's."""
    against: str | None = None
    """Set when the finalist was tested against the round's starting policy (the control carries an exploit)."""
    start_accuracy: float | None = None
    second_stage: ConfirmStage | None = None
    """Against the starting policy, the finalist's other confirmation run (gate.confirmed): both must pass, and
    `stage2` is the weaker of the two."""
    confirmed_accuracy: float | None = None
    confirmed_control_accuracy: float | None = None


class SignHolm(NoiseTest, PairFigures):
    """One stage, Holm-corrected across the round's candidates (gate.single_stage)."""

    test: Literal["sign_holm"] = "sign_holm"


class RaceResult(Statistic, PairFigures):
    """A candidate the race decided: it stopped early, or it was not the one confirmed."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = (*Statistic.OMIT_NONE, "stopped", "not_confirmed")
    test: Literal["race"] = "race"
    candidates: int
    stopped: str | None = None
    not_confirmed: str | None = None


class Regression(PairFigures):
    """The regression guard's statistic (gate.regression): the new head against the policy the round's arms forked
    from on the gate tasks (wins: tasks the head passes and the start fails; delta head minus start), the one-sided
    p of "the start is better" under the run's noise model, and both accuracies."""

    p: float
    phi: float
    level: float
    head_accuracy: float
    start_accuracy: float


class OlderTest(Statistic):
    """The one-stage tests of runs before the noise model (`paired_bootstrap`, `sign`), kept as they were stored."""

    model_config = ConfigDict(extra="allow")
    OMIT_NONE: ClassVar[tuple[str, ...]] = (*Statistic.OMIT_NONE, "lower", "p", "n")
    lower: float | None = None
    p: float | None = None
    n: int | None = None


def _test_of(v: Any) -> str:
    test = v.get("test") if isinstance(v, dict) else getattr(v, "test", None)
    return test if test in ("two_stage", "sign_holm", "race") else "older"


AnyStatistic = Annotated[
    Annotated[TwoStage, Tag("two_stage")]
    | Annotated[SignHolm, Tag("sign_holm")]
    | Annotated[RaceResult, Tag("race")]
    | Annotated[OlderTest, Tag("older")],
    Discriminator(_test_of),
]


class NoiseLine(Record):
    """The noise estimate a verdict was made under: the harness whose A-A pairs measured it, phi, how many pairs,
    the t reference's degrees of freedom. Runs before the noise model stored the A-A delta instead
    (`abs_delta`, phi None)."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("measured_on", "abs_delta")
    harness: str = ""
    phi: float | None = None
    pairs_used: int = 0
    dof: float | None = None
    valid: bool = False
    measured_on: str | None = None
    """Set when the finalist's own two runs measured it (gate.finalist_noise)."""
    abs_delta: float | None = None

    def noise(self) -> Noise:
        return Noise(self.phi, self.pairs_used, self.dof)

    def line(self) -> NoiseLine:
        """The estimate alone (a bank's pairs stay in the bank)."""
        return NoiseLine(
            harness=self.harness, phi=self.phi, pairs_used=self.pairs_used, dof=self.dof, valid=self.valid
        )


class VerdictBudget(Record):
    """What the candidate and the control spent, and the run's spend when the verdict was made."""

    candidate: Charge
    control: Charge
    spent: Charge


class VerdictRecord(Record):
    """One row of the ledger's verdicts table: promote or reject, why, the statistic, the noise estimate, the
    validity findings of the candidate's window, the budget and the evaluator's hash."""

    trial: str
    round: int
    decision: str
    reasons: list[str]
    statistic: AnyStatistic
    noise: NoiseLine
    findings: list[Finding]
    budget: VerdictBudget
    evaluator_hash: str
    decided: float | None = None
    """When the ledger wrote it (the ledger sets it)."""


class TrialRecord(Record):
    """One row of the ledger's trials table: a candidate, its control, the intervention it tried and where the
    intervention came from, the round's finding signature and the replay that let it through (None: not
    replayable)."""

    id: str
    round: int
    candidate: str
    control: str
    intervention: Intervention
    source: str
    skill_id: str | None
    signature: list[str]
    replay: dict[str, Any] | None


def read_trials(ledger: Ledger) -> list[TrialRecord]:
    return [TrialRecord.model_validate(t) for t in ledger.trials()]


def read_verdicts(ledger: Ledger) -> list[VerdictRecord]:
    return [VerdictRecord.model_validate(v) for v in ledger.verdicts()]
