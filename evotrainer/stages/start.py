"""The run's ends: opening it (every config mistake is caught before anything is written), round 0 (the
base policy, its checkpoint and the baseline on the final tasks), the budget check before a round, and
the end (one read of the final tasks, the summary)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from evotrainer.backtest.executors import make_executor
from evotrainer.backtest.verdict import read_verdicts
from evotrainer.config import RunConfig, dump_config
from evotrainer.diagnostics.suite import Suite
from evotrainer.envs import domains
from evotrainer.envs.registry import make_domain, warm_start_key
from evotrainer.errors import ConfigError, EvaluatorChanged
from evotrainer.evaluation import evaluate, evaluator_identity, identity_hash, record_eval, what_changed
from evotrainer.harness.harness import Harness, save_harness
from evotrainer.harness.interventions import Intervention
from evotrainer.harness.rewards import check_terms
from evotrainer.ids import branch_id, final_branch, guard_branch
from evotrainer.policies import check_device, check_policy_path, load_policy, placement
from evotrainer.policies.hf import HFPolicy
from evotrainer.proposers.heuristic import HeuristicProposer
from evotrainer.proposers.proposer import Proposer
from evotrainer.skills.library import FOR, Evidence, Skill, SkillLibrary, library_dir, model_name, run_name
from evotrainer.stages.context import RunContext, StageRecords, split_heldout
from evotrainer.stages.results import (
    Adoption,
    BranchRecord,
    FinalResult,
    GateResult,
    Mainline,
    Peak,
    PromoteResult,
    Rollback,
    StartResult,
    Stop,
    read_stage,
)
from evotrainer.stages.retention import disk_use
from evotrainer.stages.spend import lineage, spend
from evotrainer.store.ledger import Charge, Ledger
from evotrainer.store.rollouts import RolloutStore
from evotrainer.trackers.forward import Forwarder
from evotrainer.trackers.tracker import check_report_to
from evotrainer.training.grpo import GRPOTrainer
from evotrainer.training.run import seed_everything
from evotrainer.training.segment import StepContext
from evotrainer.training.trl_backend import check_trl


def check_budget(cfg: RunConfig) -> None:
    b = cfg.budget
    if not (b.generated_tokens or b.trained_tokens or b.seconds or cfg.loop.max_rounds):
        raise ConfigError(
            "budget: set at least one of budget.generated_tokens, budget.trained_tokens, budget.seconds "
            "or loop.max_rounds, so the loop knows when to stop"
        )


def check_gate(cfg: RunConfig) -> None:
    """A new run's gate must be one whose error rate is measured. `sign` (one stage, no confirmation) promoted a
    harness raced against itself in 3-4% of first rounds and 8-11% of runs where that harness spreads the policy
    more than the mainline's (benchmarks/gate_calibration.py, digits at a learning transition; nominal 1.25% and
    5%): with no second run of the candidate nothing in the round can see that spread. A run that started with it
    still resumes (its decisions are in its ledger)."""
    if cfg.gate.statistic == "sign":
        raise ConfigError(
            "gate.statistic: 'sign' is refused for new runs: its false-promotion rate is over nominal where a "
            "candidate's harness spreads the policy more than the mainline's (benchmarks/RESULTS.md); use two_stage "
            "(the default: a race, then a confirmation on fresh seeds)"
        )


def _caps(cfg: RunConfig, spent: Charge) -> list[tuple[str, float, float]]:
    """(cap name, the cap, what spent holds of it) for each cap of the budget; a cap of 0 is none."""
    b = cfg.budget
    return [
        ("generated_tokens", b.generated_tokens, spent.generated_tokens),
        ("trained_tokens", b.trained_tokens, spent.trained_tokens),
        ("seconds", b.seconds, spent.seconds),
    ]


def over_budget(cfg: RunConfig, spent: Charge, extra: Charge = Charge()) -> str | None:
    """Which cap (if any) spent + extra reaches."""
    return next((name for name, cap, used in _caps(cfg, spent + extra) if cap and used >= cap), None)


def past_budget(cfg: RunConfig, spent: Charge) -> dict[str, float]:
    """How far spent went past each cap it passed (cap name: the excess). The budget is checked between steps and
    stages, so the step, arm or read that crossed a cap ran to its end (a segment stops at the step that reaches
    the budget, as a static run would)."""
    return {name: used - cap for name, cap, used in _caps(cfg, spent) if cap and used > cap}


def stop_before(ctx: RunContext, rnd: int) -> Stop:
    """Why the run stops before round `rnd` (an empty reason to go on). The budget is checked only before a
    round's first stage: a resumed round must not stop where the original went on."""
    cfg = ctx.cfg
    if cfg.loop.max_rounds and rnd > cfg.loop.max_rounds:
        return Stop(reason=f"loop.max_rounds={cfg.loop.max_rounds}")
    if ctx.ledger.stage_result(rnd, "train") is None and (cap := over_budget(cfg, ctx.ledger.spent())):
        return Stop(reason=f"budget.{cap} spent", cap=cap)
    return Stop()


