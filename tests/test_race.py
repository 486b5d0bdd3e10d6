"""Cheap decisions: arms race the control at checkpoints and a loser stops there (no weights kept); the
share of steps and tokens in arms that end discarded is measured from the ledger and kept under
loop.max_trial_share; a rollback retrains on other seeds."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console

from conftest import small_config
from evotrainer.backtest import stopping
from evotrainer.backtest.statistics import Pair
from evotrainer.backtest.trial import ArmResult, ArmSpec, run_arm
from evotrainer.diagnostics.detector import Finding, Window, finding
from evotrainer.diagnostics.suite import DetectorSpec, Suite
from evotrainer.errors import ConfigError
from evotrainer.harness.harness import Harness
from evotrainer.loop import run_loop
from evotrainer.stages import race
from evotrainer.stages.context import split_heldout
from evotrainer.stages.race import _arm_cost, control_exploits, race_size
from evotrainer.stages.results import Mainline, read_stage
from evotrainer.stages.spend import lineage, spend
from evotrainer.store.ledger import Charge, Ledger
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.grpo import GRPOTrainer


def test_a_racing_arm_stops_where_it_cannot_win_and_keeps_no_weights(tmp_path, math_setup):
    cfg, domain, policy = math_setup
    start = tmp_path / "start"
    GRPOTrainer(policy.fork(tmp_path / "fork"), cfg.harness).save(start)
    gate_ids, _ = split_heldout([t.id for t in domain.tasks("heldout")], 0.5, 0)

    def arm(name: str, race: dict | None) -> object:
        return run_arm(
            ArmSpec(
                branch=name,
                role="candidate",
                run_dir=str(tmp_path),
                config=cfg.model_dump(mode="json"),
                harness=cfg.harness.model_dump(mode="json"),
                start=str(start),
                seed=1,
                first_step=1,
                steps=3,
                gate_ids=tuple(gate_ids),
                checkpoints=(1, 2),
                race=race,
            )
        )

    # A control that passes every gate task at the first checkpoint: no candidate can be ahead of it.
    lost = arm("lost", {"1": dict.fromkeys(gate_ids, True), "2": dict.fromkeys(gate_ids, True)})
    assert lost.stopped.startswith("stopped at step 1 (1 of 3 steps)") and lost.last_step == 1
    assert lost.steps_trained == 1 and list(lost.checkpoint_outcomes) == ["1"]
    assert not (tmp_path / "checkpoints" / "lost" / "model.safetensors").exists()  # a loser's weights are not kept
    # Against a control that fails them all it is ahead whenever it solves one, and runs its length.
    ran = arm("ran", {"1": dict.fromkeys(gate_ids, False), "2": dict.fromkeys(gate_ids, False)})
    assert sum(ran.checkpoint_outcomes["1"].values()) > 0, "the fixture's policy solves some gate tasks"
    assert not ran.stopped and ran.last_step == 3 and list(ran.checkpoint_outcomes) == ["1", "2"]
    assert (tmp_path / "checkpoints" / "ran" / "model.safetensors").exists()
    # The control itself (race None) is read at its checkpoints and never stops.
    control = arm("control", None)
    assert not control.stopped and list(control.checkpoint_outcomes) == ["1", "2"]


def test_an_arm_with_a_token_target_trains_to_it_and_races_at_token_marks(tmp_path, math_setup):
    """loop.trial_unit tokens: an arm stops after the step that reaches its token target (its steps are a
    cap), and its race checkpoints are token marks; a step that passes two marks is read once, for both."""
    cfg, domain, policy = math_setup
    start = tmp_path / "start"
    GRPOTrainer(policy.fork(tmp_path / "fork"), cfg.harness).save(start)
    gate_ids, _ = split_heldout([t.id for t in domain.tasks("heldout")], 0.5, 0)

    def arm(name: str, tokens: int, marks: tuple[int, ...], race: dict | None = None) -> object:
        spec = dict(branch=name, role="candidate", run_dir=str(tmp_path), start=str(start), seed=1, first_step=1)
        return run_arm(
            ArmSpec(
                **spec,
                config=cfg.model_dump(mode="json"),
                harness=cfg.harness.model_dump(mode="json"),
                steps=3,
                gate_ids=tuple(gate_ids),
                checkpoints=marks,
                race=race,
                tokens=tokens,
            )
        )

    once = arm("once", 1, ())  # the first step reaches one token
    assert once.last_step == 1 and not once.stopped and once.accuracy is not None
    first = once.generated_tokens  # the same seed and start: every arm below samples this first step
    capped = arm("capped", 10**9, (1, 2))  # the cap of 3 steps ends it; step 1 passes both marks
    assert capped.last_step == 3 and not capped.stopped and list(capped.checkpoint_outcomes) == ["1", "2"]
    two = arm("two", first + 1, (first,))  # step 2 reaches the target; the mark is passed at step 1
    assert two.last_step == 2 and two.generated_tokens > first and list(two.checkpoint_outcomes) == [str(first)]
    lost = arm("lost", first + 1, (first,), {str(first): dict.fromkeys(gate_ids, True)})
    assert lost.stopped.startswith(f"stopped at step 1 ({first} of {first + 1} tokens)") and lost.last_step == 1


def test_discarded_shares_are_the_branches_off_the_final_lineage(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")

    def row(bid: str, parent: str | None, first: int, last: int, kind: str = "candidate") -> dict:
        return {
            "id": bid,
            "parent": parent,
            "round": 1,
            "kind": kind,
            "checkpoint": "c",
            "harness_version": "h",
            "suite_version": "s",
            "first_step": first,
            "last_step": last,
            "seed": 0,
            "heldout_accuracy": None,
        }

    ledger.finish_stage(0, "start", {}, branches=[row("base", None, 0, 0, "base")])
    ledger.finish_stage(
        1, "train", {}, branches=[row("r01-seg", "base", 1, 10, "segment")], charges={"r01-seg": Charge(1000)}
    )
    arms = [
        row("r01-ctl", "r01-seg", 11, 30, "control"),
        row("r01-c1", "r01-seg", 11, 15),
        row("r01-c2", "r01-seg", 11, 30),
        row("r01-c2r", "r01-seg", 11, 30),
        row("r01-ctlr", "r01-seg", 11, 30),
    ]
    ledger.finish_stage(
        1, "trial", {}, branches=arms, charges={a["id"]: Charge(100 * (a["last_step"] - 10)) for a in arms}
    )
    kept = lineage(ledger, "r01-c2")  # the candidate won: the mainline continues from it
    assert kept == {"base", "r01-seg", "r01-c2"}
    s = spend(ledger, kept)
    assert (s.steps, s.steps_discarded) == (10 + 20 + 5 + 20 + 20 + 20, 20 + 5 + 20 + 20)
    assert s.tokens == 1000 + 2000 + 500 + 2000 * 3 and s.tokens_discarded == 2000 + 500 + 2000 * 2
    assert 0 < s.step_share < 1 and s.to_dict()["discarded_step_share"] == round(s.step_share, 4)
    ledger.close()


def test_the_trial_share_cap_cuts_the_candidates_a_round_may_race(tmp_path, math_setup):
    cfg = small_config(
        tmp_path,
        loop={
            "segment_steps": 2,
            "trial_steps": 2,
            "candidates": 2,
            "max_rounds": 1,
            "skills_dir": str(tmp_path / "skills"),
            "max_trial_share": 0.01,
        },
        # 1% of 200k tokens: less than one 2-step arm's race share plus the confirmation it would need.
        budget={"generated_tokens": 200_000},
    )
    summary = run_loop(cfg, Console(file=io.StringIO()))
    ledger = Ledger(tmp_path / "runs" / "t" / "ledger.sqlite")
    tried = read_stage(ledger, 1, "trial")
    assert [a.role for a in tried.arms] == ["control"] and "within loop.max_trial_share" in tried.note
    assert summary["discarded_step_share"] == 0.0 and summary["training_steps"] == 4
    ledger.close()


def exploit_on_every_window(w: Window) -> list[Finding]:
    """A planted validity detector: an exploit on every window, so the segment is tainted and the control carries
    it again."""
    return [finding(w, "planted_exploit", "critical", 1.0, 0.0, [], ("reward_weights.format",), "planted", True)]


# An exploratory move (it answers no finding): the learning rate up to 1e-3.
LR_UP = {
    "kind": "set_knob",
    "target": "optimizer.learning_rate",
    "value": 1e-3,
    "hypothesis": {"finding": "explore", "signal": "heldout/accuracy", "direction": "up"},
}


def _held_by_the_steps(ctx, seg: ArmResult, rnd: int):
    """The run under a budget that `seg`'s steps say holds a trial of four arms (the control, a racer and the
    confirmation's two) but that does not hold them at what this run's trial arms cost with their gate reads; the
    survivors of round `rnd`'s replay; the tokens spent so far."""
    cfg = ctx.cfg
    spent = ctx.ledger.spent().generated_tokens
    by_steps = seg.generated_tokens // (seg.last_step - seg.first_step + 1) * cfg.loop.trial_steps
    assert _arm_cost(ctx) > by_steps  # a trial arm costs more than the segment's steps: its gate reads
    budget = cfg.budget.model_copy(update={"generated_tokens": spent + 4 * by_steps + 1})
    tight = dataclasses.replace(ctx, cfg=cfg.model_copy(update={"budget": budget}))
    props = read_stage(ctx.ledger, rnd, "propose")
    return tight, read_stage(ctx.ledger, rnd, "replay").survivors([p.proposal() for p in props.proposals]), spent


