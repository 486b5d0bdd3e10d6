"""The co-evolution loop, one round top to bottom: train the mainline for a segment; diagnose; revise the
suite; propose; replay; trial; gate; promote; remember; guard the mainline against its best read. `evotrainer run`
runs rounds until the budget is spent; `evotrainer resume` continues a killed run.

Each stage body lives in evotrainer/stages/ and returns a typed result (stages/results.py); run_stage
commits that result, the stage's records and its done mark in one ledger transaction. A stage's result
is all that later stages read, so a resumed run reads finished stages back from the ledger and redoes
the first unfinished one from its start: nothing is lost or written twice, and the decisions are the
ones an uninterrupted run with the same seed makes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from rich.console import Console

from evotrainer.backtest import gate
from evotrainer.backtest.trial import RESULT, ArmResult
from evotrainer.config import RunConfig
from evotrainer.ids import branch_id
from evotrainer.report import write_report
from evotrainer.report.console import Narrator
from evotrainer.stages import decide, evidence, guard, race, retention, search, start
from evotrainer.stages.context import RunContext, StageRecords, run_stage, tokens_left
from evotrainer.stages.results import (
    DiagnoseResult,
    FinalResult,
    GateResult,
    GuardResult,
    Mainline,
    PromoteResult,
    ProposeResult,
    RememberResult,
    ReplayResult,
    ReviseResult,
    StartResult,
    Stop,
    TrialResult,
)
from evotrainer.store.damage import mend
from evotrainer.store.files import atomic_write_json

R = TypeVar("R", bound=BaseModel)
_stop_signal = 0  # a signal's number once the CLI's handler has asked the run to stop; 0 while it runs


class Stopped(Exception):
    """A signal (SIGTERM, SIGINT) asked the run to stop, and it did at a stage boundary: every stage up to
    the one named is committed, and `evotrainer resume` continues from the next."""

    def __init__(self, run_dir: str, rnd: int, stage: str, signum: int):
        self.exit_code = 128 + signum  # the shell's convention for a process ended by that signal
        super().__init__(
            f"stopped at a stage boundary after round {rnd} stage {stage}; `evotrainer resume {run_dir}` continues"
        )


def request_stop(signum: int) -> None:
    """Stop at the next stage boundary (0: no stop asked). Only a flag: a signal handler runs between any two
    bytecodes, perhaps inside a ledger transaction, so it must not do the stopping itself."""
    global _stop_signal
    _stop_signal = signum


def stage(ctx: RunContext, rnd: int, name: str, model: type[R], work: Callable[[], tuple[R, StageRecords]]) -> R:
    """run_stage, then a stop if one was asked for: the stage's records and done mark are committed."""
    result = run_stage(ctx, rnd, name, model, work)
    if _stop_signal:
        raise Stopped(str(ctx.run_dir), rnd, name, _stop_signal)
    return result


def run_loop(
    cfg: RunConfig, console: Console | None = None, resume: bool = False, accept_evaluator_change: bool = False
) -> dict[str, Any]:
    tell = Narrator(console or Console())
    # -- 0. open the run: every config mistake is caught before anything is written --------------------------
    ctx = start.open_run(cfg, resume, accept_evaluator_change)
    if resume:  # a file damaged since it stopped: set aside and its arm redone, or named and refused
        for note in mend(ctx.run_dir, ctx.ledger, ctx.store, RESULT):
            tell.say(note, markup=False)
    started = stage(ctx, 0, "start", StartResult, lambda: start.start(ctx, tell.say))
    head = started.head
    tell.opened(str(ctx.run_dir), cfg.env.domain, len(ctx.gate_ids), len(ctx.final_ids), started.final_accuracy)
    rnd, ran, stop = 0, 0, Stop()
    while not stop.reason:
        rnd += 1
        if (stop := start.stop_before(ctx, rnd)).reason:
            break
        head, stop = close_round(ctx, tell, rnd, head, *run_round(ctx, tell, rnd, head))
        ran = rnd  # a round that ends the run ran too (its segment trained)
    # -- the end: one read of the final tasks (by the best read, where the last head read below it), the summary,
    # the report (a stop asked for now waits for them) --------------------------------------------------------
    done = run_stage(ctx, 0, "final", FinalResult, lambda: start.final(ctx, *guard.ending(ctx, head, ran), stop, ran))
    summary = start.summary(ctx, started, done)
    atomic_write_json(ctx.run_dir / "summary.json", summary, indent=2)
    report = write_report(ctx.run_dir)
    tell.done(summary, str(report))
    if ctx.tracking is not None:
        ctx.tracking.finish([report, ctx.run_dir / "summary.json"])
    ctx.ledger.close()
    return summary


