"""Why a run's trials ended as they did, read from the ledgers of finished loop runs: each trial's change (a pair's
both), decision, reasons, the gate tasks its candidate won and lost against the control, where the race stopped it,
and, where the gate's test decided, its p against the round's level. Counts the candidates stopped at the race's
first checkpoint (`stopping.futile`: not strictly ahead there) and, of those, the ones that were level with the
control on every gate task, so no read yet told them apart; and the candidates ahead of the control whose p fell
short of their round's share of the run's error rate (the gate's power, not its candidates, bound there).

    python -m benchmarks.trial_stops --out benchmarks/results/NAME.json RUN_DIR [RUN_DIR ...]

RUN_DIR is a run's directory (the one holding ledger.sqlite), e.g. a claims cell's $WORK/DOMAIN-ARM-SEED."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from benchmarks.manifest import write_result
from evotrainer.backtest.stopping import FIRST_CHECKPOINT
from evotrainer.harness.interventions import Intervention
from evotrainer.store.ledger import Ledger


def trials(run: Path) -> list[dict]:
    """One record per decided trial of the run, in order."""
    ledger = Ledger(run / "ledger.sqlite")
    try:
        changes = {t["id"]: t["intervention"] for t in ledger.trials()}
        verdicts = ledger.verdicts()
    finally:
        ledger.close()
    out = []
    for v in verdicts:
        st, iv = v["statistic"], changes[v["trial"]]
        out.append(
            {
                "trial": v["trial"],
                "round": v["round"],
                "change": Intervention.model_validate(iv).describe(),  # a pair's both changes
                "decision": v["decision"],
                "reasons": v["reasons"],
                "wins": st.get("wins"),
                "losses": st.get("losses"),
                "stopped": st.get("stopped") or "",
                "delta": st.get("delta"),
                "p": st.get("p"),  # the gate's test, where it decided (a race stopped early has none)
                "alpha": None if st.get("p") is None or "level" not in st else round(1 - st["level"], 9),
            }
        )
    return out


def summary(records: list[dict]) -> dict:
    first = [r for r in records if FIRST_CHECKPOINT in r["stopped"]]
    return {
        "trials": len(records),
        "stopped_at_first_checkpoint": len(first),
        "level_on_every_gate_task": sum(1 for r in first if r["wins"] == r["losses"] == 0),
        "tested_by_the_gate": sum(1 for r in records if r["alpha"] is not None),
        "ahead_short_of_the_level": sum(
            1 for r in records if r["alpha"] is not None and r["delta"] > 0 and r["p"] > r["alpha"]
        ),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.trial_stops", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories, each holding ledger.sqlite")
    ap.add_argument("--out", type=Path, required=True, help="where the JSON goes (a manifest beside it)")
    a = ap.parse_args(argv)
    for run in a.runs:
        if not (run / "ledger.sqlite").is_file():
            raise SystemExit(f"runs: {run} holds no ledger.sqlite; pass a finished run's directory")
    per_run = {run.name: trials(run) for run in a.runs}
    every = [r for rs in per_run.values() for r in rs]
    out = {"all": summary(every), "runs": {n: {"summary": summary(rs), "trials": rs} for n, rs in per_run.items()}}
    work = Path(os.path.commonpath([r.resolve().parent for r in a.runs]))  # $WORK in the manifest's command
    write_result(a.out, out, work=work, no_config=True)
    print(json.dumps(out["all"]))


if __name__ == "__main__":
    main()
