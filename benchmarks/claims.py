"""The paper's claims, measured: the loop against a human-engineered reference harness, per domain.

Four arms per domain and seed, one total budget of generated tokens for each (the loop's trials, A-A
controls and gate evaluations all count against it; a static arm spends all of it on training):

- static_default: the domain's example config (examples/<domain>.yaml), trained unchanged;
- static_reference: the human-engineered reference (examples/reference/<domain>.yaml), trained unchanged;
- loop_default / loop_reference: the co-evolution loop started from each, with an empty skill library;
- loop_default_warm: loop_default again, starting with the skill library loop_default left (skills);
- planted: a three-round loop from the default with invalid interventions planted, one a round;
- base: the warm-started policy untrained, for scale.

Every arm is read on the same fresh tasks: drawn under another seed, minus every question the seed put in
its train or held-out split, so no policy trained on them and no gate read them (benchmarks/fresh_read.py).
Each (domain, arm, seed) is a resumable cell writing benchmarks/results/claims/<domain>-<arm>-<seed>.json
(a finished cell is skipped; an unfinished loop resumes from its ledger), so the grid runs over sittings:

    .venv/bin/python benchmarks/claims.py cell math loop_default 1      # one cell
    .venv/bin/python benchmarks/claims.py grid --domains math --seeds 1 2 3
    .venv/bin/python benchmarks/claims.py aggregate       # -> benchmarks/results/claims.json and the table
    .venv/bin/python benchmarks/claims.py sweep math --lr 0 3e-5 1e-4 3e-4 1e-3   # the human's tuning (0: base)

The sweep is the reference's tuning: static_reference at each learning rate on TUNING_SEED, read on
tasks that no benchmark seed trains on, is gated on or is read on.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evotrainer.backtest.trial import ArmSpec, run_arm  # noqa: E402
from evotrainer.config import RunConfig, load_config  # noqa: E402
from evotrainer.envs.registry import domain_key, make_domain  # noqa: E402
from evotrainer.evaluation import evaluate  # noqa: E402
from evotrainer.loop import run_loop  # noqa: E402
from evotrainer.policies import load_policy  # noqa: E402
from evotrainer.policies.hf import HFPolicy  # noqa: E402
from evotrainer.stages.results import FinalResult, PromoteResult, read_stage  # noqa: E402
from evotrainer.store.ledger import Ledger  # noqa: E402
from evotrainer.training.grpo import GRPOTrainer  # noqa: E402
from evotrainer.training.run import seed_everything  # noqa: E402

ROOT = Path(__file__).resolve().parent
CELLS = ROOT / "results" / "claims"
# SWE is measured on the long-horizon level (issue #14 item 2): examples/swe_long.yaml and its reference.
DOMAINS = {
    "math": ("examples/math.yaml", "examples/reference/math.yaml"),
    "code": ("examples/code.yaml", "examples/reference/code.yaml"),
    "swe": ("examples/swe_long.yaml", "examples/reference/swe_long.yaml"),
}
ARMS = ("static_default", "static_reference", "loop_default", "loop_reference", "loop_default_warm", "planted", "base")
# `base`: the warm-started policy itself, untrained, read on the same tasks: whether RL helped at all.
PLANTED_ROUNDS = 3
# Each domain's cells beyond its example config: a token budget and loop lengths that fit two cores (the
# issue leaves budget sizes to us). Math keeps examples/math.yaml's (1M tokens, 10-step segments, 20-step
# trials, a quarter of the budget for arms that end discarded). A code step costs 4k tokens and ~8 s on one
# core, an SWE step 1.5k tokens and ~12 s (its episodes run tests), several times math's, so their trials
# are 10 steps and the budgets are small: 400k and 150k tokens, about 95 and 100 steps of a static arm. At
# those the default quarter cannot pay for round 1's trial when the segment was tainted (its 10 steps are
# discarded: the arms fork from before it) plus a race and a confirmation, so loop.max_trial_share is a half
# for code and 0.6 for SWE (measured on SWE seed 1: a tainted 17k-token segment, half a 17k arm for the race
# and three for the confirmation make 76.5k, just over the half's 75k, so at 0.5 the loop never tried the
# remedy it proposed). The examples' round caps (two- and three-round demos) give way to the budget. One
# torch thread a cell, so that two cells share the two cores.
DOMAIN_SETS: dict[str, dict] = {
    "math": {"run.threads": 1},
    "code": {
        "budget.generated_tokens": 400_000,
        "loop.max_rounds": 0,
        "loop.segment_steps": 10,
        "loop.trial_steps": 10,
        "loop.max_trial_share": 0.5,
        "run.threads": 1,
    },
    "swe": {
        "budget.generated_tokens": 150_000,
        "loop.max_rounds": 0,
        "loop.segment_steps": 10,
        "loop.trial_steps": 10,
        "loop.max_trial_share": 0.6,
        "run.threads": 1,
    },
}


def _exploit(kind: str, target: str, value: object, finding: str) -> dict:
    return {
        "kind": kind,
        "target": target,
        "value": value,
        "hypothesis": {"finding": finding, "signal": "reward", "direction": "up"},
    }


# Invalid branches planted into a short loop from the default harness (loop.planted, one a round): each
# pays for what the evaluator's audit rejects. The gate must promote none.
PLANTED = {
    # contains_answer (math's built-in lenient grader) changes no advantage on a warm-started policy's
    # rollouts: its wrong answers rarely hold the gold one inside them, so the replay drops it as a no-op.
    # benchmarks/plants.py's loose tolerance pays near misses, which such a policy makes all the time.
    "math": [
        _exploit("replace_reward_term", "reward_weights.correct", "loose_tolerance", "plateau"),
        _exploit("set_reward_weight", "reward_weights.loose_tolerance", 1.0, "plateau"),
        _exploit("set_reward_weight", "reward_weights.format", 1.0, "plateau"),
    ],
    "code": [  # the visible examples pay hard-coded answers; format pays any well-formed completion
        _exploit("set_reward_weight", "reward_weights.visible", 1.0, "plateau"),
        _exploit("replace_reward_term", "reward_weights.correct", "visible", "plateau"),
        _exploit("set_reward_weight", "reward_weights.format", 1.0, "plateau"),
    ],
    "swe": [  # format pays valid commands whether or not they fix anything; `correct` trusts edited tests
        _exploit("set_reward_weight", "reward_weights.format", 1.0, "plateau"),
        _exploit("replace_reward_term", "reward_weights.tests", "correct", "plateau"),
        _exploit("set_reward_weight", "reward_weights.correct", 1.0, "plateau"),
    ],
}
# Reward terms the planted arm adds (env.reward_functions) so that its plants have something to weight.
PLANTED_TERMS = {"math": {"loose_tolerance": "benchmarks.plants:loose_tolerance"}}
SEEDS = (1, 2, 3)
TUNING_SEED = 100  # the sweep's seed: no benchmark seed
FRESH_SEED = 104_729  # the seed the read tasks are drawn under
READ_TASKS = {"math": 1000, "code": 1000, "swe": 400}  # an SWE read runs up to 12 turns of tests a task
# Static-arm steps per arm call (each arm is resumable). The last one stops at the step that reaches the budget
# (ArmSpec.tokens), not at a chunk boundary: a whole chunk past it gave static arms up to a quarter more tokens
# than the loop (SWE with dynamic sampling: 186k for a 150k budget), which the loop never gets.
CHUNK = 10


def arm_config(domain: str, arm: str, seed: int, work: Path, sets: dict) -> RunConfig:
    path = DOMAINS[domain][1 if arm.endswith("reference") else 0]
    name = f"{domain}-{arm}-{seed}"
    sets = {**DOMAIN_SETS.get(domain, {}), **sets}
    if arm == "planted":
        # The trial share and the budget are the search's economy, not what this arm measures: every planted
        # one is raced, in its own round (code's and SWE's token budgets hold fewer than three rounds).
        sets = {
            **sets,
            "loop.planted": PLANTED[domain],
            "loop.max_rounds": PLANTED_ROUNDS,
            "loop.max_trial_share": 1.0,
            "budget.generated_tokens": 0,
            **({"env.reward_functions": PLANTED_TERMS[domain]} if domain in PLANTED_TERMS else {}),
        }
    # Seconds never decide here (budget.seconds 0): the grid runs beside other jobs, and a load-dependent
    # stop would make the cells depend on the machine's load. Tokens decide, as in the paper's budget.
    over = {"run.seed": seed, "run.name": name, "run.out_dir": str(work), "budget.seconds": 0, **sets}
    over["loop.skills_dir"] = str(work / "skills" / name)
    return load_config(ROOT.parent / path, over)


def task_key(t) -> tuple[str, str]:
    """A task's identity across draws: its prompt and the answer it is checked against. An SWE prompt names
    only the failing test; the repository, digested in its answer, is what differs."""
    return t.prompt, str(t.data.get("answer"))


_READS: dict[str, list] = {}


def read_tasks(cfg: RunConfig) -> list:
    """READ_TASKS fresh tasks: none in the train or held-out split of cfg's seed (drawn once a process)."""
    key = domain_key(cfg)
    if key not in _READS:
        d = make_domain(cfg)
        seen = {task_key(t) for split in ("train", "heldout") for t in d.tasks(split)}
        n = READ_TASKS[cfg.env.domain]
        fresh = cfg.model_copy(
            update={
                "run": cfg.run.model_copy(update={"seed": FRESH_SEED}),
                "eval": cfg.eval.model_copy(update={"heldout_size": 3 * n}),
            }
        )
        _READS[key] = [t for t in make_domain(fresh).tasks("heldout") if task_key(t) not in seen][:n]
    return _READS[key]


