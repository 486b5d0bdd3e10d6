"""Do the trajectory-dependent tests hold on other seeds, thread counts and CPU kernel sets?

Floating-point results differ across CPUs and thread counts, so a test that passes on one machine at one
seed can fail on another (three did, on an AMD EPYC; two on an Intel Xeon with AVX-512 and AMX, from its
kernel set alone). Torch picks its kernels by the CPU; ATEN_CPU_CAPABILITY can only lower the choice
(default: no SIMD, avx2, avx512), so one machine can show the numerics of lesser CPUs, not of greater ones.
This runs the tests whose outcome depends on a training trajectory (the failure scenarios, the planted
loophole, the induced detector, the RL runs that must improve) once per (CPU, seed, threads, kernels) cell,
through tests/conftest.py's EVOTRAINER_TEST_SEED and EVOTRAINER_TEST_THREADS and torch's ATEN_CPU_CAPABILITY
("native": unset), and records each test's outcome per cell, with the CPU it ran on (a cell on another
CPU is another cell). ATEN_CPU_CAPABILITY leaves oneDNN's kernels as they
are; --onednn also caps those (ONEDNN_MAX_CPU_ISA, e.g. AVX2), as a lesser CPU would have them. A cell is
resumable: its JUnit file is kept and a finished cell is not run again, so the grid can be run over several sittings:

    python -m benchmarks.robustness [--seeds 0 1 2] [--threads 1 2] [--kernels native default] [--tests ...]

Writes benchmarks/results/robustness.json (and its manifest): per cell, the tests run and the ones that
failed, and per test, the cells it failed in.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from benchmarks.manifest import git_state, this_cpu, write_result
from benchmarks.paths import RESULTS, ROOT, scratch

TRAJECTORY_TESTS = [
    "tests/test_failures.py",
    "tests/test_gate.py",
    "tests/test_revision.py::test_induction_finds_the_planted_exploit",
    "tests/test_training.py",
    "tests/test_race.py",
    "tests/test_earned.py",
]


KERNELS = ("native", "default", "avx2", "avx512")
ONEDNN_ISAS = ("native", "SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_BF16")
"""ONEDNN_MAX_CPU_ISA values ("native": unset), lesser CPUs' ISAs as oneDNN names them."""
UNRECORDED = "unrecorded"
"""The machine of a cell written before cells or manifests named it."""