def make_proposer(cfg: RunConfig, ledger: Ledger, run_dir: Path) -> Proposer:
    if cfg.loop.proposer == "llm":
        from evotrainer.proposers.llm import LLMProposer  # the client library is only needed with an LLM

        return LLMProposer.from_config(cfg.llm, run_dir, cfg.run.seed, ledger=ledger)
    return HeuristicProposer(seed=cfg.run.seed)


def open_run(cfg: RunConfig, resume: bool, accept_evaluator_change: bool = False) -> RunContext:
    """Check everything the config can get wrong, then open (or reopen) the run directory; a resumed
    run must find the evaluator it started with (or be told to accept the change)."""
    check_budget(cfg)
    check_report_to(cfg.run.report_to)
    domain = make_domain(cfg)
    gate_ids, final_ids = split_heldout([t.id for t in domain.tasks("heldout")], cfg.gate.final_fraction, cfg.run.seed)
    if cfg.gate.checkpoint_tasks > len(gate_ids):
        raise ConfigError(
            f"gate.checkpoint_tasks: {cfg.gate.checkpoint_tasks} is more than the {len(gate_ids)} gate tasks "
            "(eval.heldout_size less its gate.final_fraction); lower it, or set 0 for every read to read them all"
        )
    check_terms(cfg.harness, domain)
    check_trl(cfg.train, cfg.harness, domain)
    check_device(cfg.policy, cfg.loop.executor)
    if not resume:  # a resumed run past its start loads checkpoints, not the model it started from
        check_policy_path(cfg.policy)
        check_gate(cfg)
    if cfg.loop.proposer == "llm":  # an endpoint that cannot be reached stops the run before anything is written
        from evotrainer.proposers.llm import check_endpoint

        check_endpoint(cfg.llm)
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    ledger_path = run_dir / "ledger.sqlite"
    if ledger_path.exists() and not resume:
        raise ConfigError(
            f"run.name: {run_dir} already holds a loop run; `evotrainer resume {run_dir}` continues it, "
            "or choose another run.name"
        )
    # ray: a missing extra or cluster stops here, with nothing written
    executor = make_executor(cfg.loop, cfg.run.threads, log=None)
    run_dir.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(ledger_path)
    _check_identity(cfg, ledger, run_dir)
    ctx = RunContext(
        cfg=cfg,
        run_dir=run_dir,
        domain=domain,
        store=RolloutStore(run_dir / "store"),
        ledger=ledger,
        skills=SkillLibrary(library_dir(cfg.loop.skills_dir, cfg.run.out_dir)),
        executor=executor,
        proposer=make_proposer(cfg, ledger, run_dir),
        gate_ids=gate_ids,
        final_ids=final_ids,
    )
    check_evaluator(ctx, accept_evaluator_change)
    ledger.record_skill_library(path := str(ctx.skills.root.resolve()))
    # The library as the run found it: other runs' evidence written since changes none of its decisions, and a
    # resumed run reads what the killed one read.
    seen = ledger.library_seen(path, ctx.skills.evidence_keys)
    ctx.skills = ctx.skills.as_found(seen, ledger.library_run(path, lambda: run_name(cfg.run.name, seen)))
    ctx.tracking = Forwarder.open(cfg.run.report_to, run_dir, cfg.run.name, cfg.model_dump(mode="json"))
    return ctx


