"""The loop against a static harness at the same budget, side by side, several seeds.

For each seed: run the co-evolution loop (`evotrainer run`) on a config; then, from the same
warm-started base, train under the config's starting harness unchanged until it has sampled as many
tokens as the whole loop did (trials, A-A controls and gate evaluations included: every token the
loop generated is given to the static run as training). Both are read once on the same final
held-out tasks, which no gate decision saw.

    .venv/bin/python benchmarks/coevolve.py [--config examples/math.yaml] [--seeds 0 1 2]
        [--set budget.generated_tokens=400000]

Prints a Markdown table (paste it into benchmarks/RESULTS.md) and writes benchmarks/coevolve-SEEDS.json.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from claims import train_static  # noqa: E402  (the static arm of benchmarks/claims.py)

from evotrainer.config import load_config  # noqa: E402
from evotrainer.envs.registry import make_domain  # noqa: E402
from evotrainer.evaluation import evaluate  # noqa: E402
from evotrainer.loop import run_loop  # noqa: E402
from evotrainer.policies.hf import HFPolicy  # noqa: E402
from evotrainer.stages.context import split_heldout  # noqa: E402
from evotrainer.store.ledger import Ledger  # noqa: E402


def static_run(cfg, run_dir: Path, tokens: int) -> dict:
    """Train the starting harness from the loop's own base checkpoint until `tokens` are sampled."""
    base = Path(cfg.run.out_dir) / cfg.run.name / "checkpoints" / "base"
    t0 = time.perf_counter()
    checkpoint, steps, gen = train_static(cfg, run_dir, str(base), tokens)
    domain = make_domain(cfg)
    _, final_ids = split_heldout([t.id for t in domain.tasks("heldout")], cfg.gate.final_fraction, cfg.run.seed)
    by_id = {t.id: t for t in domain.tasks("heldout")}
    ev = evaluate(HFPolicy.load(checkpoint), domain, [by_id[i] for i in final_ids], cfg.eval)
    return {"accuracy": ev.accuracy, "steps": steps, "generated_tokens": gen, "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(Path(__file__).resolve().parent.parent / "examples" / "math.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--set", dest="sets", action="append", default=[], help="Override, e.g. budget.generated_tokens=400000"
    )
    ap.add_argument("--out", default="/tmp/evotrainer-coevolve")
    args = ap.parse_args()
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.sets)}
    rows = []
    for seed in args.seeds:
        skills = Path(args.out) / f"skills-{seed}"  # a fresh library per seed: no seed learns from another
        cfg = load_config(
            args.config,
            {
                **overrides,
                "run.seed": seed,
                "run.name": f"loop-{seed}",
                "run.out_dir": args.out,
                "loop.skills_dir": str(skills),
            },
        )
        t0 = time.perf_counter()
        summary = run_loop(cfg, Console(file=io.StringIO()))
        loop_seconds = time.perf_counter() - t0
        ledger = Ledger(Path(args.out) / f"loop-{seed}" / "ledger.sqlite")
        tokens = ledger.spent().generated_tokens
        static = static_run(cfg, Path(args.out) / f"static-{seed}", tokens)
        rows.append(
            {
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
                "final_harness_diff": _diff(cfg, summary),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    Path(__file__).with_name(f"coevolve-{'-'.join(map(str, args.seeds))}.json").write_text(json.dumps(rows, indent=2))
    print(
        "\n| seed | base | static harness | loop | loop - static | rounds | promoted / rejected "
        "| tokens (loop / static) | seconds (loop / static) | what the loop changed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['seed']} | {r['baseline']:.3f} | {r['static']:.3f} | {r['loop']:.3f} | "
            f"{r['loop'] - r['static']:+.3f} | {r['rounds']} | "
            f"{r['promoted']} / {r['rejected']} | {r['loop_tokens']:,} / {r['static_tokens']:,} | "
            f"{r['loop_seconds']:.0f} / {r['static_seconds']:.0f} | {r['final_harness_diff']} |"
        )
    n = len(rows)
    print(
        f"| mean | {sum(r['baseline'] for r in rows) / n:.3f} | {sum(r['static'] for r in rows) / n:.3f} | "
        f"{sum(r['loop'] for r in rows) / n:.3f} | {sum(r['loop'] - r['static'] for r in rows) / n:+.3f} | | | | | |"
    )


def _diff(cfg, summary) -> str:
    from evotrainer.harness.harness import Harness
    from evotrainer.harness.interventions import diff

    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    final = Harness.model_validate(
        yaml.safe_load((run_dir / "harness" / f"{summary['harness_version']}.yaml").read_text())
    )
    return "; ".join(f"{p}: {a} -> {b}" for p, a, b in diff(cfg.harness, final)) or "nothing"


if __name__ == "__main__":
    main()
