"""The claims' command line: `python -m benchmarks.claims cell|grid|aggregate|sweep ...` (the package's
docstring says what each measures)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from benchmarks.claims import __doc__ as about
from benchmarks.claims.aggregate import skills_table, table, write_claims
from benchmarks.claims.arms import ACROSS_FROM, ARMS, DOMAINS, PROJECT_SEEDS, SEEDS
from benchmarks.claims.cells import CELLS, run_cell
from benchmarks.claims.sweep import sweep
from benchmarks.paths import scratch


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict]:
    """The arguments, checked before anything runs (a mistyped cell, sweep or --set names the argument and
    the fix), and the --set overrides parsed as YAML values."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.claims", description=about.split("\n\n")[0])
    ap.add_argument("command", choices=("cell", "grid", "aggregate", "sweep"))
    ap.add_argument("args", nargs="*")
    ap.add_argument("--domains", nargs="+", choices=list(DOMAINS), default=list(DOMAINS))
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--lr", type=float, nargs="+", default=[3e-5, 1e-4, 3e-4, 1e-3])
    ap.add_argument("--set", dest="sets", action="append", default=[], help="override for every arm, KEY=VALUE")
    ap.add_argument("--work", type=Path, default=scratch("evotrainer-claims"), help="run directories (scratch)")
    ap.add_argument("--cells", type=Path, default=CELLS, help="where cell results go (a smoke run: elsewhere)")
    ap.add_argument("--out", type=Path, default=None, help="aggregate: the claims file (default: beside --cells)")
    a = ap.parse_args(argv)
    if a.command == "cell" and not (
        len(a.args) == 3 and a.args[0] in DOMAINS and a.args[1] in ARMS and a.args[2].isdigit()
    ):
        ap.error(
            f"cell takes DOMAIN ARM SEED, e.g. `cell code loop_default 1`: DOMAIN one of {list(DOMAINS)}, "
            f"ARM one of {list(ARMS)}, SEED an integer (got {a.args})"
        )
    if a.command == "cell" and a.args[1] == "loop_default_across" and a.args[0] not in ACROSS_FROM:
        ap.error(f"loop_default_across has a source library for {sorted(ACROSS_FROM)} only (got {a.args[0]})")
    if a.command == "cell" and a.args[1] == "loop_default_project" and int(a.args[2]) in PROJECT_SEEDS:
        ap.error(
            f"loop_default_project's library is the cold runs of seeds {list(PROJECT_SEEDS)}: run it at another seed"
        )
    if a.command == "sweep" and not (len(a.args) == 1 and a.args[0] in DOMAINS):
        ap.error(f"sweep takes one DOMAIN, one of {list(DOMAINS)}, e.g. `sweep code --lr 0 1e-4` (got {a.args})")
    if any("=" not in s for s in a.sets):
        ap.error(f"--set takes KEY=VALUE, e.g. --set loop.max_trial_share=0.5 (got {a.sets})")
    return a, {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in a.sets)}


def main(argv: list[str] | None = None) -> None:
    a, sets = parse(argv)
    out = a.out or a.cells.parent / "claims.json"
    if a.command == "cell":
        run_cell(a.args[0], a.args[1], int(a.args[2]), a.work, sets, a.cells)
    elif a.command == "grid":
        for seed in a.seeds:
            for domain in a.domains:
                for arm in a.arms:
                    if arm == "loop_default_across" and domain not in ACROSS_FROM:
                        continue  # no other domain's library is defined for it
                    if arm == "loop_default_project" and seed in PROJECT_SEEDS:
                        continue  # its library is these seeds' cold runs
                    run_cell(domain, arm, seed, a.work, sets, a.cells)
        print(json.dumps(write_claims(a.cells, out), indent=1))
    elif a.command == "aggregate":
        claims = write_claims(a.cells, out)
        print(json.dumps(claims, indent=1))
        print(table(claims))
        if "skills" in claims:
            print(skills_table(claims))
    else:
        sweep(a.args[0], a.lr, a.work, sets)


if __name__ == "__main__":
    main()
