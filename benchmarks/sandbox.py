"""Cost of sandboxed execution, side by side in one run: a plain `python -S -c pass` subprocess, the
same under the sandbox (`sandbox.run`), and one job on a warm `WorkerPool` (an empty job, and a
code-domain test run: the model's function called on 12 inputs).

    python -m benchmarks.sandbox [--n 100]

Prints the active isolation layers and a Markdown table of per-job milliseconds (median and p90).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.tables import markdown_table
from evotrainer import sandbox
from evotrainer.envs.code.domain import DRIVER
from evotrainer.sandbox import WorkerPool

TEST_RUN = (
    "def f(a, b):\n    return a * 2 + b\n",
    {"tag": "t0", "entry": "f", "io": [[i, i + 1] for i in range(12)], "asserts": []},
)


def timed(fn, n: int) -> list[float]:
    fn()  # warm-up (starts the pool's worker, fills the page cache)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(1000 * (time.perf_counter() - t0))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sandbox", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100)
    args = ap.parse_args(argv)
    py = sandbox.python_executable()
    print("mechanisms:", {k: v for k, v in sandbox.mechanisms().items()})
    rows = []
    rows.append(
        (
            "plain subprocess `python -S -c pass`",
            timed(lambda: subprocess.run([py, "-S", "-c", "pass"], check=True), args.n),
        )
    )

    def sandboxed():
        with tempfile.TemporaryDirectory() as d:
            assert sandbox.run([py, "-S", "-I", "-c", "pass"], Path(d)).ok

    rows.append(("`sandbox.run` of `python -S -I -c pass` (incl. temp dir)", timed(sandboxed, args.n)))
    with WorkerPool(1) as pool:
        rows.append(("`WorkerPool.run_python('pass')`", timed(lambda: pool.run_python("pass"), args.n)))
        src, data = TEST_RUN

        def test_run():
            r = pool.run_python(DRIVER, {"solution.py": src}, stdin=json.dumps(data))
            assert r.ok, r.stderr

        rows.append(("`WorkerPool` code-domain test run (12 calls)", timed(test_run, args.n)))
    base = statistics.median(rows[0][1])
    lines = []
    for name, ms in rows:
        med, p90 = statistics.median(ms), statistics.quantiles(ms, n=10)[-1]
        lines.append([name, f"{med:.1f}", f"{p90:.1f}", f"{med / base:.2f}x"])
    print()
    print(markdown_table([f"measurement (n={args.n})", "median ms", "p90 ms", "vs plain subprocess"], lines))


if __name__ == "__main__":
    main()