def run_round(ctx: RunContext, tell: Narrator, rnd: int, head: Mainline) -> tuple[Mainline, Stop]:
    """One round; returns the mainline it ends on and, when the run must stop here, why."""
    harness, suite = head.harness, head.suite
    tell.round(rnd, head)
    # -- 1. train the mainline for a segment (where a segment's exploit recurred in its control, that one again) ----
    seg = stage(ctx, rnd, "train", ArmResult, lambda: evidence.train(ctx, rnd, head))
    tell.train(seg)
    # -- 2. diagnose: the suite over the segment, plus what the gate saw on the mainline's last arm ---------------
    own = stage(ctx, rnd, "diagnose", DiagnoseResult, lambda: evidence.diagnose(ctx, rnd, suite, seg)).findings
    findings = evidence.dedupe(own + head.carry)
    tell.diagnose(findings)
    # -- 3. revise the suite: recalibrate, induce; a revision that flips a past verdict is refused ---------------
    revised = stage(ctx, rnd, "revise", ReviseResult, lambda: evidence.revise_suite(ctx, rnd, suite, seg))
    suite, own, findings = revised.suite, own + revised.findings, evidence.dedupe(findings + revised.findings)
    tell.revise(revised)
    # -- 4. propose single-factor interventions from the findings and the skill library ------------------------
    window = (seg.first_step, seg.last_step)
    proposed = stage(
        ctx,
        rnd,
        "propose",
        ProposeResult,
        lambda: search.propose(ctx, rnd, harness, suite, findings, seg.branch, window),
    )
    suite, proposals = proposed.suite, [p.proposal() for p in proposed.proposals]
    tell.propose(proposals)
    # -- 5. replay: re-score the segment's rollouts; drop what changes nothing or worsens the audit AUC, and replay
    # a spare proposal in the place of each one dropped -----------------------------------------------------------
    pool, want = proposals + [p.proposal() for p in proposed.spares or []], len(proposals)
    replayed = stage(
        ctx, rnd, "replay", ReplayResult, lambda: search.replay_stage(ctx, harness, pool, findings, seg.branch, want)
    )
    survivors = replayed.survivors(pool)
    tell.replay(replayed, pool, len(proposals))
    # -- 6. trial: control, candidates and (when due) the A-A control, from one checkpoint ---------------------
    # A segment whose own window carries a validity finding is not built on: the arms fork from where the
    # round started, so the remedy is tried on a policy the exploit never touched.
    # A segment read again (Mainline.exploited) stays tainted by its control's exploit should a revised suite no
    # longer flag its own window: it was thrown away, and the arms must not fork from it.
    taint = gate.tainted(own) or (gate.tainted(head.carry) if head.exploited is not None else [])
    tried = stage(ctx, rnd, "trial", TrialResult, lambda: race.trial(ctx, rnd, head, seg, survivors, taint, suite))
    tell.trial(tried, head.branch, taint)
    if tried.abandoned:  # the mainline keeps the segment unless it is tainted (an exploit is never built on: it
        # stays where the round started, and the next round trains a segment of its own on other seeds); while
        # tokens are left, the next round's segment trains on them, else the run ends here (as it does on a segment
        # read again: its next segment would be a third sample of the exploit)
        end = head.retried() if taint else head.at(seg.branch, seg.checkpoint, seg.last_step)
        go_on = tried.cap == "generated_tokens" and tokens_left(ctx) and head.exploited is None
        return end, Stop() if go_on else Stop(reason=tried.abandoned or "", cap=tried.cap)
    # -- 7. gate: a paired win beyond the A-A noise, no validity finding against it -------------------------------
    gated = stage(
        ctx,
        rnd,
        "gate",
        GateResult,
        lambda: decide.gate_stage(ctx, rnd, head, suite, tried, survivors, proposed.signature),
    )
    tell.gate(gated, [s.proposal for s in survivors], branch_id(rnd, "control"))
    # -- 8. promote: at most one winner; else the control carries on; else a valid remedy's harness; else roll back
    promoted = stage(
        ctx, rnd, "promote", PromoteResult, lambda: decide.promote(ctx, rnd, head, suite, tried, gated, survivors)
    )
    tell.promote(promoted)
    # -- 9. remember: every verdict becomes evidence for (or against) a skill -----------------------------------
    remembered = stage(
        ctx,
        rnd,
        "remember",
        RememberResult,
        lambda: decide.remember(ctx, rnd, head.harness.version, gated, survivors, proposed.signature, promoted),
    )
    tell.remember(remembered)
    end = decide.reread(promoted, gated, seg, taint)
    if promoted.rejected and not survivors:
        return end, Stop(
            reason=f"the control carries an exploit ({', '.join(promoted.rejected.reasons)}) and no remedy is left"
            " to try"
        )
    return end, Stop()


def close_round(
    ctx: RunContext, tell: Narrator, rnd: int, before: Mainline, head: Mainline, stop: Stop
) -> tuple[Mainline, Stop]:
    # -- 10. guard: the new head against the mainline's best read on the gate tasks; far below it, back there ----
    guarded = stage(ctx, rnd, "guard", GuardResult, lambda: guard.guard(ctx, rnd, before, head))
    tell.guard(guarded)
    # -- 11. retention: the round is decided; checkpoints nothing will fork from again give back their disk ----
    mode = ctx.cfg.run.keep_checkpoints
    peak = guarded.head.peak
    tell.pruned(retention.prune(ctx.ledger, ctx.run_dir, mode, rnd, guarded.head.branch, peak and peak.branch))
    return guarded.head, stop
