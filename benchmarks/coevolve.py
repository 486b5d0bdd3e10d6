"""The loop against a static harness at the same budget, side by side, several seeds.

For each seed: run the co-evolution loop (`evotrainer run`) on a config; then, from the same
warm-started base, train under the config's starting harness unchanged until it has sampled as many
tokens as the whole loop did (trials, A-A controls and gate evaluations included: every token the
loop generated is given to the static run as training). Both are read once on the same final
held-out tasks, which no gate decision saw.

    python -m benchmarks.coevolve [--config examples/math.yaml] [--seeds 0 1 2]
        [--set budget.generated_tokens=400000]

Prints a Markdown table (paste it into benchmarks/RESULTS.md) and writes
benchmarks/results/coevolve-SEEDS.json with its manifest.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import yaml
from rich.console import Console

from benchmarks.claims.runners import train_static
from benchmarks.manifest import write_result
from benchmarks.paths import RESULTS, ROOT, scratch
from benchmarks.tables import markdown_table
from evotrainer.config import RunConfig, load_config
from evotrainer.envs.registry import make_domain
from evotrainer.evaluation import evaluate
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import diff
from evotrainer.loop import run_loop
from evotrainer.policies.hf import HFPolicy
from evotrainer.stages.context import split_heldout
from evotrainer.store.ledger import Ledger


def static_run(cfg: RunConfig, run_dir: Path, tokens: int) -> dict:
    """Train the starting harness from the loop's own base checkpoint until `tokens` are sampled."""
    base = Path(cfg.run.out_dir) / cfg.run.name / "checkpoints" / "base"
    t0 = time.perf_counter()
    checkpoint, steps, gen = train_static(cfg, run_dir, str(base), tokens)
    domain = make_domain(cfg)
    _, final_ids = split_heldout([t.id for t in domain.tasks("heldout")], cfg.gate.final_fraction, cfg.run.seed)
    by_id = {t.id: t for t in domain.tasks("heldout")}
    ev = evaluate(HFPolicy.load(checkpoint), domain, [by_id[i] for i in final_ids], cfg.eval)
    return {"accuracy": ev.accuracy, "steps": steps, "generated_tokens": gen, "seconds": time.perf_counter() - t0}


def one_seed(config: str, seed: int, out: Path, overrides: dict) -> dict:
    """The loop, then the static run on as many tokens, at one seed."""
    skills = out / f"skills-{seed}"  # a fresh library per seed: no seed learns from another
    over = {**overrides, "run.seed": seed, "run.name": f"loop-{seed}", "run.out_dir": str(out)}
    cfg = load_config(config, {**over, "loop.skills_dir": str(skills)})
    t0 = time.perf_counter()
    summary = run_loop(cfg, Console(file=io.StringIO()))
    loop_seconds = time.perf_counter() - t0
    tokens = Ledger(out / f"loop-{seed}" / "ledger.sqlite").spent().generated_tokens
    static = static_run(cfg, out / f"static-{seed}", tokens)
    return {
        "seed": seed,
        "baseline": summary["baseline_accuracy"],
        "loop": summary["final_accuracy"],
        "static": static["accuracy"],
        "loop_tokens": tokens,
        "static_tokens": static["generated_tokens"],
        "static_steps": static["steps"],
        "loop_seconds": loop_seconds,
        "static_seconds": static["seconds"],
        "rounds": summary["rounds"],
        "promoted": len(summary["promoted"]),
        "rejected": len(summary["rejected"]),
        "final_harness_diff": harness_diff(cfg, summary),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.coevolve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "math.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--set", dest="sets", action="append", default=[], help="Override, e.g. budget.generated_tokens=400000"
    )
    ap.add_argument("--out", type=Path, default=scratch("evotrainer-coevolve"), help="run directories (scratch)")
    args = ap.parse_args(argv)
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.sets)}
    rows = []
    for seed in args.seeds:
        rows.append(one_seed(args.config, seed, args.out, overrides))
        print(json.dumps(rows[-1]), flush=True)
    result = RESULTS / f"coevolve-{'-'.join(map(str, args.seeds))}.json"
    write_result(result, rows, work=args.out, configs=[args.config], overrides=overrides)
    print()
    print(table(rows))


def table(rows: list[dict]) -> str:
    header = [
        "seed",
        "base",
        "static harness",
        "loop",
        "loop - static",
        "rounds",
        "promoted / rejected",
        "tokens (loop / static)",
        "seconds (loop / static)",
        "what the loop changed",
    ]
    lines = [
        [
            r["seed"],
            f"{r['baseline']:.3f}",
            f"{r['static']:.3f}",
            f"{r['loop']:.3f}",
            f"{r['loop'] - r['static']:+.3f}",
            r["rounds"],
            f"{r['promoted']} / {r['rejected']}",
            f"{r['loop_tokens']:,} / {r['static_tokens']:,}",
            f"{r['loop_seconds']:.0f} / {r['static_seconds']:.0f}",
            r["final_harness_diff"],
        ]
        for r in rows
    ]
    n = len(rows)
    mean = [
        "mean",
        f"{sum(r['baseline'] for r in rows) / n:.3f}",
        f"{sum(r['static'] for r in rows) / n:.3f}",
        f"{sum(r['loop'] for r in rows) / n:.3f}",
        f"{sum(r['loop'] - r['static'] for r in rows) / n:+.3f}",
        "",
        "",
        "",
        "",
        "",
    ]
    return markdown_table(header, [*lines, mean])


def harness_diff(cfg: RunConfig, summary: dict) -> str:
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    final = Harness.model_validate(
        yaml.safe_load((run_dir / "harness" / f"{summary['harness_version']}.yaml").read_text())
    )
    return "; ".join(f"{p}: {a} -> {b}" for p, a, b in diff(cfg.harness, final)) or "nothing"


if __name__ == "__main__":
    main()
