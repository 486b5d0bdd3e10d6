"""Stages 1-3, the evidence: train the mainline for a segment, diagnose its rollouts, revise the suite."""

from __future__ import annotations

from dataclasses import asdict, replace

from evotrainer.backtest.trial import ArmResult
from evotrainer.backtest.verdict import read_trials, read_verdicts
from evotrainer.diagnostics.detector import Finding
from evotrainer.diagnostics.revision import PastVerdict, revise
from evotrainer.diagnostics.suite import Suite
from evotrainer.ids import DIAGNOSIS, REVISION, branch_id, shard_id
from evotrainer.stages.context import RunContext, StageRecords, arm_charge, tokens_left
from evotrainer.stages.guard import reserve
from evotrainer.stages.results import BranchRecord, DiagnoseResult, Mainline, ReviseResult
from evotrainer.store.ledger import Ledger


def train(ctx: RunContext, rnd: int, head: Mainline) -> tuple[ArmResult, StageRecords]:
    """The mainline trains `loop.segment_steps` steps under its harness: the round's segment. Under a token
    budget it stops at the step that reaches the budget, as a static run would: the loop spends what a static
    harness spends, no more and no less. Where the mainline stands on a segment whose exploit its control carried
    too (Mainline.exploited), that segment is the round's again and nothing trains: a third run under the same
    harness from the same checkpoint would be the same exploit on other seeds, thrown away once more, and the
    tokens are the remedies'. The last segment stops short of the budget by a read of the gate tasks and a step
    (guard.reserve)."""
    if head.exploited is not None:
        return head.exploited, StageRecords()
    cfg = ctx.cfg
    seg = branch_id(rnd, "segment")
    spec = ctx.spec(
        seg,
        "segment",
        head.checkpoint,
        head.harness,
        head.step + 1,
        cfg.loop.segment_steps,
        head.seed(cfg.run.seed),
        gate=False,
    )
    if left := tokens_left(ctx):
        # The last segment leaves the guard stage the read of its head where the budget holds a step besides: a
        # head nobody reads is one the guard cannot send back.
        keep = reserve(ctx, rnd)
        spec = replace(spec, tokens=left - keep if left - keep >= keep else left)
    [r] = ctx.executor.run([spec])
    return r, StageRecords(
        branches=[BranchRecord.of(r, rnd, head.branch, head.suite.version, head.seed(cfg.run.seed))],
        charges={seg: arm_charge(r)},
    )


def diagnose(ctx: RunContext, rnd: int, suite: Suite, seg: ArmResult) -> tuple[DiagnoseResult, StageRecords]:
    """The suite over the segment's window; the findings are stored (they are evidence), once a suite version
    where an earlier round's segment is read again."""
    found = suite.run(ctx.store, seg.branch, seg.first_step, seg.last_step)
    if seg.branch == branch_id(rnd, "segment") or not _diagnosed(ctx, suite, seg):
        shard = _shard(rnd, seg, DIAGNOSIS)
        ctx.store.append_findings(found, suite.version, shard, seg.branch, seg.first_step, seg.last_step)
    return DiagnoseResult(findings=found), StageRecords()


def _shard(rnd: int, seg: ArmResult, kind: str) -> str:
    """The store file of a diagnosis of the round's segment; of an earlier round's segment read again
    (Mainline.exploited), one of this round's own, so no earlier diagnosis of the window is replaced."""
    shard = shard_id(seg.branch, seg.last_step, kind)
    return shard if seg.branch == branch_id(rnd, "segment") else f"{shard}-r{rnd:02d}"


def _diagnosed(ctx: RunContext, suite: Suite, seg: ArmResult) -> bool:
    rows = ctx.store.sql(
        "SELECT count(*) AS n FROM diagnoses WHERE suite_version = ? AND branch = ? AND last_step = ?",
        [suite.version, seg.branch, seg.last_step],
    )
    return bool(rows[0]["n"])


def revise_suite(ctx: RunContext, rnd: int, suite: Suite, seg: ArmResult) -> tuple[ReviseResult, StageRecords]:
    """Recalibrate thresholds and induce a detector where reward and audit disagree; a revision that
    would flip a past verdict is refused and recorded. The revised suite's new findings on the segment
    join this round's."""
    new, revisions, induction = revise(
        suite, ctx.store, seg.branch, seg.first_step, seg.last_step, verdicts=past_verdicts(ctx.ledger)
    )
    flips = [f for r in revisions for f in r.flips if f.what == "verdict"]
    accepted = bool(revisions) and not flips
    extra: list[Finding] = []
    if accepted:
        extra = [
            f for f in new.run(ctx.store, seg.branch, seg.first_step, seg.last_step) if f.name not in suite.detectors
        ]
        ctx.store.append_findings(
            extra,
            new.version,
            _shard(rnd, seg, REVISION),
            seg.branch,
            seg.first_step,
            seg.last_step,
        )
    return ReviseResult(
        suite=new if accepted else suite,
        accepted=accepted,
        revisions=[r.to_record() for r in revisions],
        refused_for_flips=[asdict(f) for f in flips],
        induction={"accepted": induction.accepted, "reason": induction.reason},
        findings=extra,
    ), StageRecords()


def past_verdicts(ledger: Ledger) -> list[PastVerdict]:
    """Every verdict of the run, as the window of the candidate it judged: what a revision is backtested on."""
    branches = {b["id"]: b for b in ledger.branches()}
    trials = {t.id: t for t in read_trials(ledger)}
    out = []
    for v in read_verdicts(ledger):
        b = branches[trials[v.trial].candidate]
        out.append(PastVerdict(b["id"], b["first_step"], b["last_step"], v.decision, tuple(v.reasons)))
    return out


def dedupe(findings: list[Finding]) -> list[Finding]:
    """One finding per name, the most severe (then the latest window) kept."""
    rank = {"critical": 2, "warning": 1, "info": 0}
    best: dict[str, Finding] = {}
    for f in findings:
        if f.name not in best or (rank[f.severity], f.last_step) > (
            rank[best[f.name].severity],
            best[f.name].last_step,
        ):
            best[f.name] = f
    return list(best.values())
