"""The co-evolution loop, one round top to bottom: train the mainline for a segment; diagnose;
revise the suite; propose; replay; trial; gate; promote; remember. `evotrainer run` runs rounds
until the budget is spent; `evotrainer resume` continues a killed run.

Every stage ends with one ledger transaction holding its records and its done mark (store/ledger.py).
A stage's result is all that later stages read, so a resumed run replays finished stages from the
ledger and redoes the first unfinished one from its start: nothing is lost or written twice, and the
decisions are the ones an uninterrupted run with the same seed makes."""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.markup import escape

from evotrainer.backtest import gate
from evotrainer.backtest.replay import load_columns, replay
from evotrainer.backtest.trial import ArmResult, ArmSpec, make_executor
from evotrainer.errors import ConfigError
from evotrainer.config import RunConfig, dump_config
from evotrainer.diagnostics.detector import Finding
from evotrainer.diagnostics.revision import PastVerdict, revise
from evotrainer.diagnostics.suite import Suite
from evotrainer.envs.registry import make_domain
from evotrainer.evaluation import evaluate
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Intervention
from evotrainer.harness.rewards import check_terms
from evotrainer.policies import load_policy
from evotrainer.proposers.brief import build_brief
from evotrainer.proposers.proposer import Proposal, intervention_key, screen, signature
from evotrainer.skills.library import Evidence, SkillLibrary
from evotrainer.store.ledger import Charge, Ledger
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.grpo import GRPOTrainer
from evotrainer.training.run import record_eval, save_harness, seed_everything
from evotrainer.training.segment import StepContext

AA_SEED_OFFSET = 1_000_003  # the A-A arm trains on other seeds: same harness, other tasks and sampling noise


def make_proposer(cfg: RunConfig, ledger: Ledger, run_dir: Path):
    if cfg.loop.proposer == "llm":
        from evotrainer.proposers.llm import LLMProposer

        return LLMProposer.from_config(cfg, ledger=ledger, run_dir=run_dir)
    from evotrainer.proposers.heuristic import HeuristicProposer

    return HeuristicProposer(seed=cfg.run.seed)


def check_budget(cfg: RunConfig) -> None:
    b = cfg.budget
    if not (b.generated_tokens or b.trained_tokens or b.seconds or cfg.loop.max_rounds):
        raise ConfigError("budget: set at least one of budget.generated_tokens, budget.trained_tokens, budget.seconds "
                          "or loop.max_rounds, so the loop knows when to stop")


def over_budget(cfg: RunConfig, spent: Charge, extra: Charge = Charge()) -> str | None:
    """Which cap (if any) spent + extra reaches."""
    b, s = cfg.budget, spent + extra
    for name, cap, used in (("generated_tokens", b.generated_tokens, s.generated_tokens),
                            ("trained_tokens", b.trained_tokens, s.trained_tokens), ("seconds", b.seconds, s.seconds)):
        if cap and used >= cap:
            return name
    return None


def arm_charge(r: ArmResult) -> Charge:
    return Charge(r.generated_tokens + r.eval_tokens, r.trained_tokens, r.seconds)


