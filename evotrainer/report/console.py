"""What the loop says on the console, in one place: one line (or a few) per stage, from its typed result."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from evotrainer.backtest.trial import ArmResult
from evotrainer.diagnostics.detector import Finding
from evotrainer.proposers.proposer import Proposal
from evotrainer.stages.results import (
    GateResult,
    GuardResult,
    Mainline,
    PromoteResult,
    RememberResult,
    ReplayResult,
    ReviseResult,
    TrialResult,
    past_budget_note,
    seconds_cut_note,
    skill_note,
)
from evotrainer.store.checkpoints import human


class Narrator:
    """The console lines of a run. Escapes what rich would read as markup (`[skill]`, user text)."""

    def __init__(self, console: Console):
        self.say = console.print

    def opened(self, run_dir: str, domain: str, gate: int, final: int, baseline: float) -> None:
        self.say(
            f"[bold]run[/] {run_dir}  domain {domain}  held-out: {gate} gate / {final} final tasks  "
            f"baseline (final tasks) {baseline:.3f}"
        )

    def round(self, rnd: int, head: Mainline) -> None:
        self.say(f"\n[bold]round {rnd}[/]  mainline {head.branch} at step {head.step}  harness {head.harness.version}")

    def train(self, seg: ArmResult) -> None:
        self.say(
            f"1 train     {seg.branch}: steps {seg.first_step}-{seg.last_step}, reward {seg.reward_first:.3f} -> "
            f"{seg.reward_last:.3f}"
        )

    def diagnose(self, findings: list[Finding]) -> None:
        self.say(
            "2 diagnose  "
            + f"{len(findings)} finding(s): "
            + (", ".join(f"{f.name} ({f.severity})" for f in findings) or "none")
        )

    def revise(self, r: ReviseResult) -> None:
        self.say(
            f"3 revise    suite {r.suite.version}"
            + (" (revised)" if r.accepted else " (unchanged)")
            + (f"; refused: flips {len(r.refused_for_flips)} past verdict(s)" if r.refused_for_flips else "")
        )

    def propose(self, proposals: list[Proposal]) -> None:
        self.say(
            "4 propose   "
            + (
                "; ".join(
                    escape(f"{p.intervention.describe()} [{p.source}{' ' + p.skill_id if p.skill_id else ''}]")
                    for p in proposals
                )
                or "nothing to propose"
            )
        )

    def replay(self, r: ReplayResult, proposals: list[Proposal], spares_from: int) -> None:
        """`proposals`: the round's, then its spares from index `spares_from` on (a spare goes on in the place of
        one dropped)."""
        spare = [k for k in r.kept if k.index >= spares_from]
        self.say(
            f"5 replay    {len(r.kept)} to trial, {len(r.dropped)} dropped"
            + "".join(f"; dropped {escape(proposals[d.index].intervention.describe())}: {d.why}" for d in r.dropped)
            + "".join(f"; in its place the spare {escape(proposals[k.index].intervention.describe())}" for k in spare)
        )

    def trial(self, t: TrialResult, forked_from: str, taint: list[str]) -> None:
        if t.abandoned:
            self.say(f"6 trial     abandoned: {t.abandoned}")
            return
        arms = ", ".join(
            f"{a.branch} {a.accuracy:.3f}"
            + (f" (stopped at {a.last_step})" if a.stopped else "")
            + (" (read only: the segment stands as its run)" if a.role == "control" and not a.steps_trained else "")
            for a in t.arms
        )
        self.say(
            f"6 trial     {arms} (gate tasks)"
            + (f"; forked from {forked_from}: the segment carries {', '.join(taint)}" if taint else "")
            + (f"; {escape(t.note)}" if t.note else "")
        )

    def gate(self, g: GateResult, proposals: list[Proposal], control: str) -> None:
        n = g.noise
        noise = (
            (f"phi {n.phi:.2f} from {n.pairs_used} A-A pair(s)" if n.valid else "no A-A pair yet")
            if n.phi is not None
            else f"noise {n.abs_delta or 0:.3f}"
        )
        for v, p in zip(g.verdicts, proposals, strict=False):
            self.say(
                f"7 gate      {v.trial} {escape(p.intervention.describe())}: [bold]{v.decision}[/] "
                f"(delta {v.delta:+.3f}, {noise}{'; ' + ', '.join(v.reasons) if v.reasons else ''})"
            )
        if g.control_rejected:
            self.say(
                f"7 gate      control {control} (harness unchanged): [bold]reject[/] ({', '.join(g.control_rejected)})"
            )

    def promote(self, p: PromoteResult) -> None:
        head = p.head
        if (r := p.repaired) is not None:
            self.say(
                f"8 promote   nothing; [bold]repaired[/]: the control pays {', '.join(r.closes)}, so the mainline "
                f"takes {r.trial}'s harness {r.harness} (valid, not below the start; no gain claimed) "
                f"and continues from {head.branch} at step {head.step}"
            )
            return
        self.say(
            "8 promote   "
            + (
                f"{p.promoted}: harness {head.harness.version}"
                if p.promoted
                else f"nothing; mainline {'rolls back to' if p.rejected else 'continues from'} {head.branch} "
                f"at step {head.step}"
            )
        )

    def guard(self, g: GuardResult) -> None:
        if (back := g.rollback) is not None and back.regression is not None:
            r = back.regression
            self.say(
                f"10 guard    {back.branch} read {r.head_accuracy:.3f} on the gate tasks, significantly below the "
                f"mainline's best, {r.start_accuracy:.3f} at {back.rolled_back_to} (p {r.p:.3g}): [bold]back[/] to "
                f"it at step {g.head.step}"
            )
        elif g.accuracy is not None:
            best = g.head.peak
            self.say(
                f"10 guard    {g.head.branch} reads {g.accuracy:.3f} on the gate tasks"
                + (f" (the best so far {best.accuracy:.3f}, {best.branch})" if best is not None else "")
            )
        elif g.note:
            self.say(f"10 guard    not read: {g.note}")

    def remember(self, r: RememberResult) -> None:
        if r.skills:
            self.say("9 remember  " + "; ".join(skill_note(s) for s in r.skills))

    def pruned(self, freed: dict[str, int]) -> None:
        if freed:
            self.say(
                f"11 retention  pruned the weights of {len(freed)} discarded arm(s) ({', '.join(sorted(freed))}): "
                f"{human(sum(freed.values()))} freed"
            )

    def done(self, summary: dict, report: str) -> None:
        if "warm_start_seconds" in summary:
            self.say(
                f"\nwarm start (outside the budget): {summary['warm_start_seconds']:.0f} s; arms that ended "
                f"discarded: {summary['discarded_step_share']:.0%} of training steps"
            )
        if "checkpoint_bytes" in summary:
            self.say(
                f"checkpoints on disk: {human(summary['checkpoint_bytes'])}; freed by pruning: "
                f"{human(summary['pruned_bytes'])}"
            )
        if summary.get("ended_on_best"):
            self.say(f"\nended on the best read: {escape(summary['ended_on_best'])}")
        for cap, over in (summary.get("past_budget") or {}).items():
            self.say(f"[yellow]{escape(past_budget_note(cap, summary['spent'][cap], over))}[/]")
        if summary.get("cut_by_seconds"):
            self.say(f"\n[bold red]{escape(seconds_cut_note(summary['rounds']))}[/]")
        self.say(
            f"\n[bold]done[/] after {summary['rounds']} round(s) ({summary['stop_reason']}): final-task accuracy "
            f"{summary['baseline_accuracy']:.3f} -> [bold]{summary['final_accuracy']:.3f}[/]; "
            f"{len(summary['promoted'])} promoted, {len(summary['rejected'])} rejected; report {report}"
        )