def test_a_segment_read_again_opens_the_whole_budget_to_its_remedy(tmp_path, math_setup):
    """Round 1 races nothing beside its control (1% of the budget holds no candidate), and the control carries the
    segment's exploit again. Round 2 reads that segment again: the mainline cannot train until a remedy wins or
    repairs it, so the share's remainder could only go unspent, and the remedy races under the whole budget."""
    from conftest import started_with
    from evotrainer.loop import run_round
    from evotrainer.report.console import Narrator

    cfg = small_config(
        tmp_path,
        loop={
            "segment_steps": 2,
            "trial_steps": 2,
            "candidates": 1,
            "max_rounds": 2,
            "skills_dir": str(tmp_path / "skills"),
            "max_trial_share": 0.01,
            "planted": [LR_UP],
        },
        budget={"generated_tokens": 200_000},
        # Beside the tainted segment round 2's remedy races the start and stops clearly behind it; at the default
        # rate one step of it loses a sixth of the gate tasks on this tiny base. The forecast below needs an arm
        # that ran its length, so the arms hardly move here.
        harness={"optimizer": {"learning_rate": 1e-7}},
    )
    ctx, head = started_with(cfg, {"planted_exploit": f"{__name__}:exploit_on_every_window"})
    tell = Narrator(Console(file=io.StringIO()))
    one, stop = run_round(ctx, tell, 1, head)
    first = read_stage(ctx.ledger, 1, "trial")
    assert [a.role for a in first.arms] == ["control"] and "within loop.max_trial_share" in first.note
    assert one.exploited is not None and not stop.reason
    run_round(ctx, tell, 2, one)
    second = read_stage(ctx.ledger, 2, "trial")
    assert "candidate" in [a.role for a in second.arms] and "max_trial_share" not in second.note, second.note
    # Under the whole budget no share's margin absorbs a low forecast. Round 2's remedy again, from the same read
    # segment, under a budget that the segment's steps say holds the trial's four arms (the control, which only reads
    # the start here but counts as one, the racer, the confirmation's replicate and the third run owed against the
    # start) but not at what this run's arms cost with their gate reads: refused before it trains anything.
    seg = read_stage(ctx.ledger, 1, "train")
    tight, survivors, spent = _held_by_the_steps(ctx, seg, 2)
    refused, _ = race.trial(tight, 3, one, seg, survivors, ["planted_exploit"], one.suite)
    assert not refused.arms and refused.abandoned.startswith("budget.generated_tokens would be exceeded by 4 arm")
    assert ctx.ledger.spent().generated_tokens == spent
    # In the loop, that refusal ends the run: a next segment would be a third sample of the exploit.
    _, stop = run_round(tight, tell, 3, one)
    assert read_stage(ctx.ledger, 3, "trial").abandoned.startswith("budget.generated_tokens would be exceeded")
    assert stop.reason.startswith("budget.generated_tokens would be exceeded") and stop.cap == "generated_tokens"
    ctx.ledger.close()