def check_evaluator(ctx: RunContext, accept: bool) -> None:
    """A new run records its evaluator (code, settings, data, versions) for the gate and the final tasks;
    a resumed one recomputes it and stops, saying what changed, when it differs: verdicts made under
    two evaluators are not comparable. `accept` (resume --accept-evaluator-change) goes on and records
    the change in the ledger."""
    now = {
        "gate": evaluator_identity(ctx.domain, ctx.heldout(ctx.gate_ids), ctx.cfg.eval),
        "final": evaluator_identity(ctx.domain, ctx.heldout(ctx.final_ids), ctx.cfg.eval),
    }
    if ctx.check_ids != ctx.gate_ids:  # the reads of gate.checkpoint_tasks: their own task list, their own hash
        now["checkpoint"] = evaluator_identity(ctx.domain, ctx.heldout(ctx.check_ids), ctx.cfg.eval)
    saved = ctx.ledger.get_meta("evaluator")
    if saved is None and (started := ctx.ledger.stage_result(0, "start")) is not None:
        # A run from before the components were recorded: only the final tasks' hash can be compared.
        if started["evaluator_hash"] != identity_hash(now["final"]) and not accept:
            raise EvaluatorChanged(
                f"{ctx.run_dir}: the evaluator changed since this run started ({started['evaluator_hash']} -> "
                f"{identity_hash(now['final'])}); this run predates the record of what it is made of, so what "
                "changed cannot be named. `evotrainer resume RUN --accept-evaluator-change` continues under the "
                "new evaluator and records it"
            )
    elif saved is not None:
        old = json.loads(saved)
        changed = sorted({c for k in now.keys() | old.keys() for c in what_changed(old.get(k, {}), now.get(k, {}))})
        if changed and not accept:
            raise EvaluatorChanged(
                f"{ctx.run_dir}: the evaluator changed since this run started: {'; '.join(changed)}. Verdicts made "
                "under two evaluators are not comparable; restore it, or `evotrainer resume RUN "
                "--accept-evaluator-change` to continue under the new one (the change is recorded)"
            )
        if changed:
            ctx.ledger.set_meta(f"evaluator_accepted_{time.time():.0f}", json.dumps(changed))
    if saved is None or accept:
        ctx.ledger.set_meta("evaluator", json.dumps(now))


def expect_evaluator(ctx: RunContext, which: str, got: str, what: str) -> None:
    """Outcomes read by a decision must come from the run's evaluator (`which`: gate, final or checkpoint tasks;
    the last is the gate's where gate.checkpoint_tasks reads them all)."""
    saved = json.loads(ctx.ledger.get_meta("evaluator"))
    want = identity_hash(saved.get(which) or saved["gate"])
    if got != want:
        raise EvaluatorChanged(
            f"{what} was evaluated under evaluator {got}, not the run's {want} ({which} tasks): its outcomes "
            "cannot be compared with the run's; `evotrainer resume` redoes the stage"
        )


def _identity(cfg: RunConfig) -> str:
    # The run directory may have moved since it started: its location is not part of the identity.
    return cfg.model_dump_json(exclude={"run": {"out_dir"}})


def _check_identity(cfg: RunConfig, ledger: Ledger, run_dir: Path) -> None:
    """A new run records its config; a resumed one must bring the same. The saved one is read through
    today's schema, so a run written by an earlier version (fewer fields, an undivided env section)
    compares by what it means, not by how it was spelt."""
    if (saved := ledger.get_meta("config")) is None:
        (run_dir / "config.yaml").write_text(dump_config(cfg))
        ledger.set_meta("config", _identity(cfg))
    elif saved != _identity(cfg) and _identity(RunConfig.model_validate(json.loads(saved))) != _identity(cfg):
        raise ConfigError(
            f"{run_dir}: the config differs from the one this run started with; resume takes no new config"
        )


