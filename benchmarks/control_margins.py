"""How far is each healthy control of the failure scenarios from each detector's bar, per seed and kernel set?

tests/test_failures.py asks that the healthy controls (examples/failures/healthy*.yaml) stay quiet and that their
reward rise; that is pass or fail. This reads the margin behind it: each control trained as the test trains it, at
each seed, then the default suite (what fired) and a pressed one, whose bars are moved so that each detector a
healthy run comes near reports its statistic whether or not it crosses the bar (plateau's reward slope, the share
of dead groups, of truncated rollouts, of tool errors and of capped episodes; plateau also asks 20 steps and a
mean reward under 0.9, which the controls have). Entropy is read off the
metrics as entropy_collapse reads it (its first and last thirds): that detector also needs a fall, which a
moved bar cannot report. Run it once per kernel set, which torch fixes at import:

    [ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=AVX2] python -m benchmarks.control_margins [--seeds 0 1 2]
        [--set harness.optimizer.learning_rate=0.001]

`--set` changes a knob of the control: a candidate mend measured before it is made. Each (machine, kernel set,
threads, control, seed, knobs changed) is a cell, written to the result as soon as it is read, so the grid
grows over sittings; the warm start is built once per machine and kernel set (its numerics are the margin's).
benchmarks/plant_margins.py reads the plants' side of the bars on the same grid.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError
from rich.console import Console

from benchmarks.manifest import git_state, this_cpu, write_result
from benchmarks.paths import RESULTS, ROOT, scratch
from benchmarks.robustness import KERNELS, ONEDNN_ISAS
from evotrainer.cli.common import parse_overrides
from evotrainer.config import RunConfig, load_config

# entropy_collapse's own reading; private there, and renaming it would move every suite's version (the hash
# covers each detector's source).
from evotrainer.diagnostics.builtin import _entropy_thirds
from evotrainer.diagnostics.detector import Finding
from evotrainer.diagnostics.suite import BUILTIN, DetectorSpec, Suite
from evotrainer.diagnostics.window import open_window
from evotrainer.errors import UserError
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.run import BRANCH, train_run

CONTROLS = ("healthy", "healthy_digits")
FAILURES = ROOT / "examples" / "failures"
# detector -> its bars moved so that it reports any statistic: a slope under infinity, any share above zero (a
# share of zero reports nothing, and reads as 0 below; zero_variance_groups has no mean of dead groups to give).
PRESSED = {
    "plateau": {"min_slope": math.inf, "ceiling": math.inf},
    "zero_variance_groups": {"max_fraction": 0.0},
    "truncation": {"max_fraction": 0.0},
    "tool_errors": {"max_error_fraction": 0.0, "max_turn_cap_fraction": 0.0},
}
# The default bar each reported statistic is held to (tool_errors reports two findings).
BARS = {
    "plateau": ("min_slope", "below"),
    "zero_variance_groups": ("max_fraction", "above"),
    "truncation": ("max_fraction", "above"),
    "tool_errors": ("max_error_fraction", "above"),
    "turn_cap": ("max_turn_cap_fraction", "above"),
}


def scenario_config(name: str, seed: int, work: Path, cache: Path, knobs: dict[str, Any]) -> RunConfig:
    """A failure scenario (a control or a plant) as the test trains it at `seed`, with `knobs` (--set) changed: a
    candidate mend, measured."""
    where = {"run.seed": seed, "run.name": f"{name}-{seed}", "run.out_dir": str(work)}
    return load_config(FAILURES / f"{name}.yaml", {**knobs, **where, "policy.cache_dir": str(cache)})


def trained(cfg: RunConfig) -> tuple[RolloutStore, int]:
    """The scenario trained: its store and last step."""
    summary = train_run(cfg, Console(file=open(os.devnull, "w")))
    if summary["steps"] != cfg.train.steps:  # cut short by max_seconds: not the run the test reads
        raise SystemExit(f"{cfg.run.name}: ran {summary['steps']} of {cfg.train.steps} steps (a loaded machine?)")
    return RolloutStore(Path(cfg.run.out_dir) / cfg.run.name / "store"), summary["steps"]


def pressed_findings(store: RolloutStore, last: int, detectors: dict[str, dict[str, float]]) -> list[Finding]:
    """What `detectors`, with their bars moved, report over the run; a detector_error stops the benchmark, since a
    statistic not read is not a margin."""
    suite = Suite(detectors={name: DetectorSpec(params=p) for name, p in detectors.items()})
    found = suite.run(store, BRANCH, 1, last)
    for f in found:
        if f.name == "detector_error":
            raise SystemExit(f"{store.root}: {f.message}")
    return found


def read_cell(control: str, cfg: RunConfig) -> dict:
    """The control (its config `cfg`) trained, then what fired, each pressed statistic against its default bar, the
    entropy's thirds and the reward's rise (the test's: the last third's mean over the first's)."""
    store, last = trained(cfg)
    values = {name: 0.0 for name, (_, side) in BARS.items() if side == "above"}
    values |= {f.name: f.value for f in pressed_findings(store, last, PRESSED)}
    margins = {}
    for name, value in values.items():
        param, side = BARS[name]
        bar = BUILTIN["tool_errors" if name == "turn_cap" else name][1][param]
        margins[name] = {"value": value, "bar": bar, "fires_when": side}
    reward = np.array([m["reward"] for _, m in sorted(store.metrics(BRANCH).items())])
    third = len(reward) // 3
    return {
        "fired": fired_by_default(store, last),
        "margins": margins,
        "entropy_thirds": _entropy_thirds(open_window(store, BRANCH, 1, last)),
        "reward_rise": float(reward[-third:].mean() - reward[:third].mean()),
    }


def fired_by_default(store: RolloutStore, last: int) -> list[str]:
    return sorted({f.name for f in Suite.default().run(store, BRANCH, 1, last)})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.control_margins", description=__doc__.split("\n\n")[0])
    ap.add_argument("--controls", nargs="+", default=list(CONTROLS), choices=CONTROLS)
    grid_arguments(ap, RESULTS / "control-margins.json")
    args = ap.parse_args(argv)
    measure(ap, args, "control", args.controls, read_cell, _brief)


def grid_arguments(ap: argparse.ArgumentParser, out: Path) -> None:
    """The options every margins grid has: its seeds, threads, changed knobs, scratch and result file."""
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=2, help="torch threads, as the tests' EVOTRAINER_TEST_THREADS")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a knob of the scenario changed")
    ap.add_argument("--work", type=Path, default=scratch("evotrainer-margins"), help="runs and warm starts (scratch)")
    ap.add_argument("--out", type=Path, default=out)


