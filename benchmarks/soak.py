"""Fault-injection soak (issue #13 item 2): real loop runs killed, stopped, starved of disk and corrupted,
then resumed; concurrent skill-library writers; a sandbox worker killed mid-job. Each run is compared with
one uninterrupted run of the same config: records lost or duplicated, and whether the decisions (branches,
verdicts, final held-out accuracy) are the same.

    nice -n 10 python -m benchmarks.soak --kills 20 --seed 0

Each fault's result is a cell (a JSON file under --work); a rerun skips finished cells, and the SIGKILL
fault keeps one cell per killed run, so a soak interrupted itself continues where it stopped. Disk full
mounts a tmpfs and so needs root; without it that cell says so. Wall-clock times here only choose when to
strike (they are no performance figures)."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

from benchmarks.manifest import write_result
from benchmarks.paths import RESULTS, scratch
from benchmarks.soak_runs import (
    aggregate,
    cell,
    cli,
    compare,
    finish,
    next_command,
    record,
    strike,
    tail,
    where,
    write_config,
)
from benchmarks.soak_units import sandbox_worker, skills_concurrent
from evotrainer.store.checkpoints import damaged
from evotrainer.store.ledger import STAGES, Ledger
from evotrainer.store.rollouts import RolloutStore


# -- the reference: one uninterrupted run -------------------------------------------------------------------
def reference(work: Path, cache: Path) -> dict:
    """One uninterrupted run: its record and how long it took (to spread the kills over a run's life)."""
    out = work / "reference"
    cfg = write_config(out, cache)
    t0 = time.monotonic()
    rc = cli(["run", str(cfg)], out / "log.txt").wait()
    if rc != 0:
        raise SystemExit(f"the reference run failed (exit {rc}): {tail(out / 'log.txt', 3000)}")
    return {"seconds": time.monotonic() - t0, "record": record(out / "soak")}


# -- 1. SIGKILL at random moments ------------------------------------------------------------------------
def kill_run(work: Path, cache: Path, ref: dict, i: int, seed: int, kills: int) -> dict:
    """One run killed `kills` times at seeded random moments (run, then resume after each kill), then let
    finish; compared with the reference. A moment is counted from the life's first stage (the start-up
    before it, imports, writes nothing), over most of an uninterrupted run's length."""
    rng = random.Random(f"sigkill:{seed}:{i}")
    out = work / f"run{i}"
    cfg, run_dir, log = write_config(out, cache), out / "soak", out / "log.txt"
    landed, delays, failures = 0, [], []
    while True:
        proc = cli(next_command(cfg, run_dir), log)
        if landed < kills:
            delay = rng.uniform(0.0, 0.8 * ref["seconds"])
            if (rc := strike(proc, run_dir, delay)) is None:
                landed += 1
                delays.append([round(delay, 1), where(run_dir)])
        else:
            rc = proc.wait()
        if rc == 0:
            break
        if rc is not None:  # died of itself: a failure to survive, unless the next resume mends it
            failures.append({"exit": rc, "log": tail(log)})
            if len(failures) >= 3:
                return {"kills": landed, "delays": delays, "survived": False, "failures": failures}
    return {
        "kills": landed,
        "delays": delays,
        "survived": True,
        "failures": failures,
        **compare(ref["record"], record(run_dir)),
    }


def commit_kills(work: Path, cache: Path, ref: dict) -> dict:
    """One run killed inside every stage's commit (after its writes, before COMMIT: EVOTRAINER_KILL_AT), in
    order, each life redoing one stage; each kill must leave that stage uncommitted, and the end must match."""
    cfg, run_dir, log = write_config(work, cache), work / "soak", work / "log.txt"
    done = {tuple(x) for x in ref["record"]["stages"]}
    order = [(0, "start"), *((r, st) for r in (1, 2, 3) for st in STAGES), (0, "final")]
    runs = []
    for rnd, stage in [x for x in order if x in done]:
        rc = cli(next_command(cfg, run_dir), log, {"EVOTRAINER_KILL_AT": f"{rnd}:{stage}"}).wait()
        ledger = Ledger(run_dir / "ledger.sqlite")
        rolled_back = rc == -signal.SIGKILL and ledger.stage_result(rnd, stage) is None
        ledger.close()
        runs.append({"stage": f"{rnd}:{stage}", "exit": rc, "rolled_back": rolled_back})
    rc = finish(cfg, run_dir, log)
    end = compare(ref["record"], record(run_dir)) if rc == 0 else {"lost": None, "same_decisions": False}
    ok = rc == 0 and all(r["rolled_back"] for r in runs) and end["same_decisions"]
    return {
        "injected": sum(r["exit"] == -signal.SIGKILL for r in runs),
        "survived": sum(r["rolled_back"] for r in runs) if ok else 0,
        "lost": end["lost"],
        "duplicated": end.get("duplicated"),
        "same_decisions": end["same_decisions"],
        "notes": f"{len(runs)} stages, each killed inside its ledger commit; resume exit {rc}",
        "runs": runs,
        **{k: v for k, v in end.items() if k in ("extra", "same_rollouts")},
    }


def sigkill(work: Path, cache: Path, ref: dict, seed: int, kills: int, per_run: int = 4) -> dict:
    runs, landed, i = [], 0, 0
    while landed < kills:
        n = min(per_run, kills - landed)
        r = cell(
            work / "sigkill" / f"run{i}.json", lambda i=i, n=n: kill_run(work / "sigkill", cache, ref, i, seed, n)
        )
        runs.append(r)
        landed, i = landed + r["kills"], i + 1
    return aggregate(runs, landed, f"{len(runs)} runs, each killed up to {per_run} times")


# -- 2. SIGTERM / SIGINT: a clean stop at a stage boundary, then resume -------------------------------------
def stop_run(work: Path, cache: Path, ref: dict, sig: int, i: int, seed: int) -> dict:
    rng = random.Random(f"stop:{seed}:{sig}:{i}")
    out = work / f"{signal.Signals(sig).name.lower()}{i}"
    cfg, run_dir, log = write_config(out, cache), out / "soak", out / "log.txt"
    proc = cli(["run", str(cfg)], log)
    while not (run_dir / "ledger.sqlite").exists() and proc.poll() is None:
        time.sleep(0.1)  # the handler is installed by then; a signal during the imports kills outright
    delay = rng.uniform(0.0, 0.8 * ref["seconds"])
    try:
        proc.wait(timeout=delay)
        return {
            "signals": 0,
            "survived": True,
            "note": "finished before the signal",
            **compare(ref["record"], record(run_dir)),
        }
    except subprocess.TimeoutExpired:
        proc.send_signal(sig)
    rc, said = proc.wait(), tail(log, 3000)
    if (run_dir / "summary.json").exists():  # it came after the last stage: the run finished (exit 0, or the
        # signal's own death when it landed in the interpreter's shutdown, after Python's handlers are gone)
        note = f"the signal came after the last stage; the run finished (exit {rc})"
        return {"signals": 1, "exit": rc, "survived": True, "note": note, **compare(ref["record"], record(run_dir))}
    clean = rc == 128 + sig and "stopped at a stage boundary" in said and "Traceback" not in said
    ledger = Ledger(run_dir / "ledger.sqlite")
    consistent = ledger.con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    last = ledger.last_finished()
    ledger.close()
    rc2 = finish(cfg, run_dir, log)
    result = {"signals": 1, "delay": round(delay, 1), "exit": rc, "clean_stop": clean, "ledger_ok": consistent}
    result |= {"stopped_after": last, "message": said.strip().splitlines()[-1:] if said else []}
    if rc2 != 0:
        return {**result, "survived": False, "log": tail(log)}
    return {**result, "survived": clean and consistent, **compare(ref["record"], record(run_dir))}


def stops(work: Path, cache: Path, ref: dict, seed: int, sig: int, n: int) -> dict:
    name = signal.Signals(sig).name.lower()
    runs = [
        cell(work / name / f"{i}.json", lambda i=i: stop_run(work / name, cache, ref, sig, i, seed)) for i in range(n)
    ]
    return aggregate(runs, sum(r["signals"] for r in runs), f"{n} runs, one {name.upper()} each after a random delay")


# -- 3. disk full under the run directory ----------------------------------------------------------------
MOUNT = Path("/mnt/soakfull")


def damage(run_dir: Path) -> list[str]:
    """Shards and checkpoint weight files that do not read whole."""
    bad = [str(p) for p, _ in RolloutStore(run_dir / "store").unreadable()]
    ckpts = run_dir / "checkpoints"
    dirs = [c for c in (ckpts.iterdir() if ckpts.is_dir() else []) if "." not in c.name]  # not a save's .tmp
    return bad + [str(p) for c in dirs for p, _ in damaged(c)]


def full_run(cache: Path, ref: dict, size_mb: float, log: Path) -> dict:
    """A run on a tmpfs of `size_mb`: it must stop with one clear line, leave nothing damaged, and resume
    once the tmpfs is grown."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(size_mb * 1024)}k", "tmpfs", str(MOUNT)], check=True)
    try:
        cfg = write_config(MOUNT / "out", cache)
        run_dir = MOUNT / "out" / "soak"
        rc = cli(["run", str(cfg)], log).wait()
        said = tail(log, 2000)
        if rc == 0:
            return {"size_mb": size_mb, "signals": 0, "survived": True, "note": "the run fitted"}
        clean = "no space left on the device holding" in said and "Traceback" not in said
        bad = damage(run_dir)
        subprocess.run(["mount", "-o", "remount,size=256m", str(MOUNT)], check=True)
        rc2 = finish(cfg, run_dir, log)
        out = {"size_mb": size_mb, "signals": 1, "exit": rc, "clean_error": clean, "damaged": bad, "resume_exit": rc2}
        out["message"] = [ln for ln in said.splitlines() if "error" in ln][-1:]
        if rc2 != 0:
            return {**out, "survived": False}
        return {**out, "survived": clean and not bad, **compare(ref["record"], record(run_dir))}
    finally:
        subprocess.run(["umount", str(MOUNT)], check=False)


def disk_full(work: Path, cache: Path, ref: dict) -> dict:
    if os.geteuid() != 0:
        return {
            "injected": 0,
            "survived": 0,
            "lost": 0,
            "duplicated": 0,
            "same_decisions": None,
            "notes": "not run: mounting a tmpfs needs root",
        }
    MOUNT.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    # The whole run takes ~6 MB: these fill it in round 1's start, segment, trial and round 2.
    sizes = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0)
    runs = [cell(work / f"{mb}.json", lambda mb=mb: full_run(cache, ref, mb, work / f"{mb}.log")) for mb in sizes]
    return aggregate(
        runs, sum(r["signals"] for r in runs), f"tmpfs of {', '.join(map(str, sizes))} MB, grown to 256 MB"
    )


# -- 4. a damaged shard or checkpoint file ---------------------------------------------------------------
def kill_at(cfg: Path, run_dir: Path, log: Path, pattern: str) -> None:
    """Start the run and SIGKILL it once a file matching `pattern` exists under the run directory."""
    proc = cli(["run", str(cfg)], log)
    while not list(run_dir.glob(pattern)):
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended before {pattern}: {tail(log)}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def damaged_run(work: Path, cache: Path, ref: dict, case: str, kill: str, victim, committed: bool) -> dict:
    """Kill a run at `kill`, truncate the file `victim(run_dir)` picks to half, resume. A file of unfinished
    work must be named and its arm redone (same records as the reference); one of a committed branch must be
    named in a refusal (exit 2, no traceback)."""
    out = work / case
    cfg, run_dir, log = write_config(out, cache), out / "soak", out / "log.txt"
    kill_at(cfg, run_dir, log, kill)
    path = victim(run_dir)
    os.truncate(path, path.stat().st_size // 2)
    rc = cli(["resume", str(run_dir)], log).wait()
    said = tail(log, 4000)
    named = str(path) in said.replace("\n", "") and "Traceback" not in said
    res = {"case": case, "file": str(path.relative_to(run_dir)), "exit": rc, "named": named, "signals": 1}
    if committed:
        return {**res, "survived": rc == 2 and named, "refused": rc == 2}
    if rc != 0:
        return {**res, "survived": False, "log": tail(log)}
    return {**res, "survived": named, **compare(ref["record"], record(run_dir))}


def newest(d: str):
    return lambda run_dir: max((run_dir / d).glob("*.parquet"), key=lambda p: p.stat().st_mtime_ns)


def corrupt_shard(work: Path, cache: Path, ref: dict) -> dict:
    trial = "store/rollouts/r01-c1-s*.parquet"
    runs = [
        cell(
            work / "newest.json",
            lambda: damaged_run(work, cache, ref, "newest", trial, newest("store/rollouts"), False),
        ),
        cell(
            work / "committed.json",
            lambda: damaged_run(
                work, cache, ref, "committed", trial, lambda r: r / "store/rollouts/r01-seg-s000001.parquet", True
            ),
        ),
    ]
    return aggregate(
        runs, len(runs), "killed mid-trial; the newest shard (unfinished arm), then a committed segment shard"
    )


def corrupt_checkpoint(work: Path, cache: Path, ref: dict) -> dict:
    trial = "store/rollouts/r01-c1-s*.parquet"
    cases = [
        ("weights", trial, lambda r: r / "checkpoints/r01-ctl/model.safetensors", False),
        ("optimizer", trial, lambda r: r / "checkpoints/r01-ctl/optimizer.pt", False),
        (
            "committed",
            "store/rollouts/r02-seg-s*.parquet",
            lambda r: r / "checkpoints/r01-ctl/model.safetensors",
            True,
        ),
    ]
    runs = [
        cell(work / f"{c}.json", lambda c=c, k=k, v=v, m=m: damaged_run(work, cache, ref, c, k, v, m))
        for c, k, v, m in cases
    ]
    return aggregate(runs, len(runs), "a finished arm of the unfinished trial (weights, optimizer), a committed one")


# -- main --------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20, help="SIGKILLs to land, over as many runs as that takes")
    ap.add_argument("--stops", type=int, default=4, help="runs stopped by SIGTERM, and as many by SIGINT")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=scratch("soak"), help="cells and run directories (scratch)")
    ap.add_argument("--cache", type=Path, default=scratch("soak-cache"), help="the warm start, built once")
    ap.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    ap.add_argument("--only", nargs="*", help="faults to run (default: all)")
    a = ap.parse_args(argv)
    w = a.work
    ref = cell(w / "reference.json", lambda: reference(w, a.cache))
    faults = {
        "sigkill": lambda: sigkill(w, a.cache, ref, a.seed, a.kills),
        "sigkill_commit": lambda: commit_kills(w / "sigkill_commit", a.cache, ref),
        "sigterm": lambda: stops(w, a.cache, ref, a.seed, signal.SIGTERM, a.stops),
        "sigint": lambda: stops(w, a.cache, ref, a.seed, signal.SIGINT, a.stops),
        "disk_full": lambda: disk_full(w / "disk_full", a.cache, ref),
        "corrupt_shard": lambda: corrupt_shard(w / "corrupt_shard", a.cache, ref),
        "corrupt_checkpoint": lambda: corrupt_checkpoint(w / "corrupt_checkpoint", a.cache, ref),
        "skills_concurrent": lambda: skills_concurrent(w / "skills", a.seed),
        "sandbox_worker": lambda: sandbox_worker(w / "sandbox", a.seed),
    }
    results = json.loads(a.out.read_text()) if a.out.exists() else {}
    for name, run in faults.items():
        if a.only and name not in a.only:
            continue
        print(f"{name} ...", flush=True)
        results[name] = cell(w / f"{name}.json", run)
        r = results[name]
        print(
            f"  injected {r['injected']}, survived {r['survived']}, lost {r['lost']}, duplicated "
            f"{r['duplicated']}, same decisions {r['same_decisions']}",
            flush=True,
        )
        results = {k: results[k] for k in [*faults, *results] if k in results}  # in the faults' order
        note = "the config is tests/conftest.py's small one (evotrainer.testing.small_raw, soak_runs.write_config)"
        write_result(a.out, results, work=w, no_config=True, note=note)


if __name__ == "__main__":
    main()