def run_cell(seed: int, threads: int, kernels: str, tests: list[str], work: Path, onednn: str = "native") -> dict:
    tail = ("" if kernels == "native" else f"-{kernels}") + ("" if onednn == "native" else f"-onednn{onednn}")
    xml = work / (f"seed{seed}-threads{threads}{tail}.xml")
    if not xml.exists():
        env = {**os.environ, "EVOTRAINER_TEST_SEED": str(seed), "EVOTRAINER_TEST_THREADS": str(threads)}
        env.pop("ATEN_CPU_CAPABILITY", None)
        env.pop("ONEDNN_MAX_CPU_ISA", None)
        if kernels != "native":
            env["ATEN_CPU_CAPABILITY"] = kernels
        if onednn != "native":
            env["ONEDNN_MAX_CPU_ISA"] = onednn
        t0 = time.perf_counter()
        tmp = xml.with_suffix(".tmp.xml")
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={tmp}", *tests],
            cwd=ROOT,
            env=env,
            check=False,
        )
        tmp.rename(xml)  # only a finished cell counts as done
        capped = "" if onednn == "native" else f", oneDNN {onednn}"
        took = time.perf_counter() - t0
        print(f"seed {seed}, threads {threads}, kernels {kernels}{capped}: {took:.0f} s", flush=True)
    cases = ET.parse(xml).getroot().iter("testcase")
    outcome = {}
    for c in cases:
        name = f"{c.get('classname')}::{c.get('name')}"
        bad = c.find("failure") is not None or c.find("error") is not None
        outcome[name] = "skipped" if c.find("skipped") is not None else "failed" if bad else "passed"
    return {"seed": seed, "threads": threads, "kernels": kernels, "onednn": onednn, "outcomes": outcome}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.robustness", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--kernels", nargs="+", default=["native"], choices=KERNELS, help="ATEN_CPU_CAPABILITY per cell")
    # oneDNN ignores a value it does not know, which would record a capped cell that ran uncapped: only its names.
    ap.add_argument("--onednn", default="native", choices=ONEDNN_ISAS, help="ONEDNN_MAX_CPU_ISA for every cell")
    ap.add_argument("--tests", nargs="+", default=TRAJECTORY_TESTS)
    ap.add_argument("--work", default=str(scratch("evotrainer-robustness")), help="JUnit files of the cells (scratch)")
    ap.add_argument("--out", type=Path, default=RESULTS / "robustness.json")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    grid = [(s, t, k) for k in args.kernels for s in args.seeds for t in args.threads]
    cells = [run_cell(s, t, k, args.tests, work, args.onednn) for s, t, k in grid]
    commit, dirty = git_state()
    run = {"commit": (commit or "")[:7] + ("+dirty" if dirty else ""), "date": time.strftime("%Y-%m-%d")}
    fresh = [
        {
            "machine": this_cpu(),
            "seed": c["seed"],
            "threads": c["threads"],
            "ATEN_CPU_CAPABILITY": c["kernels"],
            "ONEDNN_MAX_CPU_ISA": c["onednn"],
            "tests": len(c["outcomes"]),
            "failed": sorted(n for n, o in c["outcomes"].items() if o == "failed"),
            **run,
        }
        for c in cells
    ]
    merged = _earlier_cells(args.out, {_key(c) for c in fresh}) + fresh
    failed_in: dict[str, list[str]] = {}
    for c in merged:
        for name in c["failed"]:
            failed_in.setdefault(name, []).append(
                f"seed {c['seed']}, threads {c['threads']}, kernels {c['ATEN_CPU_CAPABILITY']}"
                f"{'' if c.get('ONEDNN_MAX_CPU_ISA', 'native') == 'native' else ', oneDNN ' + c['ONEDNN_MAX_CPU_ISA']}"
                f" on {c['machine']} ({c['commit']})"
            )
    out = {"cells": merged, "failed_in": dict(sorted(failed_in.items()))}  # the command is the manifest's
    write_result(args.out, out, work=work, no_config=True, note="tests: " + " ".join(args.tests))
    total = sum(c["tests"] for c in merged)
    bad = sum(len(v) for v in out["failed_in"].values())
    print(f"{len(merged)} cells ({len(fresh)} run now), {total} test runs, {bad} failed")
    for name, where in out["failed_in"].items():
        print(f"  {name}: {'; '.join(where)}")


def _key(c: dict) -> tuple:
    """A cell is its CPU, seed, threads and kernel sets: "native" on an AMD EPYC is not "native" on a Xeon."""
    kernels = c.get("ATEN_CPU_CAPABILITY", "native"), c.get("ONEDNN_MAX_CPU_ISA", "native")
    return c.get("machine", UNRECORDED), c["seed"], c["threads"], *kernels


def _earlier_cells(out: Path, rerun: set[tuple]) -> list[dict]:
    """The cells already in the result file that this invocation did not run again: the grid grows over
    sittings, each cell with the commit, date and machine that measured it (a file from before cells carried them:
    its manifest's, as it stood when that file was last written; a manifest from before manifests named the
    machine leaves it unrecorded)."""
    if not out.exists():
        return []
    old = json.loads(out.read_text())
    manifest = out.with_name(out.stem + ".manifest.json")
    prior = json.loads(manifest.read_text()) if manifest.exists() else {}
    run = {
        "commit": (prior.get("commit") or "")[:7],
        "date": (prior.get("date") or "")[:10],
        "machine": prior.get("machine") or UNRECORDED,
    }
    unset = {"ATEN_CPU_CAPABILITY": "native", "ONEDNN_MAX_CPU_ISA": "native"}
    cells = [{**unset, **run, **c} for c in old.get("cells", [])]
    return [c for c in cells if _key(c) not in rerun]


if __name__ == "__main__":
    main()