def test_a_trial_the_budget_cannot_hold_at_what_its_arms_cost_with_their_reads_is_not_started(tmp_path, math_setup):
    """The budget is a cap: a trial is forecast at what this run's trial arms cost with their gate reads, not at the
    segment's steps alone. On swe_short_300k (seed 8) a round-4 trial the steps put at 52.1k of the 52.5k left cost
    78.5k, and the run spent 328k of 300k."""
    from conftest import started_with
    from evotrainer.loop import run_round
    from evotrainer.report.console import Narrator

    cfg = small_config(
        tmp_path,
        loop={
            "segment_steps": 2,
            "trial_steps": 2,
            "candidates": 1,
            "max_rounds": 1,
            "planted": [LR_UP],
            "max_trial_share": 1.0,  # the share does not bind: only the cap is tested
            "trial_phases": 1,
            # Every arm runs its length: a racer stopped at its first checkpoint costs less than the steps, and the
            # mean arm then sat within a dozen tokens of them (1,162 against 1,168 at seed 1 on an AMD EPYC).
            "race_checkpoints": 0,
        },
        budget={"generated_tokens": 400_000},
    )
    ctx, head = started_with(cfg, {})
    one, _ = run_round(ctx, Narrator(Console(file=io.StringIO())), 1, head)
    assert "candidate" in [a.role for a in read_stage(ctx.ledger, 1, "trial").arms]
    # Round 1's segment again, with its survivor: the control, the racer and the confirmation's two, four arms
    seg = read_stage(ctx.ledger, 1, "train")
    tight, survivors, spent = _held_by_the_steps(ctx, seg, 1)
    assert len(survivors) == 1
    refused, _ = race.trial(tight, 2, one, seg, survivors, [], one.suite)
    assert not refused.arms and refused.abandoned.startswith("budget.generated_tokens would be exceeded by 4 arm")
    assert refused.cap == "generated_tokens" and ctx.ledger.spent().generated_tokens == spent
    ctx.ledger.close()