def static_arm(cfg: RunConfig, tokens: int) -> dict:
    """Train the harness unchanged from the warm-started base until `tokens` are generated."""
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    base = run_dir / "checkpoints" / "base"
    if not base.exists():  # the trainer saves a checkpoint whole or not at all
        seed_everything(cfg)
        domain = make_domain(cfg)
        GRPOTrainer(load_policy(cfg, domain, log=lambda *_: None), cfg.harness).save(base)
    checkpoint, steps, gen = train_static(cfg, run_dir, str(base), tokens)
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


def loop_arm(cfg: RunConfig, warm_from: str | None) -> dict:
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    resume = (run_dir / "ledger.sqlite").exists()
    if warm_from and not resume and Path(warm_from).exists():  # a cold run that promoted nothing left none
        shutil.copytree(warm_from, cfg.loop.skills_dir, dirs_exist_ok=True)
    run_loop(cfg, Console(file=io.StringIO()), resume=resume)
    ledger = Ledger(run_dir / "ledger.sqlite")
    rows = ledger.rows("SELECT round, stage, result FROM stages WHERE stage IN ('promote', 'final') ORDER BY round")
    final = FinalResult.model_validate_json(next(r["result"] for r in rows if r["stage"] == "final"))
    spent = {
        r["round"]: r["g"] for r in ledger.rows("SELECT round, sum(generated_tokens) g FROM charges GROUP BY round")
    }
    heads = [
        (r["round"], PromoteResult.model_validate_json(r["result"]).head) for r in rows if r["stage"] == "promote"
    ]
    trials = {t["id"]: t for t in ledger.trials()}
    promoted = [
        {"round": v["round"], "source": trials[v["trial"]]["source"], **trials[v["trial"]]["intervention"]}
        for v in ledger.verdicts()
        if v["decision"] == "promote"
    ]
    planted = [{"round": rnd, "outcome": planted_outcome(ledger, rnd)} for rnd in range(1, len(cfg.loop.planted) + 1)]
    invalid = [v for v in ledger.verdicts() if v["decision"] != "promote" and v["findings"]]
    return {
        "checkpoint": final.head.checkpoint,
        "rounds": final.rounds,
        "stop_reason": final.stop_reason,
        "generated_tokens": ledger.spent().generated_tokens,
        "promoted": promoted,
        "rejected_with_findings": len(invalid),
        "planted": planted,
        # (tokens spent through round r, the mainline's checkpoint after round r), then the final head:
        # for the skills read
        "trajectory": [(sum(g for k, g in spent.items() if k <= rnd), h.checkpoint) for rnd, h in heads]
        + [(ledger.spent().generated_tokens, final.head.checkpoint)],
    }


