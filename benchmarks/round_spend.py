"""Where a loop run's generated tokens went, round by round, read from the ledgers of finished runs: each round's
tokens in its segment, its trial arms and everything else it charged (gate reads of the guard, the start's read), and
how much of the round's training the final head's lineage kept. A round that repairs an exploit costs what its race
and confirmation cost, and keeps one arm; this says how much.

    python -m benchmarks.round_spend --out benchmarks/results/NAME.json RUN_DIR [RUN_DIR ...]

RUN_DIR is a run's directory (the one holding ledger.sqlite), e.g. a claims cell's $WORK/DOMAIN-ARM-SEED."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from benchmarks.manifest import write_result
from evotrainer.stages.results import read_stage
from evotrainer.stages.spend import lineage
from evotrainer.store.ledger import Ledger


def rounds(run: Path) -> dict:
    """Per round: tokens charged (segment, trial arms, other), tokens of its branches the final head's lineage kept."""
    ledger = Ledger(run / "ledger.sqlite")
    try:
        head = read_stage(ledger, 0, "final").head.branch
        kept = lineage(ledger, head)
        kind = {b["id"]: b["kind"] for b in ledger.branches()}
        per: dict[int, dict[str, int]] = {}
        for c in ledger.rows("SELECT round, stage, item, generated_tokens AS g FROM charges"):
            r = per.setdefault(c["round"], {"segment": 0, "trial_arms": 0, "other": 0, "kept": 0})
            what = kind.get(c["item"])
            r["segment" if what == "segment" else "trial_arms" if what else "other"] += c["g"]
            r["kept"] += c["g"] if c["item"] in kept else 0
    finally:
        ledger.close()
    total = sum(sum(v for k, v in r.items() if k != "kept") for r in per.values())
    return {
        "final_head": head,
        "generated_tokens": total,
        "kept_tokens": sum(r["kept"] for r in per.values()),
        "rounds": {str(k): per[k] for k in sorted(per)},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.round_spend", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories, each holding ledger.sqlite")
    ap.add_argument("--out", type=Path, required=True, help="where the JSON goes (a manifest beside it)")
    a = ap.parse_args(argv)
    for run in a.runs:
        if not (run / "ledger.sqlite").is_file():
            raise SystemExit(f"runs: {run} holds no ledger.sqlite; pass a finished run's directory")
    out = {f"{run.parent.name}/{run.name}": rounds(run) for run in a.runs}  # a cell name recurs across work dirs
    work = Path(os.path.commonpath([r.resolve().parent for r in a.runs]))  # $WORK in the manifest's command
    write_result(a.out, out, work=work, no_config=True)
    for name, r in out.items():
        one = r["rounds"].get("1", {})
        spent1 = sum(v for k, v in one.items() if k != "kept")
        kept1 = one.get("kept", 0)
        print(json.dumps({"run": name, "round_1": spent1, "round_1_kept": kept1, "total": r["generated_tokens"]}))


if __name__ == "__main__":
    main()