def test_a_round_races_only_candidates_whose_winner_it_could_also_confirm():
    # One arm is 100 tokens: a racer is charged 50, an A-A arm 100, a confirmation 300.
    allow = lambda cap: lambda race, confirm: race + confirm <= cap  # noqa: E731
    assert race_size(2, 100, True, False, True, allow(400)) == 2
    assert race_size(2, 100, True, False, True, allow(399)) == 1
    # Two racers fit the share on their own, but not with the confirmation their winner would need.
    assert race_size(2, 100, True, False, True, allow(349)) == 0
    assert race_size(2, 100, True, False, False, allow(349)) == 2
    # Without a race a candidate costs a whole arm; an A-A arm is reserved beside them.
    assert race_size(2, 100, False, True, False, allow(300)) == 2
    assert race_size(2, 100, False, True, False, allow(299)) == 1


def test_a_rollback_trains_the_next_round_on_other_seeds():
    head = Mainline(branch="r01-ctl", checkpoint="c", harness=Harness(), suite=Suite(detectors={}), step=20)
    again = head.at(head.branch, head.checkpoint, head.step).model_copy(update={"attempt": head.attempt + 1})
    assert again.seed(0) != head.seed(0) and head.seed(0) == 0
    assert again.at("r02-ctl", "d", 40).attempt == 0  # moving on is a fresh start