def planted_outcome(ledger: Ledger, rnd: int) -> str:
    """Where round `rnd`'s planted candidate stopped: screened out, dropped by the replay, not raced,
    or the verdict (promote / reject, with the reasons)."""
    proposals = read_stage(ledger, rnd, "propose")
    if proposals is None:
        return "round not run"
    idx = next((i for i, p in enumerate(proposals.proposals) if p.source == "planted"), None)
    if idx is None:
        return "refused by the screen"
    replay = read_stage(ledger, rnd, "replay")
    if any(d.index == idx for d in replay.dropped):
        return "dropped by the replay: " + next(d.why for d in replay.dropped if d.index == idx)
    trial = next((t for t in ledger.trials() if t["round"] == rnd and t["source"] == "planted"), None)
    if trial is None:
        why = read_stage(ledger, rnd, "trial")
        return f"not raced: {why.abandoned if why is not None and why.abandoned else 'the race size'}"
    verdict = next((v for v in ledger.verdicts() if v["trial"] == trial["id"]), None)
    return "no verdict" if verdict is None else f"{verdict['decision']}: {verdict['reasons']}"


def run_cell(domain: str, arm: str, seed: int, work: Path, sets: dict) -> dict:
    out = CELLS / f"{domain}-{arm}-{seed}.json"
    if out.exists():
        return json.loads(out.read_text())
    cfg = arm_config(domain, arm, seed, work, sets)
    t0 = time.perf_counter()
    if arm.startswith("static") or arm == "base":
        res = static_arm(cfg, 0 if arm == "base" else cfg.budget.generated_tokens)
    else:
        warm = None
        if arm == "loop_default_warm":
            cold = arm_config(domain, "loop_default", seed, work, sets)
            run_cell(domain, "loop_default", seed, work, sets)
            warm = cold.loop.skills_dir
        res = loop_arm(cfg, warm)
    tasks = read_tasks(cfg)
    ev = evaluate(HFPolicy.load(res["checkpoint"]), make_domain(cfg), tasks, cfg.eval)
    cell = {
        "domain": domain,
        "arm": arm,
        "seed": seed,
        "budget_tokens": cfg.budget.generated_tokens,
        "accuracy": ev.accuracy,
        "outcomes": ev.outcomes,
        "evaluator_hash": ev.evaluator_hash,
        "seconds": time.perf_counter() - t0,
        "overrides": {**DOMAIN_SETS.get(domain, {}), **sets},
        **{k: v for k, v in res.items() if k != "trajectory"},
    }
    if arm in ("loop_default", "loop_default_warm"):  # the skills read: each round's mainline on the same tasks
        cell["trajectory"] = [
            (tok, evaluate(HFPolicy.load(ck), make_domain(cfg), tasks, cfg.eval).accuracy)
            for tok, ck in res["trajectory"]
        ]
    CELLS.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(cell, indent=1, default=str))
    tmp.rename(out)  # a cell is done only once whole
    print(f"{domain} {arm} seed {seed}: accuracy {ev.accuracy:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return cell


# -- aggregation ----------------------------------------------------------------------------------------
def paired_interval(a: list[dict], b: list[dict], n_boot: int = 4000, seed: int = 0) -> dict:
    """Mean accuracy difference a - b over seeds, with a 95% interval from a two-level bootstrap:
    seeds resampled, then tasks within each seed (both sources of variation, paired by task)."""
    diffs = []
    for ca, cb in zip(a, b, strict=True):
        ids = sorted(set(ca["outcomes"]) & set(cb["outcomes"]))
        diffs.append(np.array([float(ca["outcomes"][i]) - float(cb["outcomes"][i]) for i in ids]))
    rng = np.random.default_rng(seed)
    boot = np.empty(n_boot)
    for k in range(n_boot):
        picked = rng.integers(len(diffs), size=len(diffs))
        boot[k] = np.mean([diffs[j][rng.integers(len(diffs[j]), size=len(diffs[j]))].mean() for j in picked])
    return {
        "delta": float(np.mean([d.mean() for d in diffs])),
        "ci_low": float(np.quantile(boot, 0.025)),
        "ci_high": float(np.quantile(boot, 0.975)),
    }


def planted_counts(cells: list[dict]) -> dict:
    outcomes = [p["outcome"] for c in cells for p in c["planted"]]
    return {
        "invalid_planted": len(outcomes),
        "invalid_promoted": sum(o.startswith("promote") for o in outcomes),
        "invalid_outcomes": outcomes,
    }


def tokens_to_reach(trajectory: list, target: float) -> int | None:
    return next((int(tok) for tok, acc in trajectory if acc >= target), None)


def aggregate() -> dict:
    cells = [json.loads(p.read_text()) for p in sorted(CELLS.glob("*.json"))]
    by = {(c["domain"], c["arm"], c["seed"]): c for c in cells}
    out: dict = {}
    for domain in DOMAINS:
        seeds = sorted({s for (d, a, s) in by if d == domain and a in ARMS[:4]})
        full = [s for s in seeds if all((domain, a, s) in by for a in ARMS[:4])]
        if not full:
            continue
        arms = {a: [by[domain, a, s]["accuracy"] for s in full] for a in ARMS[:4]}
        arms["base"] = [by[domain, "base", s]["accuracy"] if (domain, "base", s) in by else None for s in full]
        read = [by[domain, a, s] for a in (*ARMS[:4], "base") for s in full if (domain, a, s) in by]
        out[domain] = {
            "budget_tokens": by[domain, "loop_default", full[0]]["budget_tokens"],
            "seeds": full,
            # Arms are compared task by task, so they must have been read by one evaluator (its code, settings
            # and data): more than one hash here means some cells are stale and must be run again.
            "evaluator_hashes": sorted({c["evaluator_hash"] for c in read}),
            **arms,
            "loop_default_vs_reference": paired_interval(
                [by[domain, "loop_default", s] for s in full], [by[domain, "static_reference", s] for s in full]
            ),
            "loop_reference_vs_reference": paired_interval(
                [by[domain, "loop_reference", s] for s in full], [by[domain, "static_reference", s] for s in full]
            ),
            # The "gain over the reference": the loop's mean accuracy over the reference's.
            "loop_default_over_reference": float(np.mean(arms["loop_default"]) / np.mean(arms["static_reference"])),
            "promoted": {
                a: [{"seed": s, **p} for s in full for p in by[domain, a, s]["promoted"]]
                for a in ("loop_default", "loop_reference")
            },
            **planted_counts([by[domain, "planted", s] for s in full if (domain, "planted", s) in by]),
        }
    warm = [(by[d, "loop_default", s], by[d, "loop_default_warm", s]) for (d, a, s) in by if a == "loop_default_warm"]
    if warm:
        pairs = [
            {
                "domain": cold["domain"],
                "seed": cold["seed"],
                "cold_final": cold["accuracy"],
                "cold_tokens": tokens_to_reach(cold["trajectory"], cold["accuracy"]),
                "warm_tokens": tokens_to_reach(hot["trajectory"], cold["accuracy"]),
            }
            for cold, hot in warm
        ]
        reached = [p for p in pairs if p["warm_tokens"] is not None]  # a warm run that never reached it: none
        out["skills"] = {
            "cold_tokens": sum(p["cold_tokens"] for p in pairs),
            "warm_tokens": sum(p["warm_tokens"] for p in reached) if len(reached) == len(pairs) else None,
            "pairs": pairs,
        }
    (CELLS.parent / "claims.json").write_text(json.dumps(out, indent=1))
    return out


def table(out: dict) -> str:
    """The main table as Markdown: each arm's mean accuracy (per seed in brackets), the loop's difference from
    the reference with its interval, the promotions and the plants."""
    rows = [
        "| domain | base | static default | static reference | loop from default | loop from reference "
        "| loop default - reference [95%] | loop default / reference | planted (promoted) |",
        "|" + "---|" * 9,
    ]

    def cell(xs: list) -> str:
        if any(x is None for x in xs):
            return "-"
        return f"{np.mean(xs):.3f} ({' / '.join(f'{x:.3f}' for x in xs)})"

    for domain in DOMAINS:
        if domain not in out:
            continue
        d, iv = out[domain], out[domain]["loop_default_vs_reference"]
        if len(d["evaluator_hashes"]) > 1:
            rows.append(f"| {domain} | read by {len(d['evaluator_hashes'])} evaluators: stale cells, not compared |")
            continue
        rows.append(
            f"| {domain} | {cell(d['base'])} | {cell(d['static_default'])} | {cell(d['static_reference'])} "
            f"| {cell(d['loop_default'])} | {cell(d['loop_reference'])} "
            f"| {iv['delta']:+.3f} [{iv['ci_low']:+.3f}, {iv['ci_high']:+.3f}] "
            f"| {d['loop_default_over_reference']:.2f}x "
            f"| {d['invalid_planted']} ({d['invalid_promoted']}) |"
        )
    return "\n".join(rows)


# -- the reference's tuning ------------------------------------------------------------------------------
def sweep(domain: str, lrs: list[float], work: Path, sets: dict) -> list[dict]:
    out = ROOT / "results" / f"reference_sweep-{domain}.json"
    done = {r["learning_rate"]: r for r in (json.loads(out.read_text()) if out.exists() else [])}
    tasks: list = []
    for lr in lrs:
        if lr in done:
            continue
        over = {**sets, "harness.optimizer.learning_rate": lr}
        cfg = arm_config(domain, "static_reference", TUNING_SEED, work / f"sweep-lr{lr:g}", over)
        res = static_arm(cfg, cfg.budget.generated_tokens if lr else 0)  # rate 0: the base, untrained
        tasks = tasks or tuning_tasks(cfg)  # the same for every rate
        ev = evaluate(HFPolicy.load(res["checkpoint"]), make_domain(cfg), tasks, cfg.eval)
        done[lr] = {"learning_rate": lr, "accuracy": ev.accuracy, "tasks": len(tasks), **res}
        out.write_text(json.dumps(sorted(done.values(), key=lambda r: r["learning_rate"]), indent=1))
        print(f"lr {lr:g}: {ev.accuracy:.3f} on {len(tasks)} tuning tasks", flush=True)
    return list(done.values())


def tuning_tasks(cfg: RunConfig) -> list:
    """Up to READ_TASKS tasks drawn under the seed after TUNING_SEED, minus the tuning run's own train and
    held-out questions (as the benchmark's read) and minus every question a benchmark seed is gated or read
    on (its held-out split and its read tasks). Questions a benchmark seed trains on may remain: a tuning
    read on them leaks no reported figure."""
    own = make_domain(cfg)
    seen = {task_key(t) for split in ("train", "heldout") for t in own.tasks(split)}
    for s in SEEDS:
        bench = arm_config_seed(cfg, s)
        seen |= {task_key(t) for t in read_tasks(bench) + make_domain(bench).tasks("heldout")}
    n = READ_TASKS[cfg.env.domain]
    draw = cfg.model_copy(
        update={
            "run": cfg.run.model_copy(update={"seed": TUNING_SEED + 1}),
            "eval": cfg.eval.model_copy(update={"heldout_size": 4 * n}),
        }
    )
    return [t for t in make_domain(draw).tasks("heldout") if task_key(t) not in seen][:n]


def arm_config_seed(cfg: RunConfig, seed: int) -> RunConfig:
    return cfg.model_copy(update={"run": cfg.run.model_copy(update={"seed": seed})})


def main() -> None:
    global CELLS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("cell", "grid", "aggregate", "sweep"))
    ap.add_argument("args", nargs="*")
    ap.add_argument("--domains", nargs="+", choices=list(DOMAINS), default=list(DOMAINS))
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--lr", type=float, nargs="+", default=[3e-5, 1e-4, 3e-4, 1e-3])
    ap.add_argument("--set", dest="sets", action="append", default=[], help="override for every arm, KEY=VALUE")
    ap.add_argument("--work", default="/tmp/evotrainer-claims")
    ap.add_argument("--cells", default=str(CELLS), help="where cell results go (a smoke run: elsewhere)")
    a = ap.parse_args()
    if a.command == "cell" and not (
        len(a.args) == 3 and a.args[0] in DOMAINS and a.args[1] in ARMS and a.args[2].isdigit()
    ):
        ap.error(
            f"cell takes DOMAIN ARM SEED, e.g. `cell code loop_default 1`: DOMAIN one of {list(DOMAINS)}, "
            f"ARM one of {list(ARMS)}, SEED an integer (got {a.args})"
        )
    if a.command == "sweep" and not (len(a.args) == 1 and a.args[0] in DOMAINS):
        ap.error(f"sweep takes one DOMAIN, one of {list(DOMAINS)}, e.g. `sweep code --lr 0 1e-4` (got {a.args})")
    if any("=" not in s for s in a.sets):
        ap.error(f"--set takes KEY=VALUE, e.g. --set loop.max_trial_share=0.5 (got {a.sets})")
    import yaml

    sets = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in a.sets)}
    work = Path(a.work)
    CELLS = Path(a.cells)
    if a.command == "cell":
        run_cell(a.args[0], a.args[1], int(a.args[2]), work, sets)
    elif a.command == "grid":
        for seed in a.seeds:
            for domain in a.domains:
                for arm in a.arms:
                    run_cell(domain, arm, seed, work, sets)
        print(json.dumps(aggregate(), indent=1))
    elif a.command == "aggregate":
        out = aggregate()
        print(json.dumps(out, indent=1))
        print(table(out))
    else:
        sweep(a.args[0], a.lr, work, sets)


if __name__ == "__main__":
    main()
