"""Is the gate's error rate what its level says, and can it still promote a known-good change?

Null candidates are the control's own harness in a candidate's slot (on the candidate's own seeds, as
every arm has): any promotion of one is false. The benchmark trains pools of real arms from the README
main job's situation (examples/math.yaml): null arms from the round-1 start (learning rate 1e-5) and
from a later start (after the learning-rate fix, 1e-4, where seed-to-seed spread is twice as large),
and learning-rate-fix arms (1e-5 -> 1e-4) from the round-1 start, each evaluated on the gate tasks at
the race's checkpoints. Rounds are then resampled from these arms' per-task outcomes (distinct arms
for the control, the K candidates, the confirmation's candidate and control replicates) and run
through the gate's own functions (gate.futile, gate.finalist, gate.two_stage): the false-promotion
rate per round at K = 1, 2, 4 (the larger of the two starts), and the power to promote the
learning-rate fix (one fix among K - 1 null candidates), and the race's price (the share of a trial's
steps null and fix candidates run before gate.futile stops them). Finally, real null trials run the loop's own
trial and gate stages (stages/race.py, stages/decide.py) on fresh arms, with a null intervention
(shaping.overlong_penalty_factor, which does nothing without an overlong buffer).

Every arm is a resumable cell (its arm.json, reused only under the same spec), so the grid can run over
several sittings:

    python -m benchmarks.gate_calibration [--nulls 24] [--lr-arms 16] [--real-trials 20]

Writes benchmarks/results/gate_calibration.json (and its manifest): one object per K with candidates,
false_promotion_rate, nominal, power, null_trials, real_null_trials (and the per-start rates, the real
trials' outcomes, and a sensitivity sweep over the noise model's prior, gate.BASE_DOF).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from benchmarks.manifest import write_result
from benchmarks.paths import RESULTS, ROOT, scratch
from benchmarks.tables import markdown_table
from evotrainer.backtest import gate
from evotrainer.backtest.statistics import Pair, noise_of
from evotrainer.backtest.trial import ArmResult, ArmSpec, run_arm
from evotrainer.config import RunConfig, load_config
from evotrainer.envs.registry import make_domain, warm_start_key
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Hypothesis, Intervention
from evotrainer.policies import load_policy
from evotrainer.proposers.proposer import Proposal
from evotrainer.stages import decide, start
from evotrainer.stages import race as race_stage
from evotrainer.stages.context import run_stage, split_heldout
from evotrainer.stages.race import checkpoints
from evotrainer.stages.results import GateResult, StartResult, Survivor, TrialResult
from evotrainer.training.grpo import GRPOTrainer

PRIORS = (1.0, 4.0, 10.0, 30.0)  # the sensitivity sweep's priors for the noise model
OWN_BASES = 6  # real null trials on a base of their own; the others share the main job's (see real_null_trial)


def with_lr(h: Harness, lr: float) -> Harness:
    return h.model_copy(update={"optimizer": h.optimizer.model_copy(update={"learning_rate": lr})})


class Cells:
    """The benchmark's arms, each trained once (run_arm reuses a finished one under the same spec)."""

    def __init__(self, cfg: RunConfig, work: Path):
        self.cfg, self.work = cfg, work
        domain = make_domain(cfg)
        self.gate_ids, _ = split_heldout(
            [t.id for t in domain.tasks("heldout")], cfg.gate.final_fraction, cfg.run.seed
        )
        base = work / "checkpoints" / "base"
        if not (base / "optimizer.pt").exists():
            GRPOTrainer(load_policy(cfg.policy, domain, cfg.run.seed, warm_start_key(cfg, domain)), cfg.harness).save(
                base
            )
        self.base = base
        self.marks = checkpoints(cfg.loop.trial_steps, cfg.loop.race_checkpoints)

    def arm(self, name: str, harness: Harness, start: Path, first: int, steps: int, seed: int, gate_eval: bool = True):
        spec = ArmSpec(
            branch=name,
            role="candidate",
            run_dir=str(self.work),
            config=self.cfg.model_dump(mode="json"),
            harness=harness.model_dump(mode="json"),
            start=str(start),
            seed=seed,
            first_step=first,
            steps=steps,
            gate_ids=tuple(self.gate_ids) if gate_eval else None,
            checkpoints=self.marks if gate_eval else (),
        )
        return run_arm(spec)

    def starts(self) -> dict[str, tuple[Path, int]]:
        """lo: the round-1 start (the base trained one segment under the main job's harness); hi: after
        the learning-rate fix (30 more steps at 1e-4)."""
        seg = self.cfg.loop.segment_steps
        lo = self.arm("start-lo", self.cfg.harness, self.base, 1, seg, self.cfg.run.seed, gate_eval=False)
        hi = self.arm(
            "start-hi",
            with_lr(self.cfg.harness, 1e-4),
            Path(lo.checkpoint),
            seg + 1,
            30,
            self.cfg.run.seed,
            gate_eval=False,
        )
        return {"lo": (Path(lo.checkpoint), seg + 1), "hi": (Path(hi.checkpoint), seg + 31)}