def _a_raced_round(
    tmp_path,
    detectors: dict | None = None,
    gate: dict | None = None,
    learning_rate: float = 1.0,
    loop: dict | None = None,
):
    """The run, its start and one round's survivor for the whole-trial tests below (see the first's docstring):
    (ctx, head, seg, survivors, cfg). `detectors`: planted ones added to the round's suite; `gate`: settings of the
    gate section besides its level; `learning_rate`: the mainline's (1.0 wrecks the control); `loop`: settings of the
    loop section besides these."""
    from evotrainer.backtest.trial import ArmResult
    from evotrainer.harness.interventions import Hypothesis, Intervention
    from evotrainer.proposers.proposer import Proposal
    from evotrainer.stages import start
    from evotrainer.stages.context import run_stage
    from evotrainer.stages.noise import with_pairs
    from evotrainer.stages.results import StartResult, Survivor

    cfg = small_config(
        tmp_path,
        harness={"sampling": {"num_generations": 8, "prompts_per_step": 16, "max_completion_length": 8}}
        | {"optimizer": {"learning_rate": learning_rate}, "reward_weights": {"correct": 1.0}},
        eval={"heldout_size": 100, "audit_fraction": 0.0},
        # Seed 0 whatever EVOTRAINER_TEST_SEED says: this tests the confirmation's mechanism, which needs a
        # base that solves some gate tasks (seed 0's solves about 8 of 50; seed 1's, none: nothing can be
        # ahead of a wrecked control then). The dataset has no more distinct questions for a larger gate, so the
        # run's error rate is 0.2: its first raced round then tests at 0.05, the per-round level this mechanism
        # was sized for (the run's default, 0.05 over the run, spends 0.0125 on it).
        gate={"level": 0.8, **(gate or {})},
        run={"name": "t", "out_dir": str(tmp_path / "runs"), "seed": 0},
        # No training rollout is audited: the tiny base's reward and audit disagree on a tenth of the paid
        # answers, which the validity rules (tested in test_gate.py) would weigh against a wrecked control.
        loop={"trial_steps": 4, "race_checkpoints": 1, "candidates": 1, "max_trial_share": 1.0, "max_rounds": 1}
        | (loop or {}),
    )
    ctx = start.open_run(cfg, resume=False)
    head = run_stage(ctx, 0, "start", StartResult, lambda: start.start(ctx, lambda *_: None)).head
    # A wrecked control and its replicate agree on every task (both solve none): a pair that measures nothing
    # (statistics.noise_of). The noise this mechanism runs under is planted: one earlier A-A pair, 3-2.
    planted = with_pairs(head.noise, head.harness.version, 0, [(Pair(3, 2, 50), "earlier-aa", "earlier-ctl")])
    head = head.model_copy(update={"noise": planted})
    if detectors:
        head = head.model_copy(update={"suite": Suite(detectors={**head.suite.detectors, **detectors})})
    seg = ArmResult(
        branch="base",
        role="segment",
        checkpoint=head.checkpoint,
        harness_version=head.harness.version,
        first_step=0,
        last_step=0,
        generated_tokens=1,
        trained_tokens=0,
        seconds=0.0,
    )
    sane = Intervention(
        kind="set_knob",
        target="optimizer.learning_rate",
        value=1e-5,
        hypothesis=Hypothesis(finding="explore", signal="heldout/accuracy", direction="up"),
    )
    survivors = [Survivor(Proposal(sane.bind(head.harness), "explore"), None)]
    return ctx, head, seg, survivors, cfg


def test_a_finalist_is_confirmed_beside_a_control_replicate_and_promoted(tmp_path, math_setup):
    """The whole trial and gate, through the loop's own stages: a control whose learning rate wrecks the
    policy (1.0) against a candidate that barely moves it (1e-5), so the candidate keeps what the base
    solves on any CPU's numerics while the control solves nothing: it wins the race by every task the base
    solves (a learning rate that trains, 3e-3, won by a margin the kernel set decided), is trained again on
    fresh seeds beside a control replicate (which is the A-A pair the noise model needs), and the two-stage
    test promotes it with the confirmation's effect on record."""
    from evotrainer.backtest import gate
    from evotrainer.stages import decide
    from evotrainer.stages import race as race_stage
    from evotrainer.stages.context import run_stage
    from evotrainer.stages.results import GateResult, PromoteResult, TrialResult

    ctx, head, seg, survivors, cfg = _a_raced_round(tmp_path)
    tried = run_stage(
        ctx, 1, "trial", TrialResult, lambda: race_stage.trial(ctx, 1, head, seg, survivors, [], head.suite)
    )
    assert tried.finalist == 1
    roles = {a.role: a for a in tried.arms}
    assert set(roles) == {"control", "candidate", "replicate", "control_replicate"}
    assert len({a.branch for a in tried.arms}) == 4
    # The segment was clean, and still the control read the policy the arms fork from (every round).
    assert "0" in roles["control"].checkpoint_outcomes and "0" not in roles["candidate"].checkpoint_outcomes
    # The replicate trains the candidate's harness again, the control replicate the control's.
    assert roles["replicate"].harness_version == roles["candidate"].harness_version != head.harness.version
    assert roles["control_replicate"].harness_version == head.harness.version
    gated = run_stage(
        ctx, 1, "gate", GateResult, lambda: decide.gate_stage(ctx, 1, head, head.suite, tried, survivors, [])
    )
    [line] = gated.verdicts
    assert line.decision == "promote", line.reasons
    [v] = ctx.ledger.verdicts()
    s = v["statistic"]
    assert s["test"] == "two_stage" and s["delta"] == s["stage2"]["delta"] == line.delta > 0
    assert s["delta"] == pytest.approx(roles["replicate"].accuracy - roles["control_replicate"].accuracy)
    assert s["selected_delta"] == pytest.approx(roles["candidate"].accuracy - roles["control"].accuracy)
    # The planted pair is the mainline's only informative one (the wrecked control's replicate measured nothing:
    # no pair); the finalist is tested under the noisier of that and its own two runs (gate.finalist_noise), which
    # on some kernels spread more (phi 1.4 under ATEN_CPU_CAPABILITY=default).
    assert v["noise"]["valid"] and v["noise"]["pairs_used"] == 1
    own = gate.moderated([Pair.of(roles["replicate"].outcomes, roles["candidate"].outcomes)])
    model, _ = gate.finalist_noise(gate.moderated([Pair(3, 2, 50)]), own)
    assert v["noise"]["phi"] == pytest.approx(model.phi)
    # The run's first raced round, tested at its share of the run's error rate (gate.round_alpha).
    assert s["raced_round"] == 1 and s["run_level"] == cfg.gate.level
    assert s["level"] == pytest.approx(1 - gate.round_alpha(1 - cfg.gate.level, 1, [])) and s["p"] <= 1 - s["level"]
    promoted = run_stage(
        ctx, 1, "promote", PromoteResult, lambda: decide.promote(ctx, 1, head, head.suite, tried, gated, survivors)
    )
    # The mainline remembers the raced round and its promotion: the next round's share is earned back.
    assert promoted.head.raced == 1 and promoted.head.promoted_at == [1]
    ctx.ledger.close()


