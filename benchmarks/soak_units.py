"""The soak's faults of one component rather than of a loop run (benchmarks/soak.py runs them): two
processes writing one skill library at once, and a sandbox worker killed mid-job."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.paths import ROOT
from evotrainer.envs.code.domain import CodeDomain
from evotrainer.harness.interventions import Hypothesis, Intervention
from evotrainer.skills.library import Evidence, SkillLibrary

ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(ROOT)}


# -- 5. two runs writing one skill library at once ---------------------------------------------------------
TARGETS = ("optimizer.learning_rate", "sampling.temperature", "sampling.max_completion_length")


def skill_writer(lib: str, run: str, n: int) -> None:
    """One 'run' recording `n` trial outcomes into the library, on three skills both writers share."""
    library, hyp = SkillLibrary(lib), Hypothesis(finding="soak", signal="heldout/accuracy", direction="up")
    for i in range(n):
        iv = Intervention(kind="set_knob", target=TARGETS[i % 3], value=1, hypothesis=hyp)
        decision = "promote" if i % 2 else "reject"
        library.record(iv, Evidence(run=run, round=i, trial=f"t{i}", decision=decision), source="soak", create=True)


def skills_concurrent(work: Path, seed: int, n: int = 300) -> dict:
    lib = work / "library"
    code = "import sys; from benchmarks.soak_units import skill_writer as w; w(*sys.argv[1:3], int(sys.argv[3]))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(lib), run, str(n)], env=ENV, cwd=ROOT) for run in ("a", "b")
    ]
    rcs = [p.wait() for p in procs]
    try:
        skills, torn = SkillLibrary(lib).all(), ""
    except Exception as e:  # a torn skill file: the library refuses to read it
        skills, torn = [], str(e)[:300]
    got = [(e.run, e.trial) for s in skills for e in s.evidence]
    want = {(run, f"t{i}") for run in ("a", "b") for i in range(n)}
    lost = len(want - set(got))
    ok = rcs == [0, 0] and not torn
    return {
        "injected": 2 * n,
        "survived": 2 * n - lost if ok else 0,
        "lost": lost,
        "duplicated": len(got) - len(set(got)),
        "same_decisions": None,
        "notes": f"2 processes x {n} records on {len(TARGETS)} shared skills; exits {rcs}; "
        f"{len(skills)} skills, {len(got)} evidence records{'; torn: ' + torn if torn else ''}",
    }


# -- 6. a sandbox worker killed mid-job -------------------------------------------------------------------
def worker_pid(pool) -> int | None:
    """The busy pool worker's Python process (inside its sandbox): the topmost `python -S -I -c` under it.
    Killing bwrap outside it would not do: the sandbox outlives it by design (no --die-with-parent)."""
    with pool._lock:
        busy = [w for w in pool._all if w not in pool._idle and w.proc.poll() is None]
    if not busy:
        return None
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, ppid = int(stat.parent.name), int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(pid)
    todo = [busy[0].proc.pid]
    while todo:
        pid = todo.pop(0)
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\x00")
        except OSError:
            argv = []
        # The interpreter itself, not bwrap (whose own arguments name it) nor a forked job (its child).
        if argv and Path(argv[0].decode()).name.startswith("python") and argv[1:4] == [b"-S", b"-I", b"-c"]:
            return pid
        todo += kids.get(pid, [])
    return None


def sandbox_worker(work: Path, seed: int, n: int = 5) -> dict:
    rng, domain = random.Random(f"sandbox:{seed}"), CodeDomain(seed=0, train_size=400, heldout_size=48)
    task = next(t for t in domain.tasks("heldout") if t.data["family"] == "arith")
    body = f"    return {task.data['spec']['body']}\n\n"
    slow = "    import sys, time\n    if not hasattr(sys, 'slept'):\n        sys.slept = time.sleep(1.5)\n" + body
    runs = []
    try:
        for _ in range(n):
            delay, env = rng.uniform(0.2, 1.0), domain.make_env()

            def strike(delay: float) -> None:
                t0 = time.monotonic()
                while (pid := worker_pid(domain.pool)) is None and time.monotonic() - t0 < 30:
                    time.sleep(0.01)
                time.sleep(delay)
                os.kill(pid, signal.SIGKILL)

            killer = threading.Thread(target=strike, args=(delay,))
            env.reset(task)
            killer.start()
            _, _, info = env.step(slow)
            killer.join()
            env.reset(task)
            _, _, after = env.step(body)
            infra = info.get("termination") == "error" and info.get("exec") == "sandbox"
            next_ok = after.get("exec") == "ok" and after["visible_passed"] == after["visible_total"]
            runs.append({"delay": round(delay, 2), "killed": info, "next": after, "infra": infra, "next_ok": next_ok})
    finally:
        domain.close()
    good = sum(r["infra"] and r["next_ok"] for r in runs)
    return {
        "injected": n,
        "survived": good,
        "lost": 0,
        "duplicated": 0,
        "same_decisions": None,
        "notes": f"worker Python SIGKILLed 0.2-1.0 s into a 1.5 s job; {good} of {n} recorded as a sandbox "
        "(infrastructure) error and the next job passed",
        "runs": runs,
    }
