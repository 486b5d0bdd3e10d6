"""How a claims arm trains: a static arm (the harness unchanged until the budget is spent) and a loop arm
(the co-evolution loop, read back from its ledger through the stage records)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rich.console import Console

from evotrainer.backtest.trial import ArmSpec, run_arm
from evotrainer.config import RunConfig
from evotrainer.envs.registry import make_domain, warm_start_key
from evotrainer.loop import run_loop
from evotrainer.policies import load_policy
from evotrainer.skills.library import SkillLibrary
from evotrainer.stages.results import (
    FinalResult,
    GuardResult,
    Mainline,
    PromoteResult,
    ProposeResult,
    ReplayResult,
    TrialResult,
    read_stage,
)
from evotrainer.store.ledger import Ledger
from evotrainer.training.grpo import GRPOTrainer
from evotrainer.training.run import seed_everything

# Static-arm steps per arm call (each arm is resumable). The last one stops at the step that reaches the budget
# (ArmSpec.tokens), not at a chunk boundary: a whole chunk past it gave static arms up to a quarter more tokens
# than the loop (SWE with dynamic sampling: 186k for a 150k budget), which the loop never gets.
CHUNK = 10


def base_checkpoint(cfg: RunConfig) -> Path:
    """The run's warm-started base, saved under its run directory (built once: the trainer saves a checkpoint whole
    or not at all)."""
    base = Path(cfg.run.out_dir) / cfg.run.name / "checkpoints" / "base"
    if not base.exists():
        seed_everything(cfg)
        domain = make_domain(cfg)
        GRPOTrainer(
            load_policy(cfg.policy, domain, cfg.run.seed, warm_start_key(cfg, domain), log=lambda *_: None),
            cfg.harness,
        ).save(base)
    return base


def static_arm(cfg: RunConfig, tokens: int) -> dict[str, Any]:
    """Train the harness unchanged from the warm-started base until `tokens` are generated."""
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    checkpoint, steps, gen = train_static(cfg, run_dir, str(base_checkpoint(cfg)), tokens)
    return {"checkpoint": checkpoint, "steps": steps, "generated_tokens": gen, "promoted": [], "trajectory": []}


def train_static(cfg: RunConfig, run_dir: Path, start: str, tokens: int) -> tuple[str, int, int]:
    """(checkpoint, steps, generated tokens) of the config's harness trained from `start` in arms of at most
    CHUNK steps until `tokens` are generated (the step that reaches them is the last); a finished arm is reused
    on a rerun (same spec), so this resumes."""
    step, gen = 1, 0
    while gen < tokens:
        r = run_arm(
            ArmSpec(
                branch=f"static-{step:06d}",
                role="segment",
                run_dir=str(run_dir),
                config=cfg.model_dump(mode="json"),
                harness=cfg.harness.model_dump(mode="json"),
                start=start,
                seed=cfg.run.seed,
                first_step=step,
                steps=CHUNK,
                tokens=tokens - gen,
            )
        )
        gen += r.generated_tokens
        start, step = r.checkpoint, r.last_step + 1
    return start, step - 1, gen


def loop_arm(cfg: RunConfig, warm_from: list[Path]) -> dict[str, Any]:
    """A loop run, started (not resumed) with the libraries `warm_from` merged into its own."""
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    resume = (run_dir / "ledger.sqlite").exists()
    for lib in [] if resume else warm_from:
        SkillLibrary(cfg.loop.skills_dir).merge(SkillLibrary(lib))
    run_loop(cfg, Console(file=io.StringIO()), resume=resume)
    return read_loop(cfg)


def read_loop(cfg: RunConfig) -> dict[str, Any]:
    """What a finished loop run did, from its ledger: the final head, rounds, spend, promotions, where each
    planted candidate stopped, and the mainline's checkpoint after each round (with the tokens spent so far)."""
    ledger = Ledger(Path(cfg.run.out_dir) / cfg.run.name / "ledger.sqlite")
    final: FinalResult = read_stage(ledger, 0, "final")
    # A run that ended inside a round counts it since d5ab3a1 (one fewer in ledgers from before): one round
    # past the count is read too. A round's head is the guard stage's (it may have sent the mainline back), or in a
    # ledger from before the guard the promote stage's, none where the trial was abandoned.
    heads = [(rnd, h) for rnd in range(1, final.rounds + 2) if (h := _round_head(ledger, rnd)) is not None]
    spent = spent_by_round(ledger)
    trials = {t["id"]: t for t in ledger.trials()}
    promoted = [
        {"round": v["round"], "source": trials[v["trial"]]["source"], **trials[v["trial"]]["intervention"]}
        for v in ledger.verdicts()
        if v["decision"] == "promote"
    ]
    planted = [{"round": rnd, "outcome": planted_outcome(ledger, rnd)} for rnd in range(1, len(cfg.loop.planted) + 1)]
    invalid = [v for v in ledger.verdicts() if v["decision"] != "promote" and v["findings"]]
    total = ledger.spent().generated_tokens
    return {
        "checkpoint": final.head.checkpoint,
        "rounds": final.rounds,
        "stop_reason": final.stop_reason,
        "generated_tokens": total,
        "promoted": promoted,
        "rejected_with_findings": len(invalid),
        "planted": planted,
        # (tokens spent through round r, the mainline's checkpoint after round r), then the final head:
        # for the skills read
        "trajectory": [(sum(g for k, g in spent.items() if k <= rnd), h.checkpoint) for rnd, h in heads]
        + [(total, final.head.checkpoint)],
    }


def _round_head(ledger: Ledger, rnd: int) -> Mainline | None:
    for stage, model in (("guard", GuardResult), ("promote", PromoteResult)):
        if isinstance(done := read_stage(ledger, rnd, stage), model):
            return done.head
    return None


def spent_by_round(ledger: Ledger) -> dict[int, int]:
    """Generated tokens charged by round (round 0: the start and the final read). The ledger's readers total
    its charges or group them by stage, not by round: this is the one query of its own the claims make."""
    rows = ledger.rows("SELECT round, sum(generated_tokens) AS g FROM charges GROUP BY round")
    return {r["round"]: r["g"] for r in rows}


def planted_outcome(ledger: Ledger, rnd: int) -> str:
    """Where round `rnd`'s planted candidate stopped: screened out, dropped by the replay, not raced,
    or the verdict (promote / reject, with the reasons)."""
    proposals: ProposeResult | None = read_stage(ledger, rnd, "propose")
    if proposals is None:
        return "round not run"
    idx = next((i for i, p in enumerate(proposals.proposals) if p.source == "planted"), None)
    if idx is None:
        return "refused by the screen"
    replay: ReplayResult = read_stage(ledger, rnd, "replay")
    if any(d.index == idx for d in replay.dropped):
        return "dropped by the replay: " + next(d.why for d in replay.dropped if d.index == idx)
    trial = next((t for t in ledger.trials() if t["round"] == rnd and t["source"] == "planted"), None)
    if trial is None:
        why: TrialResult | None = read_stage(ledger, rnd, "trial")
        return f"not raced: {why.abandoned if why is not None and why.abandoned else 'the race size'}"
    verdict = next((v for v in ledger.verdicts() if v["trial"] == trial["id"]), None)
    return "no verdict" if verdict is None else f"{verdict['decision']}: {verdict['reasons']}"