def test_with_checkpoint_tasks_the_race_reads_a_prefix_and_every_decisive_read_all_the_gate_tasks(
    tmp_path, math_setup
):
    """gate.checkpoint_tasks: the base's first read (the guard's first best), the control's read where the arms fork
    and the race's checkpoint read the first 20 of the 50 gate tasks; every arm that runs its length reads all 50,
    and the gate's two-stage test pairs those (the same round as the test above, promoted the same way)."""
    from evotrainer.stages import decide
    from evotrainer.stages import race as race_stage
    from evotrainer.stages.context import run_stage
    from evotrainer.stages.results import GateResult, TrialResult

    ctx, head, seg, survivors, cfg = _a_raced_round(tmp_path, gate={"checkpoint_tasks": 20})
    gate_ids, prefix = ctx.gate_ids, ctx.gate_ids[:20]
    assert len(gate_ids) == 50 and ctx.check_ids == prefix
    assert sorted(head.peak.outcomes) == sorted(prefix)
    tried = run_stage(
        ctx, 1, "trial", TrialResult, lambda: race_stage.trial(ctx, 1, head, seg, survivors, [], head.suite)
    )
    roles = {a.role: a for a in tried.arms}
    assert set(roles) == {"control", "candidate", "replicate", "control_replicate"}
    marks = roles["control"].checkpoint_outcomes
    assert "0" in marks and set(marks) >= set(roles["candidate"].checkpoint_outcomes)
    assert all(sorted(o) == sorted(prefix) for a in tried.arms for o in a.checkpoint_outcomes.values())
    assert all(sorted(a.outcomes) == sorted(gate_ids) and not a.stopped for a in tried.arms)
    gated = run_stage(
        ctx, 1, "gate", GateResult, lambda: decide.gate_stage(ctx, 1, head, head.suite, tried, survivors, [])
    )
    [line] = gated.verdicts
    assert line.decision == "promote", line.reasons
    [v] = ctx.ledger.verdicts()
    assert v["statistic"]["stage1"]["n"] == v["statistic"]["stage2"]["n"] == 50
    ctx.ledger.close()


def _a_remedy_raced(tmp_path, taint: list[str]):
    """A round whose control and candidate both barely move the policy (learning rates 1e-5 and 2e-5, four steps),
    raced once, at step 2, beside a segment that carries `taint` (or a clean one): (the trial, the control, the
    candidate)."""
    from evotrainer.harness.interventions import Hypothesis, Intervention
    from evotrainer.proposers.proposer import Proposal
    from evotrainer.stages import race as race_stage
    from evotrainer.stages.context import run_stage
    from evotrainer.stages.results import Survivor, TrialResult

    ctx, head, seg, _, _ = _a_raced_round(tmp_path, learning_rate=1e-5, loop={"trial_unit": "steps"})
    remedy = Intervention(
        kind="set_knob",
        target="optimizer.learning_rate",
        value=2e-5,
        hypothesis=Hypothesis(finding="planted_exploit", signal="heldout/accuracy", direction="up"),
    )
    survivors = [Survivor(Proposal(remedy.bind(head.harness), "catalog"), None)]
    tried = run_stage(
        ctx, 1, "trial", TrialResult, lambda: race_stage.trial(ctx, 1, head, seg, survivors, taint, head.suite)
    )
    ctx.ledger.close()
    return tried, tried.arm("r01-ctl"), tried.arm("r01-c1")