def split_heldout(ids: list[str], final_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Gate tasks and final tasks, disjoint and seeded: gate decisions never read the final tasks."""
    order = sorted(ids)
    random.Random(f"heldout-split:{seed}").shuffle(order)
    n_final = max(1, round(len(order) * final_fraction))
    return sorted(order[n_final:]), sorted(order[:n_final])


def run_loop(cfg: RunConfig, console: Console | None = None, resume: bool = False) -> dict[str, Any]:
    console = console or Console()
    # -- 0. open the run ---------------------------------------------------------------------------------
    # Everything the config can get wrong is checked before anything is written.
    check_budget(cfg)
    domain = make_domain(cfg)
    check_terms(cfg.harness, domain)
    if cfg.loop.proposer == "llm":  # an endpoint that cannot be reached stops the run before anything is written
        from evotrainer.proposers.llm import check_endpoint

        check_endpoint(cfg)
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    ledger_path = run_dir / "ledger.sqlite"
    if ledger_path.exists() and not resume:
        raise ConfigError(f"run.name: {run_dir} already holds a loop run; `evotrainer resume {run_dir}` continues it, "
                          "or choose another run.name")
    run_dir.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(ledger_path)
    # The run directory may have moved since it started: its location is not part of the identity.
    identity = cfg.model_dump_json(exclude={"run": {"out_dir"}})
    if (saved := ledger.get_meta("config")) is None:
        (run_dir / "config.yaml").write_text(dump_config(cfg))
        ledger.set_meta("config", identity)
    elif saved != identity:
        raise ConfigError(f"{run_dir}: the config differs from the one this run started with; resume takes no new config")
    store = RolloutStore(run_dir / "store")
    skills = SkillLibrary(cfg.loop.skills_dir)
    executor = make_executor(cfg, log=None)
    proposer = make_proposer(cfg, ledger, run_dir)
    gate_ids, final_ids = split_heldout([t.id for t in domain.tasks("heldout")], cfg.gate.final_fraction, cfg.run.seed)
    say = console.print

    def stage(rnd: int, name: str, work: Callable[[], tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
        """Run a stage unless the ledger has it; charge its seconds; commit records and mark together."""
        if (done := ledger.stage_result(rnd, name)) is not None:
            return done
        ledger.set_status(rnd, name)
        t0 = time.perf_counter()
        result, records = work()
        charges = records.pop("charges", {})
        charges.setdefault("stage", Charge(seconds=time.perf_counter() - t0 - sum(c.seconds for c in charges.values())))
        ledger.finish_stage(rnd, name, result, charges=charges, **records)
        return result

    def spec(branch: str, role: str, head: dict[str, Any], harness: dict[str, Any], first: int, steps: int,
             seed: int, gate: bool) -> ArmSpec:
        return ArmSpec(branch, role, str(run_dir), cfg.model_dump(mode="json"), harness, head["checkpoint"], seed,
                       first, steps, tuple(gate_ids) if gate else None)

    def branch_row(r: ArmResult, rnd: int, parent: str, suite_version: str, seed: int) -> dict[str, Any]:
        return {"id": r.branch, "parent": parent, "round": rnd, "kind": r.role, "checkpoint": r.checkpoint,
                "harness_version": r.harness_version, "suite_version": suite_version, "first_step": r.first_step,
                "last_step": r.last_step, "seed": seed, "heldout_accuracy": r.accuracy}

    # -- round 0: the base policy, its checkpoint and the baseline on the final tasks -------------------------
    def start() -> tuple[dict[str, Any], dict[str, Any]]:
        seed_everything(cfg)
        policy = load_policy(cfg, domain, log=say)
        trainer = GRPOTrainer(policy, cfg.harness)
        ckpt = run_dir / "checkpoints" / "base"
        trainer.save(ckpt)
        by_id = {t.id: t for t in domain.tasks("heldout")}
        ev = evaluate(policy, domain, [by_id[i] for i in final_ids], cfg.eval)
        record_eval(store, cfg, domain, ev, 0, StepContext(cfg.run.name, "base", cfg.run.seed))
        save_harness(run_dir, cfg.harness)
        suite = Suite.default()
        head = {"branch": "base", "checkpoint": str(ckpt), "harness": cfg.harness.model_dump(mode="json"),
                "suite": suite.model_dump(mode="json"), "step": 0, "noise": None, "aa_due": True, "carry": []}
        row = {"id": "base", "parent": None, "round": 0, "kind": "base", "checkpoint": str(ckpt), "harness_version": cfg.harness.version,
               "suite_version": suite.version, "first_step": 0, "last_step": 0, "seed": cfg.run.seed, "heldout_accuracy": None}
        return ({"head": head, "final_accuracy": ev.accuracy, "evaluator_hash": ev.evaluator_hash},
                {"branches": [row], "charges": {"eval": Charge(sum(e.action_tokens for e in ev.episodes))}})

    started = stage(0, "start", start)
    head = started["head"]
    say(f"[bold]run[/] {run_dir}  domain {cfg.env.domain}  held-out: {len(gate_ids)} gate / {len(final_ids)} final tasks  "
        f"baseline (final tasks) {started['final_accuracy']:.3f}")

    rnd, stop_reason = 0, ""
    while True:
        rnd += 1
        if cfg.loop.max_rounds and rnd > cfg.loop.max_rounds:
            stop_reason = f"loop.max_rounds={cfg.loop.max_rounds}"
            break
        # Checked only before a round's first stage: a resumed round must not stop where the original went on.
        if ledger.stage_result(rnd, "train") is None and (cap := over_budget(cfg, ledger.spent())):
            stop_reason = f"budget.{cap} spent"
            break
        harness = Harness.model_validate(head["harness"])
        suite = Suite.model_validate(head["suite"])
        say(f"\n[bold]round {rnd}[/]  mainline {head['branch']} at step {head['step']}  harness {harness.version}")

        # -- 1. train the mainline for a segment ----------------------------------------------------------
        seg_branch = f"r{rnd:02d}-seg"

        def train() -> tuple[dict[str, Any], dict[str, Any]]:
            [r] = executor.run([spec(seg_branch, "segment", head, head["harness"], head["step"] + 1, cfg.loop.segment_steps,
                                     cfg.run.seed, gate=False)])
            return r.to_dict(), {"branches": [branch_row(r, rnd, head["branch"], suite.version, cfg.run.seed)],
                                 "charges": {seg_branch: arm_charge(r)}}

        seg = ArmResult(**stage(rnd, "train", train))
        say(f"1 train     {seg_branch}: steps {seg.first_step}-{seg.last_step}, reward {seg.reward_first:.3f} -> {seg.reward_last:.3f}")

        # -- 2. diagnose: the suite over the segment, plus what the gate saw on the mainline's last arm --------
        def diagnose() -> tuple[dict[str, Any], dict[str, Any]]:
            found = suite.run(store, seg_branch, seg.first_step, seg.last_step)
            store.append_findings(found, suite.version, f"{seg_branch}-d{seg.last_step:06d}", seg_branch, seg.first_step, seg.last_step)
            return {"findings": [f.to_record() for f in found]}, {}

        own = _findings(stage(rnd, "diagnose", diagnose)["findings"])  # on this segment's window
        findings = own + _findings(head["carry"])
        findings = _dedupe(findings)
        say(f"2 diagnose  {len(findings)} finding(s): " + (", ".join(f"{f.name} ({f.severity})" for f in findings) or "none"))

        # -- 3. revise the suite: recalibrate, induce; a revision that flips a past verdict is refused --------
        def revise_suite() -> tuple[dict[str, Any], dict[str, Any]]:
            new, revisions, induction = revise(suite, store, seg_branch, seg.first_step, seg.last_step, verdicts=_past_verdicts(ledger))
            flips = [f for r in revisions for f in r.flips if f.what == "verdict"]
            accepted = bool(revisions) and not flips
            extra: list[Finding] = []
            if accepted:
                extra = [f for f in new.run(store, seg_branch, seg.first_step, seg.last_step) if f.name not in suite.detectors]
                store.append_findings(extra, new.version, f"{seg_branch}-v{seg.last_step:06d}", seg_branch, seg.first_step, seg.last_step)
            return {"suite": (new if accepted else suite).model_dump(mode="json"), "accepted": accepted,
                    "revisions": [r.to_record() for r in revisions], "refused_for_flips": [asdict(f) for f in flips],
                    "induction": {"accepted": induction.accepted, "reason": induction.reason},
                    "findings": [f.to_record() for f in extra]}, {}

        revised = stage(rnd, "revise", revise_suite)
        suite = Suite.model_validate(revised["suite"])
        own += _findings(revised["findings"])
        findings = _dedupe(findings + _findings(revised["findings"]))
        say(f"3 revise    suite {suite.version}" + (" (revised)" if revised["accepted"] else " (unchanged)")
            + (f"; refused: flips {len(revised['refused_for_flips'])} past verdict(s)" if revised["refused_for_flips"] else ""))

        # -- 4. propose single-factor interventions from the findings and the skill library -----------------
        sig = signature(findings)

        def propose() -> tuple[dict[str, Any], dict[str, Any]]:
            brief = build_brief(run=cfg.run.name, rnd=rnd, domain=cfg.env.domain, harness=harness, findings=findings, store=store,
                                branches=[seg_branch], ledger=ledger, skills=skills.match(sig, cfg.env.domain, harness),
                                limit=cfg.loop.candidates, explore=cfg.loop.explore)
            kept, refused = screen(proposer.propose(brief), brief)  # whoever proposed, the same checks apply
            # An LLM proposer also spends tokens (charged here) and may write detectors, which join the
            # suite only after the same validation and backtest against past verdicts as induced ones.
            charges = getattr(proposer, "take_charges", dict)()
            new_suite, admitted = suite, []
            if detectors := getattr(proposer, "take_detectors", list)():
                from evotrainer.diagnostics.revision import admit

                new_suite, admitted = admit(suite, store, detectors, seg_branch, seg.first_step, seg.last_step, _past_verdicts(ledger))
            return {"signature": list(sig), "proposals": [_proposal_dict(p) for p in kept[: cfg.loop.candidates]],
                    "refused": [{"proposal": _proposal_dict(r.proposal), "reason": r.reason} for r in refused],
                    "skills_matched": [m.skill_id for m in brief.skills], "suite": new_suite.model_dump(mode="json"),
                    "detectors": admitted}, {"charges": charges}

        proposed = stage(rnd, "propose", propose)
        suite = Suite.model_validate(proposed["suite"])
        proposals = [_proposal(p) for p in proposed["proposals"]]
        say("4 propose   " + ("; ".join(escape(f"{p.intervention.describe()} [{p.source}{' ' + p.skill_id if p.skill_id else ''}]")
                                      for p in proposals) or "nothing to propose"))

        # -- 5. replay: re-score the segment's rollouts; drop what changes nothing or worsens the audit AUC ----
        def replay_stage() -> tuple[dict[str, Any], dict[str, Any]]:
            kept, dropped = [], []
            cols = load_columns(store, list(harness.reward_weights) + [t for t in domain.reward_terms if t not in harness.reward_weights],
                                where=f"split = 'train' AND branch = '{seg_branch}'")
            flagged = {i for f in findings for i in f.evidence}
            for i, p in enumerate(proposals):
                if not p.intervention.replayable:
                    kept.append({"index": i, "replay": None, "why": "needs a trial (not replayable)"})
                    continue
                rep = replay(harness, p.intervention, cols, flagged)
                why = ("no effect on advantages or masks" if not rep.has_effect else
                       "worse reward-audit agreement" if rep.reward_audit_auc_after < rep.reward_audit_auc_before - 0.02 else "")
                (dropped if why else kept).append({"index": i, "replay": rep.to_dict(), "why": why or "replay shows an effect"})
            return {"kept": kept, "dropped": dropped}, {}

        replayed = stage(rnd, "replay", replay_stage)
        survivors = [(proposals[k["index"]], k["replay"]) for k in replayed["kept"]]
        say(f"5 replay    {len(survivors)} to trial, {len(replayed['dropped'])} dropped"
            + "".join(f"; dropped {escape(proposals[d['index']].intervention.describe())}: {d['why']}" for d in replayed["dropped"]))

        # -- 6. trial: control, candidates and (when due) the A-A control, forked from the segment ----------
        # A segment whose own window carries a validity finding (an exploit) is not built on: the arms
        # fork from where the round started, so the remedy is tried on a policy the exploit never touched.
        tainted = sorted({f.name for f in own if f.validity})
        first = head["step"] + 1 if tainted else seg.last_step + 1
        seg_head = {"checkpoint": head["checkpoint"] if tainted else seg.checkpoint}
        aa_due = bool(survivors) and (head["aa_due"] or cfg.gate.aa_control == "round")

        def trial() -> tuple[dict[str, Any], dict[str, Any]]:
            specs = [spec(f"r{rnd:02d}-ctl", "control", seg_head, head["harness"], first, cfg.loop.trial_steps, cfg.run.seed, True)]
            for j, (p, _) in enumerate(survivors, 1):
                specs.append(spec(f"r{rnd:02d}-c{j}", "candidate", seg_head, p.intervention.apply(harness).model_dump(mode="json"),
                                  first, cfg.loop.trial_steps, cfg.run.seed, True))
            if aa_due:
                specs.append(spec(f"r{rnd:02d}-aa", "aa", seg_head, head["harness"], first, cfg.loop.trial_steps,
                                  cfg.run.seed + AA_SEED_OFFSET, True))
            if not survivors:
                specs = specs[:1]  # nothing to try: the control alone carries the mainline on
            # Stop cleanly at the cap: a trial that cannot finish inside the budget is not started.
            per_step = Charge(seg.generated_tokens // max(1, cfg.loop.segment_steps), seg.trained_tokens // max(1, cfg.loop.segment_steps),
                              seg.seconds / max(1, cfg.loop.segment_steps))
            n = len(specs) * cfg.loop.trial_steps
            if cap := over_budget(cfg, ledger.spent(), Charge(per_step.generated_tokens * n, per_step.trained_tokens * n, per_step.seconds * n)):
                return {"abandoned": f"budget.{cap} would be exceeded by {len(specs)} arm(s) of {cfg.loop.trial_steps} steps", "arms": []}, {}
            results = executor.run(specs, started=lambda s: ledger.set_status(rnd, "trial", s.branch))
            seeds = {s.branch: s.seed for s in specs}
            return ({"arms": [r.to_dict() for r in results]},
                    {"branches": [branch_row(r, rnd, head["branch"] if tainted else seg_branch, suite.version, seeds[r.branch]) for r in results],
                     "charges": {r.branch: arm_charge(r) for r in results}})

        tried = stage(rnd, "trial", trial)
        if tried.get("abandoned"):
            say(f"6 trial     abandoned: {tried['abandoned']}")
            stop_reason = tried["abandoned"]
            head = {**head, "branch": seg_branch, "checkpoint": seg.checkpoint, "step": seg.last_step}
            break
        arms = {a["branch"]: ArmResult(**a) for a in tried["arms"]}
        control = arms[f"r{rnd:02d}-ctl"]
        say(f"6 trial     " + ", ".join(f"{b} {a.accuracy:.3f}" for b, a in arms.items()) + " (gate tasks)"
            + (f"; forked from {head['branch']}: the segment carries {', '.join(tainted)}" if tainted else ""))

        # -- 7. gate: paired statistic vs control, beyond the A-A noise, no validity finding against it ------
        def gate_stage() -> tuple[dict[str, Any], dict[str, Any]]:
            ctrl_ev = gate.arm_evidence(store, suite, control.branch, control.first_step, control.last_step,
                                        control.reward_last - control.reward_first)
            # The control is the current harness carried on: when its own window carries a validity
            # finding (an exploit the reward pays and the audit does not back), it is rejected like an
            # invalid candidate would be, and the mainline does not continue from it (see promote).
            ctrl_invalid = sorted({f"validity:{f.name}" for f in ctrl_ev.findings if f.validity})
            noise, aa_measured = head["noise"], False
            if (aa := arms.get(f"r{rnd:02d}-aa")) is not None:
                aa_ev = gate.arm_evidence(store, suite, aa.branch, aa.first_step, aa.last_step, aa.reward_last - aa.reward_first)
                # Two arms that carry an exploit differ by how fast it spread in each, not by the run's
                # noise: such a pair is no A-A measurement (it is taken again next round).
                if not ctrl_invalid and not any(f.validity for f in aa_ev.findings):
                    noise, aa_measured = {**gate.aa_noise(control.outcomes, aa.outcomes, cfg.gate, cfg.run.seed), "round": rnd}, True
            noise = noise or {"abs_delta": 0.0, "note": "no valid A-A measurement yet"}
            trials, verdicts, out = [], [], {"noise": noise, "aa_measured": aa_measured,
                                             "control_findings": [f.to_record() for f in ctrl_ev.findings],
                                             "control_rejected": ctrl_invalid, "verdicts": []}
            for j, (p, rep) in enumerate(survivors, 1):
                cand = arms[f"r{rnd:02d}-c{j}"]
                ev = gate.arm_evidence(store, suite, cand.branch, cand.first_step, cand.last_step, cand.reward_last - cand.reward_first)
                v = gate.decide(cand.outcomes, control.outcomes, ev, ctrl_ev, noise, cfg.gate, cand.evaluator_hash, cfg.run.seed + rnd)
                v.statistic["evidence"] = _disagreements(cand, control, gate_ids)
                tid = f"r{rnd:02d}-t{j}"
                trials.append({"id": tid, "round": rnd, "candidate": cand.branch, "control": control.branch,
                               "intervention": p.intervention.model_dump(mode="json"), "source": p.source, "skill_id": p.skill_id,
                               "signature": list(sig), "replay": rep})
                budget = {"candidate": asdict(arm_charge(cand)), "control": asdict(arm_charge(control)), "spent": asdict(ledger.spent())}
                verdicts.append({"trial": tid, "round": rnd, **{k: val for k, val in v.to_dict().items()}, "budget": budget})
                out["verdicts"].append({"trial": tid, "decision": v.decision, "reasons": v.reasons, "delta": v.statistic["delta"]})
            return out, {"trials": trials, "verdicts": verdicts}

        gated = stage(rnd, "gate", gate_stage)
        for v, (p, _) in zip(gated["verdicts"], survivors):
            say(f"7 gate      {v['trial']} {escape(p.intervention.describe())}: [bold]{v['decision']}[/] "
                f"(delta {v['delta']:+.3f}, noise {gated['noise']['abs_delta']:.3f}{'; ' + ', '.join(v['reasons']) if v['reasons'] else ''})")
        if gated.get("control_rejected"):
            say(f"7 gate      control {control.branch} (harness unchanged): [bold]reject[/] ({', '.join(gated['control_rejected'])})")

        # -- 8. promote: at most one winner; the mainline continues from its checkpoint, else the control's ----
        def promote() -> tuple[dict[str, Any], dict[str, Any]]:
            wins = [(v["delta"], j) for j, v in enumerate(gated["verdicts"], 1) if v["decision"] == "promote"]
            if wins:
                _, j = max(wins)
                winner, p = arms[f"r{rnd:02d}-c{j}"], survivors[j - 1][0]
                new_h = p.intervention.apply(harness)
                save_harness(run_dir, new_h)
            else:
                winner, p, new_h = control, None, harness
            carry = [f for f in (gated["control_findings"] if p is None else
                                 _findings_of(store, winner.branch, winner.last_step))]
            at = {"branch": winner.branch, "checkpoint": winner.checkpoint, "step": winner.last_step}
            rejected = None
            if p is None and gated.get("control_rejected"):
                # Nothing valid won and the control carries an exploit: roll the mainline back to where
                # this round started. The segment and control stay in the ledger and store as evidence;
                # the findings go on to the next round's brief, so the proposer tries another remedy.
                rejected = {"branch": control.branch, "reasons": gated["control_rejected"], "rolled_back_to": head["branch"]}
                at = {"branch": head["branch"], "checkpoint": head["checkpoint"], "step": head["step"]}
            new_head = {**at, "harness": new_h.model_dump(mode="json"), "suite": suite.model_dump(mode="json"),
                        "noise": gated["noise"], "carry": carry,
                        # The A-A control is re-measured after a promotion (the policy changed), or when it was due and not run.
                        "aa_due": p is not None or (head["aa_due"] and not gated.get("aa_measured", f"r{rnd:02d}-aa" in arms))}
            return {"head": new_head, "promoted": gated["verdicts"][j - 1]["trial"] if p else None, "rejected": rejected}, {}

        promoted = stage(rnd, "promote", promote)
        head = promoted["head"]
        rej = promoted.get("rejected")
        say(f"8 promote   " + (f"{promoted['promoted']}: harness {head['harness'] and Harness.model_validate(head['harness']).version}"
                               if promoted["promoted"] else
                               f"nothing; mainline {'rolls back to' if rej else 'continues from'} {head['branch']} at step {head['step']}"))

        # -- 9. remember: every verdict becomes evidence for (or against) a skill ---------------------------
        def remember() -> tuple[dict[str, Any], dict[str, Any]]:
            touched = []
            for v, (p, _) in zip(gated["verdicts"], survivors):
                ev = Evidence(run=cfg.run.name, round=rnd, trial=v["trial"], decision=v["decision"], effect=v["delta"],
                              domain=cfg.env.domain, signature=list(sig))
                s = skills.record(p.intervention, ev, source=p.source, create=v["decision"] == "promote", sid=p.skill_id)
                if s is not None:
                    touched.append({"skill": s.id, "trial": v["trial"], "wins": s.wins, "losses": s.losses, "quarantined": s.quarantined})
            return {"skills": touched}, {}

        remembered = stage(rnd, "remember", remember)
        if remembered["skills"]:
            say("9 remember  " + "; ".join(f"{s['skill']} ({s['wins']} won, {s['losses']} lost{', quarantined' if s['quarantined'] else ''})"
                                           for s in remembered["skills"]))
        if rej and not survivors:
            stop_reason = f"the control carries an exploit ({', '.join(rej['reasons'])}) and no remedy is left to try"
            break

    # -- the end: one read of the final tasks, the budget by stage, the report --------------------------------
    def final() -> tuple[dict[str, Any], dict[str, Any]]:
        from evotrainer.policies.hf import HFPolicy

        policy = HFPolicy.load(head["checkpoint"], lora_rank=cfg.policy.lora_rank)
        by_id = {t.id: t for t in domain.tasks("heldout")}
        ev = evaluate(policy, domain, [by_id[i] for i in final_ids], cfg.eval)
        record_eval(store, cfg.model_copy(update={"harness": Harness.model_validate(head["harness"])}), domain, ev, head["step"],
                    StepContext(cfg.run.name, f"final-{head['branch']}", cfg.run.seed))
        return {"accuracy": ev.accuracy, "evaluator_hash": ev.evaluator_hash, "head": head, "stop_reason": stop_reason,
                "rounds": rnd - 1}, {"charges": {"eval": Charge(sum(e.action_tokens for e in ev.episodes))}}

    done = stage(0, "final", final)
    summary = {"run": cfg.run.name, "rounds": done["rounds"], "stop_reason": done["stop_reason"],
               "baseline_accuracy": started["final_accuracy"], "final_accuracy": done["accuracy"],
               "evaluator_hash": done["evaluator_hash"], "harness_version": Harness.model_validate(done["head"]["harness"]).version,
               "promoted": [v["trial"] for v in ledger.verdicts() if v["decision"] == "promote"],
               "rejected": [v["trial"] for v in ledger.verdicts() if v["decision"] == "reject"],
               # Controls (the harness carried on) rejected for an exploit their own window carries.
               "rejected_controls": [{"branch": f"r{x['round']:02d}-ctl", "reasons": r["control_rejected"]}
                                     for x in ledger.rows("SELECT round, result FROM stages WHERE stage = 'gate' ORDER BY round")
                                     if (r := json.loads(x["result"])).get("control_rejected")],
               "spent": asdict(ledger.spent()), "spent_by_stage": {k: asdict(v) for k, v in ledger.spent_by_stage().items()}}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    from evotrainer.report import write_report

    report = write_report(run_dir)
    say(f"\n[bold]done[/] after {summary['rounds']} round(s) ({done['stop_reason']}): final-task accuracy "
        f"{summary['baseline_accuracy']:.3f} -> [bold]{summary['final_accuracy']:.3f}[/]; "
        f"{len(summary['promoted'])} promoted, {len(summary['rejected'])} rejected; report {report}")
    ledger.close()
    return summary


# -- small helpers: records <-> objects ------------------------------------------------------------------------
def _findings(records: list[dict[str, Any]]) -> list[Finding]:
    return [Finding(**{**r, "evidence": tuple(r["evidence"]), "knobs": tuple(r["knobs"])}) for r in records]


def _dedupe(findings: list[Finding]) -> list[Finding]:
    """One finding per name, the most severe (then the latest window) kept."""
    rank = {"critical": 2, "warning": 1, "info": 0}
    best: dict[str, Finding] = {}
    for f in findings:
        if f.name not in best or (rank[f.severity], f.last_step) > (rank[best[f.name].severity], best[f.name].last_step):
            best[f.name] = f
    return list(best.values())


def _findings_of(store: RolloutStore, branch: str, last: int) -> list[dict[str, Any]]:
    rows = store.sql("SELECT * EXCLUDE (suite_version) FROM findings WHERE branch = ? AND last_step = ?", [branch, last])
    return [{**r, "evidence": list(r["evidence"]), "knobs": list(r["knobs"])} for r in rows]


def _proposal_dict(p: Proposal) -> dict[str, Any]:
    return {"intervention": p.intervention.model_dump(mode="json"), "source": p.source, "skill_id": p.skill_id, "note": p.note,
            "key": intervention_key(p.intervention)}


def _proposal(d: dict[str, Any]) -> Proposal:
    return Proposal(Intervention.model_validate(d["intervention"]), d["source"], d["skill_id"], d["note"])


def _past_verdicts(ledger: Ledger) -> list[PastVerdict]:
    branches = {b["id"]: b for b in ledger.branches()}
    trials = {t["id"]: t for t in ledger.trials()}
    out = []
    for v in ledger.verdicts():
        b = branches[trials[v["trial"]]["candidate"]]
        out.append(PastVerdict(b["id"], b["first_step"], b["last_step"], v["decision"], tuple(v["reasons"])))
    return out


def _disagreements(cand: ArmResult, control: ArmResult, gate_ids: list[str], n: int = 5) -> dict[str, list[str]]:
    """Held-out rollout ids where the arms disagree, both sides, so a reader can open the trajectories."""
    index = {t: i for i, t in enumerate(gate_ids)}
    def rid(arm: ArmResult, task: str) -> str:
        return f"{arm.branch}-e{arm.last_step:06d}-{index[task]:04d}"
    won = [t for t in gate_ids if cand.outcomes.get(t) and not control.outcomes.get(t)][:n]
    lost = [t for t in gate_ids if control.outcomes.get(t) and not cand.outcomes.get(t)][:n]
    return {"candidate_won": [rid(cand, t) for t in won] + [rid(control, t) for t in won],
            "candidate_lost": [rid(cand, t) for t in lost] + [rid(control, t) for t in lost]}