def start(ctx: RunContext, say: Any) -> tuple[StartResult, StageRecords]:
    """Round 0: the base policy, its checkpoint, the baseline on the final tasks and its read on the gate tasks (the
    mainline's first best, stages/guard.py), the root harness and suite."""
    cfg = ctx.cfg
    seed_everything(cfg)
    t0 = time.perf_counter()
    policy = load_policy(cfg.policy, ctx.domain, cfg.run.seed, warm_start_key(cfg, ctx.domain), log=say)
    warm = time.perf_counter() - t0
    base = branch_id(0, "base")
    ckpt = ctx.run_dir / "checkpoints" / base
    GRPOTrainer(policy, cfg.harness).save(ckpt)
    ev = evaluate(policy, ctx.domain, ctx.heldout(ctx.final_ids), cfg.eval)
    record_eval(ctx.store, cfg.harness, ctx.domain, ev, 0, StepContext(cfg.run.name, base, cfg.run.seed))
    # The base on the gate tasks: the first best read the guard stage holds every later head against, read before
    # anything trains so that no budget can leave the mainline without it.
    gate_ev = evaluate(policy, ctx.domain, ctx.heldout(ctx.check_ids), cfg.eval)
    expect_evaluator(ctx, "checkpoint", gate_ev.evaluator_hash, "the base's read of the gate tasks")
    record_eval(
        ctx.store, cfg.harness, ctx.domain, gate_ev, 0, StepContext(cfg.run.name, guard_branch(base), cfg.run.seed)
    )
    save_harness(ctx.run_dir, cfg.harness)
    harness, adopted = adopt(ctx, cfg.harness, say) if cfg.loop.adopt_skills else (cfg.harness, [])
    suite = Suite.default()
    peak = Peak(branch=base, checkpoint=str(ckpt), step=0, outcomes=gate_ev.outcomes)
    head = Mainline(branch=base, checkpoint=str(ckpt), harness=harness, suite=suite, step=0, peak=peak)
    row = BranchRecord(
        id=head.branch,
        parent=None,
        round=0,
        kind="base",
        checkpoint=str(ckpt),
        harness_version=harness.version,
        suite_version=suite.version,
        first_step=0,
        last_step=0,
        seed=cfg.run.seed,
        heldout_accuracy=None,
    )
    return (
        StartResult(
            head=head,
            final_accuracy=ev.accuracy,
            evaluator_hash=ev.evaluator_hash,
            warm_start_seconds=warm,
            adopted=adopted or None,
        ),
        # The warm start is built once and cached for every later run: its seconds stay out of budget.seconds
        # (a slow machine would otherwise lose rounds to it), and the summary reports them on their own.
        StageRecords(
            branches=[row],
            charges={
                "eval": Charge(sum(e.action_tokens for e in ev.episodes)),
                guard_branch(base): Charge(sum(e.action_tokens for e in gate_ev.episodes)),
            },
            uncharged_seconds=warm,
        ),
    )


def run_evidence(ctx: RunContext, **fields: Any) -> Evidence:
    """Evidence from this run, in its context: the run (as the library knows it: Ledger.library_run), the domain and
    the model (`fields`: the rest)."""
    cfg = ctx.cfg
    return Evidence(run=ctx.skills.run, domain=cfg.env.domain, model=model_name(cfg.policy), **fields)


