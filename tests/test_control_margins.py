"""benchmarks/control_margins.py on a real healthy control: the pressed suite reports the statistic each default
detector holds to its bar, so a margin beyond its bar is exactly a finding the default suite fired."""

from __future__ import annotations

import json

import numpy as np

from benchmarks.control_margins import main
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.run import BRANCH


def test_margins_agree_with_the_default_suite_and_a_read_cell_is_not_run_again(tmp_path, capsys):
    out, work = tmp_path / "margins.json", tmp_path / "work"
    main(["--controls", "healthy", "--seeds", "0", "--work", str(work), "--out", str(out)])
    [cell] = json.loads(out.read_text())["cells"]
    assert (cell["control"], cell["seed"], cell["threads"]) == ("healthy", 0, 2)
    # Math is single-turn: no tool errors or capped episodes to report; the other three always report.
    assert {"plateau", "zero_variance_groups", "truncation"} <= set(cell["margins"])
    for name, m in cell["margins"].items():
        beyond = m["value"] < m["bar"] if m["fires_when"] == "below" else m["value"] > m["bar"]
        assert beyond == (name in cell["fired"]), (name, m, cell["fired"])
    # plateau's statistic is the reward's least-squares slope per step, read here from the stored metrics.
    [store] = work.rglob("store")
    reward = np.array([m["reward"] for _, m in sorted(RolloutStore(store).metrics(BRANCH).items())])
    slope = np.polyfit(np.arange(1, len(reward) + 1), reward, 1)[0]
    assert np.isclose(cell["margins"]["plateau"]["value"], abs(slope), rtol=1e-6, atol=1e-9)
    third = len(reward) // 3
    assert np.isclose(cell["reward_rise"], reward[-third:].mean() - reward[:third].mean())
    e0, e1 = cell["entropy_thirds"]
    assert 0 < e1 and 0 < e0
    # A second call finds the cell and trains nothing.
    capsys.readouterr()
    main(["--controls", "healthy", "--seeds", "0", "--work", str(work), "--out", str(out)])
    assert capsys.readouterr().out == "" and len(json.loads(out.read_text())["cells"]) == 1
