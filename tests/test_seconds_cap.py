"""The seconds caps are safety nets that say when they cut a run: budget.seconds for the loop and
train.max_seconds for `evotrainer train`. A cut run's decisions are a shorter run's and depend on the
machine's speed, so the console, summary.json, `evotrainer status` and the report all say so."""

from __future__ import annotations

import io

from rich.console import Console

from conftest import small_config
from evotrainer.cli.loop import run_state
from evotrainer.loop import run_loop
from evotrainer.training.run import train_run


def test_a_loop_run_cut_by_budget_seconds_says_so_everywhere(tmp_path, math_setup):
    # Round 0 (the base's read of the final tasks) takes longer than a millisecond on any machine, so the
    # seconds cap stops the run before round 1, with a token budget and rounds left.
    cfg = small_config(
        tmp_path,
        loop={"segment_steps": 2, "trial_steps": 2, "max_rounds": 2, "skills_dir": str(tmp_path / "skills")},
        budget={"generated_tokens": 1_000_000, "seconds": 0.001},
    )
    out = io.StringIO()
    summary = run_loop(cfg, Console(file=out, width=200))
    assert summary["cut_by_seconds"] is True and summary["stop_reason"] == "budget.seconds spent"
    assert summary["rounds"] == 0
    assert "CUT SHORT by budget.seconds" in out.getvalue()
    run = tmp_path / "runs" / "t"
    state = run_state(run)
    assert state.finished and state.rows["cut short"].startswith("CUT SHORT by budget.seconds")
    assert "CUT SHORT by budget.seconds" in (run / "report.html").read_text()


def test_a_static_run_cut_by_train_max_seconds_says_so(tmp_path, math_setup):
    cfg = small_config(tmp_path, train={"steps": 3, "max_seconds": 0.001})
    out = io.StringIO()
    summary = train_run(cfg, Console(file=out, width=200))
    assert summary["cut_by_seconds"] is True and summary["steps"] == 1
    assert "CUT SHORT by train.max_seconds" in out.getvalue()