def adopt(ctx: RunContext, harness: Harness, say: Any) -> tuple[Harness, list[Adoption]]:
    """The library's skills proven in this context, adopted one after another (each a child version of the last,
    so a run that promoted a chain hands the whole chain to the next), each recorded in its skill's evidence; then,
    under loop.adopt_skills `across`, one regrade learned in another context as the term it plays here
    (SkillLibrary.adoptable_across), its `won` naming the trials elsewhere."""
    cfg, out = ctx.cfg, []
    domain, model = cfg.env.domain, model_name(cfg.policy)
    while (s := ctx.skills.adoptable(domain, model, harness)) is not None:
        won = [f"{e.run}/{e.trial}" + ("" if e.decision == "promote" else " (repair)")
               for e in s.evidence_in(domain, model, harness.version) if e.decision in FOR]  # fmt: skip
        why = f"won or repaired {len(won)} trial(s) from this harness: {', '.join(won)}"
        if (took := take(ctx, s, s.instantiate(harness), harness, won, why, len(out) + 1, say)) is None:
            break
        out.append(took[0])
        harness = took[1]
    if cfg.loop.adopt_skills != "across":
        return harness, out
    if (found := ctx.skills.adoptable_across(domain, model, harness, domains.variants_of(domain))) is not None:
        s, iv = found
        won = [f"{e.run}/{e.trial} ({e.decision}, {e.domain or '?'})" for e in s.evidence if e.decision in FOR]
        why = f"across domains, learned as {s.target} -> {s.value}; won or repaired {', '.join(won)}"
        if (took := take(ctx, s, iv, harness, won, why, len(out) + 1, say)) is not None:
            out.append(took[0])
            harness = took[1]
    return harness, out


def take(ctx: RunContext, s: Skill, iv: Intervention, harness: Harness, won: list[str], why: str, n: int,
         say: Any) -> tuple[Adoption, Harness] | None:  # fmt: skip
    """Skill s adopted as iv on harness: the child version saved, the adoption in the skill's evidence (trial
    `adopt-n`: one record a run and adoption, so a redone start stage adds nothing). None where the configured
    trainer cannot run the child (train.backend trl)."""
    iv = iv.bind(harness)
    child = iv.apply(harness)
    try:
        check_trl(ctx.cfg.train, child, ctx.domain)
    except ConfigError as e:
        say(f"skill {s.id} not adopted: {e}")
        return None
    ev = run_evidence(ctx, round=0, trial=f"adopt-{n}", decision="adopt", harness=harness.version,
                      before=iv.before, reused=True)  # fmt: skip
    ctx.skills.record(iv, ev, source="library", create=False, sid=s.id)
    save_harness(ctx.run_dir, child)
    say(f"adopted skill {s.id}: {iv.describe()} ({why}); the run starts under harness {child.version}")
    adoption = Adoption(skill=s.id, intervention=iv, harness_from=harness.version, harness_to=child.version, won=won)
    return adoption, child


def held_against(
    ctx: RunContext, rnd: int, harness: str, back: Rollback | None, sig: list[str]
) -> list[tuple[str, Skill]]:
    """The adopted skills a rolled-back round counts against (one loss each a run, at most), while the mainline is
    still under the harness the adoptions made (`harness`: the round's). The control trains under that harness, so
    two rollbacks are the adoption doing harm: the control rejected for the very exploit a skill's hypothesis said
    it remedies (in any round), and the control significantly below where the arms forked (the regression guard)
    while the mainline has kept nothing since the start, i.e. the adopted harness's first training fell. A fall
    later in the run, after rounds kept under it, is RL's own noise as much as the adoption's doing (a warm SWE
    run fell in round 6 of 8 and still ended above its cold run), and another exploit is not the skill's. Without
    this no verdict is ever made on an adoption, and the next run would adopt it again. Returns (the evidence's
    trial id, the skill as recorded)."""
    if back is None or back.branch != branch_id(rnd, "control") or not ctx.cfg.loop.adopt_skills:
        return []  # the start stage is read only where a rollback could count
    started = read_stage(ctx.ledger, 0, "start")
    chain = started.adopted or []
    if not chain or chain[-1].harness_to != harness:
        return []
    fell = back.reasons == ["regression"] and back.rolled_back_to == started.head.branch
    out = []
    for i, a in enumerate(chain, 1):
        if not fell and f"validity:{a.intervention.hypothesis.finding}" not in back.reasons:
            continue
        ev = run_evidence(ctx, round=rnd, trial=f"adopt-{i}-held", decision="reject", signature=list(sig),
                          harness=a.harness_from, before=a.intervention.before, reused=True)  # fmt: skip
        if (skill := ctx.skills.record(a.intervention, ev, source="library", create=False, sid=a.skill)) is not None:
            out.append((ev.trial, skill))
    return out