def test_beside_a_tainted_segment_a_remedy_races_the_start_and_stops_only_clearly_behind_it(tmp_path, math_setup):
    """Beside a segment that carries an exploit the control pays it and the gate holds a remedy against the policy the
    arms fork from, so the race does too: every checkpoint compares the remedy with the start's read, and a remedy
    level with the start goes on, since its arm is the one the mainline would continue from. Beside a clean segment
    the same round races the control, and a candidate not ahead of it at the first checkpoint stops there."""
    tried, control, remedy = _a_remedy_raced(tmp_path / "tainted", ["validity:planted_exploit"])
    [mark] = remedy.checkpoint_outcomes
    start = control.checkpoint_outcomes["0"]
    assert sum(start.values()) > 0, "the fixture's base solves some gate tasks"
    # Barely moved, the remedy is nowhere near clearly behind the start two steps in: it runs its length.
    assert not remedy.stopped and sorted(remedy.outcomes) == sorted(start), remedy.stopped
    assert stopping.futile(remedy.checkpoint_outcomes[mark], start, True, "start") == ""
    assert race.race_reads(control, (int(mark),), True) == ({mark: start}, "start")
    clean, control, cand = _a_remedy_raced(tmp_path / "clean", [])
    assert race.race_reads(control, (int(mark),), False) == (control.checkpoint_outcomes, "control")
    pair = Pair.of(cand.checkpoint_outcomes[mark], control.checkpoint_outcomes[mark])
    assert bool(cand.stopped) == (pair.wins <= pair.losses)
    assert not cand.stopped or "not ahead of the control at the first checkpoint" in cand.stopped


def test_checkpoint_tasks_beyond_the_gate_tasks_are_refused_before_anything_is_written(tmp_path, math_setup):
    from evotrainer.stages import start

    cfg = small_config(tmp_path, eval={"heldout_size": 100}, gate={"checkpoint_tasks": 51}, loop={"max_rounds": 1})
    with pytest.raises(ConfigError, match=r"gate.checkpoint_tasks: 51 is more than the 50 gate tasks"):
        start.open_run(cfg, resume=False)
    assert not (tmp_path / "runs").exists()


def exploit_in_the_control_replicate(w: Window) -> list[Finding]:
    """A planted validity detector (a plugin, as a user writes one): the exploit appeared mid-trial, in the control
    replicate's window only."""
    return _planted(w) if w.branch == "r01-ctlr" else []


def exploit_in_the_control(w: Window) -> list[Finding]:
    """A planted validity detector: the exploit is in the race's control's window only."""
    return _planted(w) if w.branch == "r01-ctl" else []


def exploit_outside_the_controls(w: Window) -> list[Finding]:
    """A planted validity detector: an exploit in every window but the control's and its replicate's."""
    return _planted(w) if w.branch not in ("r01-ctl", "r01-ctlr") else []


def _planted(w: Window) -> list[Finding]:
    return [finding(w, "planted_exploit", "critical", 1.0, 0.0, [], ("reward_weights.correct",), "planted", True)]


def test_an_exploit_in_either_control_run_calls_for_the_finalist_s_third_run(tmp_path):
    """Where a control run carries an exploit the finalist is compared with the round's start, and the trial trains
    it a third time (race._second_replicate_due); the exploit is read as the gate reads it, by the round's suite over
    each control run's own window. An exploit in an A-A arm or in the finalist's own runs does not call for it."""
    store = RolloutStore(tmp_path / "store")

    def arm(branch: str, role: str) -> ArmResult:
        return ArmResult(
            branch=branch,
            role=role,
            checkpoint="",
            harness_version="h",
            first_step=1,
            last_step=4,
            generated_tokens=0,
            trained_tokens=0,
            seconds=0.0,
        )

    race = [arm("r01-ctl", "control"), arm("r01-c1", "candidate"), arm("r01-aa", "aa"), arm("r01-c1r", "replicate")]
    confirmed = [*race, arm("r01-ctlr", "control_replicate")]
    outside = Suite(detectors={"planted_exploit": DetectorSpec(path=f"{__name__}:exploit_outside_the_controls")})
    assert not control_exploits(store, outside, confirmed)
    replicate = Suite(detectors={"planted_exploit": DetectorSpec(path=f"{__name__}:exploit_in_the_control_replicate")})
    assert not control_exploits(store, replicate, race)
    assert control_exploits(store, replicate, confirmed)


