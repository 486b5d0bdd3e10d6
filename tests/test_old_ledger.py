"""A run written before the typed records (tests/fixtures/before_typed_records: its ledger as SQL, its config,
summary and report's verdicts) reads with today's models: every stage result, trial and verdict loads and writes
back the JSON it was read from, `evotrainer report` shows its verdicts as the version that wrote it did, and
`evotrainer resume` replays it to the same summary."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evotrainer.backtest import gate
from evotrainer.backtest.verdict import RaceResult, SignHolm, TwoStage, read_trials, read_verdicts
from evotrainer.cli.main import app
from evotrainer.config import GateSection
from evotrainer.harness.harness import _ADDED_KNOBS, _DEFAULTS
from evotrainer.stages.level import round_level, with_history
from evotrainer.stages.results import STAGE_RESULTS, PromoteResult
from evotrainer.store.ledger import Ledger

FIXTURES = Path(__file__).parent / "fixtures" / "before_typed_records"
TESTS = {"two_stage": {TwoStage, RaceResult}, "sign": {SignHolm}}


def restore(name: str, root: Path) -> Path:
    """The fixture as a run directory under root/runs (where its config says the run lives)."""
    run = root / "runs" / name
    run.mkdir(parents=True)
    con = sqlite3.connect(run / "ledger.sqlite")
    con.executescript((FIXTURES / name / "ledger.sql").read_text())
    con.close()
    shutil.copy(FIXTURES / name / "config.yaml", run / "config.yaml")
    return run


def without_added_knobs(dumped, stored):
    """dumped, less the knobs added since the fixture was written wherever they sit at their defaults and the
    stored JSON lacks them: those are the only keys a reader of today may add to an older record."""
    if isinstance(dumped, list) and isinstance(stored, list):
        return [without_added_knobs(d, s) for d, s in zip(dumped, stored, strict=False)]
    if not (isinstance(dumped, dict) and isinstance(stored, dict)):
        return dumped
    out = {k: without_added_knobs(v, stored.get(k)) for k, v in dumped.items()}
    if {"sampling", "loss", "optimizer"} <= out.keys():  # a harness
        for section, knobs in _ADDED_KNOBS.items():
            for name in knobs:
                if name not in stored.get(section, {}) and out[section].get(name) == _DEFAULTS[section][name]:
                    out[section] = {k: v for k, v in out[section].items() if k != name}
    return out


@pytest.mark.parametrize("name", sorted(TESTS))
def test_every_record_of_an_older_ledger_loads_and_writes_back_its_json(tmp_path, name):
    ledger = Ledger(restore(name, tmp_path) / "ledger.sqlite")
    rows = ledger.rows("SELECT round, stage, result FROM stages")
    assert {r["stage"] for r in rows} == set(STAGE_RESULTS) - {"guard"}  # written before the guard stage
    for r in rows:
        stored = json.loads(r["result"])
        dumped = STAGE_RESULTS[r["stage"]].model_validate(stored).model_dump(mode="json")
        assert without_added_knobs(dumped, stored) == stored, r["stage"]
    trials = ledger.trials()
    assert without_added_knobs([t.model_dump(mode="json") for t in read_trials(ledger)], trials) == trials
    verdicts = read_verdicts(ledger)
    assert [v.model_dump(mode="json") for v in verdicts] == ledger.verdicts()
    assert {type(v.statistic) for v in verdicts} == TESTS[name]
    ledger.close()


@pytest.mark.parametrize("name", sorted(TESTS))
def test_report_and_resume_read_an_older_run(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)  # its config names its cache and skills directories relative to where it ran
    run = restore(name, tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert (FIXTURES / name / "report_verdicts.html").read_text().strip() in (run / "report.html").read_text()
    # The evaluator's identity holds the Python and package versions and the evaluator's code, which differ
    # on another machine and after a change to that code; what is tested here is reading the records.
    result = runner.invoke(app, ["resume", str(run), "--accept-evaluator-change"])
    assert result.exit_code == 0, result.output
    before, after = (json.loads((d / "summary.json").read_text()) for d in (FIXTURES / name, run))
    for key in ("rounds", "stop_reason", "final_accuracy", "harness_version", "promoted", "rejected"):
        assert after[key] == before[key], key
    assert after["rejected_controls"] == before["rejected_controls"]


def test_a_resumed_older_run_counts_its_raced_rounds_from_its_verdicts(tmp_path):
    # Written before the run's error control: its mainline carries no raced rounds. Round 1 raced and promoted,
    # round 2 raced and rejected both, so a third round is the run's third raced round (its share of the run's
    # error rate is the third's, with one promotion behind it), not a first that spends the run's rate afresh.
    ledger = Ledger(restore("two_stage", tmp_path) / "ledger.sqlite")
    [row] = ledger.rows("SELECT result FROM stages WHERE stage = 'promote' AND round = 2")
    head = PromoteResult.model_validate(json.loads(row["result"])).head
    assert head.raced is None and head.promoted_at is None
    past = with_history(ledger, head, 3)
    assert (past.raced, past.promoted_at) == (2, [1])
    level, spent = round_level(GateSection(), past, races=True)
    assert spent == {"raced_round": 3, "run_level": GateSection().level}
    assert 1 - level == pytest.approx(gate.round_alpha(1 - GateSection().level, 3, [1]))
    assert 1 - level < 1 - round_level(GateSection(), head, races=True)[0]  # the count from 1 spent more
    # Within round 2 itself only round 1 is behind it; a mainline that carries its count is read as it is.
    assert (with_history(ledger, head, 2).raced, with_history(ledger, head, 2).promoted_at) == (1, [1])
    carried = head.model_copy(update={"raced": 5})
    assert with_history(ledger, carried, 3) is carried
    ledger.close()