def measure(
    ap: argparse.ArgumentParser,
    args: argparse.Namespace,
    field: str,
    names: list[str],
    read: Callable[[str, RunConfig], dict],
    brief: Callable[[dict], str],
) -> None:
    """Each (scenario `field`: name, seed) cell not yet in the result file read by `read` and written at once."""
    try:  # every config checked before anything trains or is written
        knobs = parse_overrides(args.set)
        for name in names:
            scenario_config(name, 0, args.work, args.work, knobs)
    except (UserError, ValidationError, ValueError) as e:
        ap.error(f"--set: {e}")
    # Read from the environment (torch takes them at start): a value neither knows would be ignored, and a cell
    # recorded as capped would have run uncapped.
    for var, known in (("ATEN_CPU_CAPABILITY", KERNELS), ("ONEDNN_MAX_CPU_ISA", ONEDNN_ISAS)):
        if os.environ.get(var, "native") not in known:
            ap.error(f"{var}={os.environ[var]!r} is not one of {', '.join(known[1:])}; unset it for native kernels")
    torch.set_num_threads(args.threads)
    where = {
        "machine": this_cpu(),
        "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY", "native"),
        "ONEDNN_MAX_CPU_ISA": os.environ.get("ONEDNN_MAX_CPU_ISA", "native"),
        "threads": args.threads,
        "set": knobs,
    }
    # The runs of one kernel set apart from another's, each with a warm start of its own (a knob of the warm start
    # keys its cache entry).
    work = args.work / "-".join(str(where[k]) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "threads"))
    cells = json.loads(args.out.read_text())["cells"] if args.out.exists() else []
    for name in names:
        for seed in args.seeds:
            key = {**where, field: name, "seed": seed}
            if any(_key(c, field) == _key(key, field) for c in cells):
                continue
            t0 = time.perf_counter()
            run = work / f"{name}-{seed}-{time.time_ns()}"
            cell = {**key, **read(name, scenario_config(name, seed, run, work / "cache", knobs))}
            commit, dirty = git_state()
            cell |= {"commit": (commit or "")[:7] + ("+dirty" if dirty else ""), "date": time.strftime("%Y-%m-%d")}
            cells.append(cell)
            write_result(args.out, {"cells": cells}, work=args.work, no_config=True)
            fired = cell["fired"] or "nothing"
            print(f"{name} seed {seed}: fired {fired}, {brief(cell)}, {time.perf_counter() - t0:.0f} s", flush=True)


def _key(c: dict, field: str) -> tuple:
    where = ("machine", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "threads", field, "seed")
    return (*(c[k] for k in where), json.dumps(c["set"], sort_keys=True))


def _brief(cell: dict) -> str:
    parts = [f"{name} {m['value']:.3g} (bar {m['bar']:g})" for name, m in cell["margins"].items()]
    e = cell["entropy_thirds"]
    return ", ".join(
        [*parts, f"entropy {e[0]:.3f} -> {e[1]:.3f}" if e else "entropy n/a", f"rise {cell['reward_rise']:+.3f}"]
    )


if __name__ == "__main__":
    main()