def pools(cells: Cells, n_null: int, n_lr: int) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    steps, h = cells.cfg.loop.trial_steps, cells.cfg.harness
    jobs = [
        ("null-lo", "lo", h, n_null),
        ("null-hi", "hi", with_lr(h, 1e-4), n_null),
        ("lr-fix", "lo", with_lr(h, 1e-4), n_lr),
    ]
    starts = cells.starts()
    for kind, where, harness, n in jobs:
        start, first = starts[where]
        for i in range(n):
            t0 = time.perf_counter()
            r = cells.arm(f"{kind}-{i}", harness if kind != "null-hi" else harness, start, first, steps, 1000 + i)
            out.setdefault(kind, []).append({"curve": r.checkpoint_outcomes, "final": r.outcomes, "acc": r.accuracy})
            print(f"{kind}-{i}: {r.accuracy:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


def stop_at(ctrl: dict, cand: dict, marks: list[str]) -> str | None:
    """The checkpoint where the race stops the candidate (None: it runs its length)."""
    return next((m for i, m in enumerate(marks) if gate.futile(cand["curve"][m], ctrl["curve"][m], i == 0)), None)


def race(ctrl: dict, cand: dict, marks: list[str]) -> Pair | None:
    """The race as the trial runs it: None when the candidate stops at a checkpoint."""
    return None if stop_at(ctrl, cand, marks) else Pair.of(cand["final"], ctrl["final"])


def steps_run(pool: dict[str, list[dict]], ctrl_kind: str, cand_kind: str, steps: int) -> float:
    """The race's price: the mean share of a trial's steps a candidate of cand_kind runs against every
    control of ctrl_kind (a candidate is never its own control)."""
    shares = []
    for c in pool[ctrl_kind]:
        marks = sorted(c["curve"], key=int)
        for x in pool[cand_kind]:
            if x is not c:
                m = stop_at(c, x, marks)
                shares.append((int(m) if m else steps) / steps)
    return sum(shares) / len(shares)


def one_round(
    ctrl: dict, cands: list[dict], replicate: list[dict], ctlr: dict, level: float, prior: float = gate.BASE_DOF
) -> int | None:
    """The promoted candidate (1-based), or None, by the gate's own functions (`prior`: the noise model's
    prior pairs, gate.BASE_DOF unless a sensitivity sweep varies it)."""
    marks = sorted(ctrl["curve"], key=int)
    stage1 = [race(ctrl, c, marks) for c in cands]
    j, _ = gate.finalist(stage1, noise_of([], prior))
    if j is None:
        return None
    noise = noise_of([Pair.of(ctlr["final"], ctrl["final"])], prior)
    _, reasons = gate.two_stage(
        stage1[j - 1], Pair.of(replicate[j - 1]["final"], ctlr["final"]), len(cands), noise, level
    )
    return None if reasons else j


def resample(
    pool: dict[str, list[dict]],
    null: str,
    k: int,
    lr: bool,
    n: int,
    level: float,
    seed: int,
    prior: float = gate.BASE_DOF,
) -> float:
    """Share of n resampled rounds that promote: any promotion (null rounds) or the fix's (lr rounds)."""
    rng, hits = random.Random(seed), 0
    nulls, fixes = pool[null], pool["lr-fix"]
    for _ in range(n):
        pick = [nulls[i] for i in rng.sample(range(len(nulls)), 2 + 2 * k)]
        ctrl, ctlr, cands, reps = pick[0], pick[1], pick[2 : 2 + k], pick[2 + k :]
        if lr:
            a, b = rng.sample(range(len(fixes)), 2)
            cands, reps = [fixes[a], *cands[1:]], [fixes[b], *reps[1:]]
        j = one_round(ctrl, cands, reps, ctlr, level, prior)
        hits += (j == 1) if lr else (j is not None)
    return hits / n


def sensitivity(pool: dict[str, list[dict]], k: int, n: int, level: float) -> dict[str, dict[str, float]]:
    """False promotions and power with other priors for the noise model (gate.BASE_DOF pseudo-pairs at
    phi = 1): how much the chosen constant decides."""
    out = {}
    for prior in PRIORS:
        fp = max(resample(pool, f"null-{s}", k, False, n, level, 11 * k, prior) for s in ("lo", "hi"))
        power = resample(pool, "null-lo", k, True, n, level, 13 * k, prior)
        out[str(prior)] = {"false_promotion_rate": fp, "power": power}
    return out


def real_null_trials(cfg: RunConfig, work: Path, n: int, k: int) -> list[dict]:
    """n trials through the loop's own stages (race.trial, decide.gate_stage) on fresh arms, with null
    candidates. Each is a cell: a run directory that keeps its ledger."""
    out = []
    for i in range(n):
        out.append(real_null_trial(cfg, work, i, k))
        note = "PROMOTED" if out[-1]["promoted"] else "no promotion"
        print(f"real null trial {i}: {note} (finalist {out[-1]['finalist']})", flush=True)
    return out


def real_null_trial(cfg: RunConfig, work: Path, i: int, k: int) -> dict:
    # Without an overlong buffer the overlong penalty's factor changes nothing: a null intervention.
    null = Intervention(
        kind="set_knob",
        target="shaping.overlong_penalty_factor",
        value=0.5,
        hypothesis=Hypothesis(finding="explore", signal="heldout/accuracy", direction="up"),
    )
    # The first OWN_BASES trials each start from their own warm-started base (run seed 5000 + i: another base
    # and task split); the rest share the main job's base and move their arms' seeds by the mainline's
    # attempt counter (what a rollback does), because a warm start per trial costs 700 steps.
    own = i < OWN_BASES
    run = cfg.run.model_copy(
        update={"name": f"real-null-{i}", "out_dir": work / "real", "seed": 5000 + i if own else cfg.run.seed}
    )
    c = cfg.model_copy(
        update={"run": run, "loop": cfg.loop.model_copy(update={"candidates": k, "max_trial_share": 1.0})}
    )
    ctx = start.open_run(c, resume=(work / "real" / run.name / "ledger.sqlite").exists())
    head = run_stage(ctx, 0, "start", StartResult, lambda: start.start(ctx, lambda *_: None)).head
    head = head if own else head.model_copy(update={"attempt": 1 + i})
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
    survivors = [Survivor(Proposal(null.bind(head.harness), "explore"), None) for _ in range(k)]
    tried = run_stage(ctx, 1, "trial", TrialResult, lambda: race_stage.trial(ctx, 1, head, seg, survivors, []))
    gated = run_stage(
        ctx, 1, "gate", GateResult, lambda: decide.gate_stage(ctx, 1, head, head.suite, tried, survivors, [])
    )
    ctx.ledger.close()
    return {
        "trial": i,
        "candidates": k,
        "promoted": any(v.decision == "promote" for v in gated.verdicts),
        "finalist": tried.finalist,
        "verdicts": [v.model_dump() for v in gated.verdicts],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gate_calibration", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "math.yaml"))
    ap.add_argument("--nulls", type=int, default=24, help="null arms per start")
    ap.add_argument("--lr-arms", type=int, default=16)
    ap.add_argument("--real-trials", type=int, default=20)
    ap.add_argument("--resamples", type=int, default=4000)
    ap.add_argument("--work", default=str(scratch("evotrainer-gate-calibration")), help="arms (scratch)")
    ap.add_argument("--out", type=Path, default=RESULTS / "gate_calibration.json")
    args = ap.parse_args(argv)
    work = Path(args.work)
    cfg = load_config(args.config, {"run.name": "gate-calibration", "run.out_dir": str(work.parent)})
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"out_dir": work.parent, "name": work.name})})
    t0 = time.perf_counter()
    pool = pools(Cells(cfg, work), args.nulls, args.lr_arms)
    level, rows = cfg.gate.level, []
    real = real_null_trials(cfg, work, args.real_trials, 1)
    for k in (1, 2, 4):
        rates = {s: resample(pool, f"null-{s}", k, False, args.resamples, level, 11 * k) for s in ("lo", "hi")}
        rows.append(
            {
                "candidates": k,
                "false_promotion_rate": max(rates.values()),
                "nominal": round(1 - level, 4),
                "power": resample(pool, "null-lo", k, True, args.resamples, level, 13 * k),
                "null_trials": args.resamples * 2,
                "real_null_trials": len(real) if k == 1 else 0,
                "false_promotion_rate_by_start": rates,
                "real_null_promotions": sum(r["promoted"] for r in real) if k == 1 else None,
                "prior_pairs": gate.BASE_DOF,
                "steps_run": {
                    "null-lo": steps_run(pool, "null-lo", "null-lo", cfg.loop.trial_steps),
                    "null-hi": steps_run(pool, "null-hi", "null-hi", cfg.loop.trial_steps),
                    "lr-fix": steps_run(pool, "null-lo", "lr-fix", cfg.loop.trial_steps),
                },
                "sensitivity": sensitivity(pool, k, args.resamples, level),
            }
        )
    write_result(args.out, rows, work=work, configs=[args.config])
    acc = {kind: [round(a["acc"], 3) for a in arms] for kind, arms in pool.items()}
    print(f"\narms: {json.dumps(acc)}\n{time.perf_counter() - t0:.0f} s\n")
    header = ["K", "false promotions per round (lo / hi start)", "nominal", "power (learning-rate fix)"]
    lines = []
    for r in rows:
        lo, hi = r["false_promotion_rate_by_start"]["lo"], r["false_promotion_rate_by_start"]["hi"]
        lines.append(
            [
                r["candidates"],
                f"{r['false_promotion_rate']:.3f} ({lo:.3f} / {hi:.3f})",
                f"{r['nominal']:.2f}",
                f"{r['power']:.3f}",
            ]
        )
    print(markdown_table(header, lines))
    print(f"\nshare of a trial's steps run (null-lo, null-hi, lr-fix): {rows[0]['steps_run']}")
    print(
        f"\nreal null trials (K=1, the loop's own stages): {sum(r['promoted'] for r in real)} promoted of {len(real)}"
    )


if __name__ == "__main__":
    main()
