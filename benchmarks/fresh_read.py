"""Final policies read side by side on many fresh tasks: is one really below another?

A run's final read is one draw of its final tasks (250 in the main job), so two runs' finals differ by
several points on task noise alone. This reads each given checkpoint on up to `--n` tasks drawn from the
config's datasets under another seed, minus every question the config's own seed put in its train or
held-out split (so no policy saw them in training and no gate read them), and compares each policy with
the first paired: wins, losses and the exact two-sided sign test.

    python -m benchmarks.fresh_read [--config examples/math.yaml] [--n 2000] NAME=CHECKPOINT ...

Prints a Markdown table and writes benchmarks/results/fresh_read.json with its manifest.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scipy import stats

from benchmarks.manifest import write_result
from benchmarks.paths import RESULTS, ROOT
from benchmarks.tables import markdown_table
from evotrainer.backtest.statistics import Pair
from evotrainer.config import load_config
from evotrainer.envs.registry import make_domain
from evotrainer.evaluation import evaluate
from evotrainer.policies.hf import HFPolicy

FRESH_SEED = 104_729  # any seed the runs compared here did not use


def fresh_tasks(config: str, n: int) -> tuple[list, object, object]:
    cfg = load_config(config)
    used = make_domain(cfg)
    seen = {t.prompt for split in ("train", "heldout") for t in used.tasks(split)}
    fresh_cfg = load_config(config, {"run.seed": FRESH_SEED, "eval.heldout_size": 2 * n})
    domain = make_domain(fresh_cfg)
    tasks = [t for t in domain.tasks("heldout") if t.prompt not in seen][:n]
    return tasks, domain, cfg


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fresh_read", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "math.yaml"))
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("policies", nargs="+", help="NAME=CHECKPOINT; the first is the reference")
    ap.add_argument("--out", type=Path, default=RESULTS / "fresh_read.json")
    args = ap.parse_args(argv)
    tasks, domain, cfg = fresh_tasks(args.config, args.n)
    reads = {}
    for item in args.policies:
        name, path = item.split("=", 1)
        ev = evaluate(HFPolicy.load(path), domain, tasks, cfg.eval)
        reads[name] = {"checkpoint": path, "accuracy": ev.accuracy, "outcomes": ev.outcomes}
    ref = next(iter(reads))
    rows, lines = [], []
    for name, r in reads.items():
        pair = Pair.of(r["outcomes"], reads[ref]["outcomes"])
        p = float(stats.binomtest(pair.wins, pair.discordant, 0.5).pvalue) if pair.discordant else 1.0
        rows.append({"policy": name, "checkpoint": r["checkpoint"], "accuracy": r["accuracy"], "tasks": len(tasks)})
        rows[-1] |= {"wins": pair.wins, "losses": pair.losses, "sign_p": p} if name != ref else {}
        vs = "" if name == ref else f"{pair.wins} / {pair.losses}"
        lines.append([name, f"{r['accuracy']:.3f}", vs, "" if name == ref else f"{p:.3f}"])
    print(f"{len(tasks)} fresh tasks\n")
    print(markdown_table(["policy", "accuracy", f"vs {ref}: wins / losses", "sign test p (two-sided)"], lines))
    write_result(
        args.out, rows, configs=[args.config], overrides={"run.seed": FRESH_SEED, "eval.heldout_size": 2 * args.n}
    )


if __name__ == "__main__":
    main()
