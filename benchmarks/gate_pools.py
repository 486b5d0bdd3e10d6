"""Real arms for the gate's calibration: per domain and base, null arms and fix arms trained from one start.

A pool is one base (a warm-started policy of its own seed, with its own held-out split) trained one segment
under the domain's example harness: that checkpoint is the round's start. From it, trials as the loop runs them
now (loop.trial_unit tokens: every arm trains to the tokens trial_steps of the segment's steps generated; the
race's checkpoints at equal fractions of them): null arms (the start's own harness on other seeds: what a
candidate that changes nothing is) and fix arms (the domain's known-good change, FIXES). Every arm is read on
the gate tasks at the race's checkpoints and at its end; the first null arm also reads the start (mark 0).

Each arm is a resumable cell (its arm.json, reused only under the same spec): pools build over several sittings.
benchmarks/gate_calibration.py resamples them through the gate's own functions.
"""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.paths import ROOT
from evotrainer.backtest.trial import ArmResult, ArmSpec, run_arm
from evotrainer.config import RunConfig, load_config
from evotrainer.envs.registry import make_domain, warm_start_key
from evotrainer.harness.harness import Harness
from evotrainer.policies import load_policy
from evotrainer.stages.context import split_heldout
from evotrainer.stages.race import checkpoints
from evotrainer.training.grpo import GRPOTrainer

# Each domain's example config, the learning rate its start trains at, and the change known to help there. Both
# start as the README main job does, with a learning rate copied from a larger model: math's 1e-5, which its
# reference and tuning sweep raise to 1e-4; digits (multi-turn tool use) learns in a jump: from 0.09 on the gate
# tasks, one 10-step segment at its example's 5e-4 reaches 0.98 and every arm 1.0 (nothing to tell apart), and
# arms at 5e-5 reach 1.0 too; at 1.5e-5 they stay at 0.09, at 3e-5 they reach 0.27. So its start trains at
# 5e-6 and the fix is 3e-5. Digits' arms train on one torch thread (`threads`), so that two more one-thread jobs
# share the two cores.
DOMAINS = {
    "math": (ROOT / "examples" / "math.yaml", 1e-5, 1e-4),
    "digits": (ROOT / "examples" / "digits.yaml", 5e-6, 3e-5),
}
THREADS = {"digits": 1}
BASE_SEEDS = (11, 12, 13)
NULL_SEED, FIX_SEED = 1000, 2000


def with_lr(h: Harness, lr: float) -> Harness:
    return h.model_copy(update={"optimizer": h.optimizer.model_copy(update={"learning_rate": lr})})


def domain_config(domain: str, seed: int, work: Path) -> RunConfig:
    path, start_lr, _ = DOMAINS[domain]
    sets = {"harness.optimizer.learning_rate": start_lr}
    if domain in THREADS:
        sets["run.threads"] = THREADS[domain]
    return load_config(path, {"run.name": f"{domain}-{seed}", "run.out_dir": str(work), "run.seed": seed, **sets})


class Cells:
    """One base's arms, each trained once (run_arm reuses a finished one under the same spec)."""

    def __init__(self, cfg: RunConfig, work: Path):
        self.cfg, self.work = cfg, work / cfg.run.name
        domain = make_domain(cfg)
        self.gate_ids, _ = split_heldout(
            [t.id for t in domain.tasks("heldout")], cfg.gate.final_fraction, cfg.run.seed
        )
        self.base = self.work / "checkpoints" / "base"
        if not (self.base / "optimizer.pt").exists():
            policy = load_policy(cfg.policy, domain, cfg.run.seed, warm_start_key(cfg, domain))
            GRPOTrainer(policy, cfg.harness).save(self.base)

    def arm(self, name: str, harness: Harness, start: Path, first: int, seed: int, **kw) -> ArmResult:
        loop = self.cfg.loop
        spec = ArmSpec(
            branch=name,
            role="candidate",
            run_dir=str(self.work),
            config=self.cfg.model_dump(mode="json"),
            harness=harness.model_dump(mode="json"),
            start=str(start),
            seed=seed,
            first_step=first,
            steps=kw.pop("steps", loop.trial_steps * 4),
            **kw,
        )
        return run_arm(spec)

    def segment(self) -> ArmResult:
        seg = self.cfg.loop.segment_steps
        return self.arm("start", self.cfg.harness, self.base, 1, self.cfg.run.seed, steps=seg)


def build(domain: str, seed: int, work: Path, n_null: int, n_fix: int, log=print) -> dict:
    """The pool of one base (cells reused where finished): {domain, base_seed, start (the start's gate outcomes),
    nulls, fixes}, each arm {curve: gate outcomes by checkpoint mark, final: gate outcomes at its end}."""
    cfg = domain_config(domain, seed, work)
    cells = Cells(cfg, work)
    seg = cells.segment()
    start, first = Path(seg.checkpoint), seg.last_step + 1
    per_step = seg.generated_tokens // max(1, seg.last_step - seg.first_step + 1)
    tokens = per_step * cfg.loop.trial_steps
    marks = checkpoints(tokens, cfg.loop.race_checkpoints)
    fix = with_lr(cfg.harness, DOMAINS[domain][2])
    common = {"gate_ids": tuple(cells.gate_ids), "tokens": tokens}
    pool, start_read = {"domain": domain, "base_seed": seed, "start": {}, "nulls": [], "fixes": []}, None
    for kind, harness, n, seed0 in (("null", cfg.harness, n_null, NULL_SEED), ("fix", fix, n_fix, FIX_SEED)):
        for i in range(n):
            t0 = time.perf_counter()
            at = ((0,) if start_read is None else ()) + marks
            r = cells.arm(f"{kind}-{i}", harness, start, first, seed0 + i, checkpoints=at, **common)
            curve = dict(r.checkpoint_outcomes)
            start_read = curve.pop("0", start_read)
            pool["nulls" if kind == "null" else "fixes"].append({"curve": curve, "final": r.outcomes})
            log(f"{domain} base {seed} {kind}-{i}: {r.accuracy:.3f} ({time.perf_counter() - t0:.0f} s)")
    pool["start"] = start_read or {}
    return pool


def build_all(work: Path, domains: list[str], seeds: list[int], n_null: int, n_fix: int, log=print) -> list[dict]:
    """Every pool, one base after another (a sitting that ends keeps the finished arms)."""
    return [build(d, s, work, n_null, n_fix, log) for d in domains for s in seeds]