def final(
    ctx: RunContext, head: Mainline, why: str | None, stop: Stop, rounds: int
) -> tuple[FinalResult, StageRecords]:
    """The one read of the final tasks, by the checkpoint the run ends on (guard.ending: its last head, or the
    mainline's best read where the last head read below it, `why` then saying so)."""
    cfg = ctx.cfg
    policy = HFPolicy.load(head.checkpoint, lora_rank=cfg.policy.lora_rank, placement=placement(cfg.policy))
    ev = evaluate(policy, ctx.domain, ctx.heldout(ctx.final_ids), cfg.eval)
    expect_evaluator(ctx, "final", ev.evaluator_hash, "the final read")
    record_eval(
        ctx.store,
        head.harness,
        ctx.domain,
        ev,
        head.step,
        StepContext(cfg.run.name, final_branch(head.branch), cfg.run.seed),
    )
    return (
        FinalResult(
            accuracy=ev.accuracy,
            evaluator_hash=ev.evaluator_hash,
            head=head,
            stop_reason=stop.reason,
            rounds=rounds,
            cut_by_seconds=True if stop.cap == "seconds" else None,
            ended_on_best=why,
        ),
        StageRecords(charges={"eval": Charge(sum(e.action_tokens for e in ev.episodes))}),
    )


def summary(ctx: RunContext, started: StartResult, done: FinalResult) -> dict[str, Any]:
    """summary.json: the run's outcome, its verdicts and its spend."""
    ledger = ctx.ledger
    verdicts, spent = read_verdicts(ledger), ledger.spent()
    disk = disk_use(ledger, ctx.run_dir)
    gates = [
        (r["round"], GateResult.model_validate_json(r["result"]))
        for r in ledger.rows("SELECT round, result FROM stages WHERE stage = 'gate' ORDER BY round")
    ]
    return {
        "run": ctx.cfg.run.name,
        "rounds": done.rounds,
        "stop_reason": done.stop_reason,
        # budget.seconds (a safety net) ended the run before the budget that decides did.
        "cut_by_seconds": bool(done.cut_by_seconds),
        "baseline_accuracy": started.final_accuracy,
        "warm_start_seconds": round(started.warm_start_seconds, 1),
        "final_accuracy": done.accuracy,
        # Where the last head read below the mainline's best read on the gate tasks: the run ended on that best.
        "ended_on_best": done.ended_on_best,
        "evaluator_hash": done.evaluator_hash,
        "harness_version": done.head.harness.version,
        "skill_libraries": ledger.skill_libraries(),
        # Skills the run started under without a trial (loop.adopt_skills): `skill: what it set`.
        "adopted": [f"{a.skill}: {a.intervention.describe()}" for a in started.adopted or []],
        "promoted": [v.trial for v in verdicts if v.decision == "promote"],
        "rejected": [v.trial for v in verdicts if v.decision == "reject"],
        # Rejected trials whose harness the mainline took in place of one that pays an exploit (gate.repair).
        "repaired": [
            fix.trial
            for r in ledger.rows("SELECT result FROM stages WHERE stage = 'promote' ORDER BY round")
            if (fix := PromoteResult.model_validate_json(r["result"]).repaired) is not None
        ],
        # Controls (the harness carried on) rejected for an exploit their own window carries.
        "rejected_controls": [
            {"branch": branch_id(rnd, "control"), "reasons": g.control_rejected}
            for rnd, g in gates
            if g.control_rejected
        ],
        # Arms that ended discarded (off the final mainline's lineage), in steps and generated tokens.
        **spend(ledger, lineage(ledger, done.head.branch)).to_dict(),
        # Checkpoints left on disk and freed by run.keep_checkpoints (bytes).
        "checkpoint_bytes": disk.checkpoint_bytes,
        "pruned_bytes": disk.pruned_bytes,
        "spent": asdict(spent),
        # Where the run went past a cap of the budget, by how much (the step or read that crossed it ran to its end).
        "past_budget": past_budget(ctx.cfg, spent),
        "spent_by_stage": {k: asdict(v) for k, v in ledger.spent_by_stage().items()},
    }