def test_beside_a_control_replicate_that_exploits_the_finalist_runs_a_third_time_against_the_start(
    tmp_path, math_setup
):
    """The round of the test above, with an exploit appearing mid-trial in the control replicate (a planted
    detector in the round's suite): the confirmation is compared with the policy the arms forked from, so the
    finalist is trained a third time on seeds of its own and must pass with each run. It barely moves the base, so
    against the start it gains nothing (the race's win was over a wrecked control) and is rejected."""
    from evotrainer.ids import branch_id
    from evotrainer.stages import decide
    from evotrainer.stages import race as race_stage
    from evotrainer.stages.context import run_stage
    from evotrainer.stages.results import GateResult, TrialResult

    planted = {"planted_exploit": DetectorSpec(path=f"{__name__}:exploit_in_the_control_replicate")}
    ctx, head, seg, survivors, cfg = _a_raced_round(tmp_path, planted)
    tried = run_stage(
        ctx, 1, "trial", TrialResult, lambda: race_stage.trial(ctx, 1, head, seg, survivors, [], head.suite)
    )
    arms = {a.branch: a for a in tried.arms}
    assert tried.finalist == 1 and set(arms) == {"r01-ctl", "r01-c1", "r01-c1r", "r01-ctlr", "r01-c1r2"}
    third = arms[branch_id(1, "second_replicate", 1)]
    assert third.harness_version == arms["r01-c1"].harness_version != head.harness.version
    seeds = {b["id"]: b["seed"] for b in ctx.ledger.branches() if b["id"] in arms}
    gated = run_stage(
        ctx, 1, "gate", GateResult, lambda: decide.gate_stage(ctx, 1, head, head.suite, tried, survivors, [])
    )
    [line] = gated.verdicts
    [v] = ctx.ledger.verdicts()
    s = v["statistic"]
    assert s["against"].startswith("the round's starting policy") and s["second_stage"]["n"] == s["stage2"]["n"]
    assert s["stage2"]["p"] >= s["second_stage"]["p"]  # the record is the weaker confirmation's
    assert line.decision == "reject" and "no_supported_gain" in line.reasons
    assert len(seeds) == 5 and len(set(seeds.values())) == 5  # each run on seeds of its own
    ctx.ledger.close()


def test_beside_a_control_that_exploits_no_control_replicate_trains(tmp_path, math_setup):
    """The round above with the exploit in the race's control: a control replicate would be another sample of it, so
    the confirmation trains the finalist's replicate and its third run only, and both are held against the policy the
    arms forked from (the control's read before its first step), each run needing to pass."""
    from evotrainer.stages import decide
    from evotrainer.stages import race as race_stage
    from evotrainer.stages.context import run_stage
    from evotrainer.stages.results import GateResult, TrialResult

    planted = {"planted_exploit": DetectorSpec(path=f"{__name__}:exploit_in_the_control")}
    ctx, head, seg, survivors, cfg = _a_raced_round(tmp_path, planted)
    tried = run_stage(
        ctx, 1, "trial", TrialResult, lambda: race_stage.trial(ctx, 1, head, seg, survivors, [], head.suite)
    )
    arms = {a.branch: a for a in tried.arms}
    assert tried.finalist == 1 and set(arms) == {"r01-ctl", "r01-c1", "r01-c1r", "r01-c1r2"}
    trained = ctx.store.sql("SELECT DISTINCT branch FROM rollouts WHERE split = 'train'")
    assert "r01-ctlr" not in {r["branch"] for r in trained} and "r01-c1r2" in {r["branch"] for r in trained}
    gated = run_stage(
        ctx, 1, "gate", GateResult, lambda: decide.gate_stage(ctx, 1, head, head.suite, tried, survivors, [])
    )
    [line] = gated.verdicts
    [v] = ctx.ledger.verdicts()
    s = v["statistic"]
    start = arms["r01-ctl"].checkpoint_outcomes["0"]
    assert s["against"].startswith("the round's starting policy") and s["second_stage"]["n"] == s["stage2"]["n"]
    assert s["confirmed_control_accuracy"] == pytest.approx(sum(start.values()) / len(start))
    assert s["start_accuracy"] == pytest.approx(s["confirmed_control_accuracy"])
    assert gated.control_rejected == ["validity:planted_exploit"]
    assert line.decision == "reject" and "no_supported_gain" in line.reasons
    ctx.ledger.close()
