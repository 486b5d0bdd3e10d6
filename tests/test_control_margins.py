"""benchmarks/control_margins.py on the real healthy controls: the pressed suite reports the statistic each default
detector holds to its bar, so a margin beyond its bar is exactly a finding the default suite fired."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.control_margins import BARS, main
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.run import BRANCH


def test_margins_agree_with_the_default_suite_and_a_read_cell_is_not_run_again(tmp_path, capsys):
    out, work = tmp_path / "margins.json", tmp_path / "work"
    args = ["--controls", "healthy", "healthy_digits", "--seeds", "0", "--work", str(work), "--out", str(out)]
    main(args)
    cells = {c["control"]: c for c in json.loads(out.read_text())["cells"]}
    assert sorted(cells) == ["healthy", "healthy_digits"]
    for control, cell in cells.items():
        assert set(cell["margins"]) == set(BARS)
        for name, m in cell["margins"].items():
            beyond = m["value"] < m["bar"] if m["fires_when"] == "below" else m["value"] > m["bar"]
            assert beyond == (name in cell["fired"]), (control, name, m, cell["fired"])
        # plateau's statistic is the reward's least-squares slope per step, read here from the stored metrics.
        [store] = work.rglob(f"{control}-0/store")
        reward = np.array([m["reward"] for _, m in sorted(RolloutStore(store).metrics(BRANCH).items())])
        slope = np.polyfit(np.arange(1, len(reward) + 1), reward, 1)[0]
        assert np.isclose(cell["margins"]["plateau"]["value"], abs(slope), rtol=1e-6, atol=1e-9)
        third = len(reward) // 3
        assert np.isclose(cell["reward_rise"], reward[-third:].mean() - reward[:third].mean())
        assert all(e > 0 for e in cell["entropy_thirds"])
    # Math is single-turn: no tool error or capped episode to count. The digits game is multi-turn, and a sampled
    # command is malformed now and then: a share above zero, read.
    assert cells["healthy"]["margins"]["tool_errors"]["value"] == cells["healthy"]["margins"]["turn_cap"]["value"] == 0
    assert cells["healthy_digits"]["margins"]["tool_errors"]["value"] > 0
    # A second call finds the cells and trains nothing.
    capsys.readouterr()
    main(args)
    assert capsys.readouterr().out == "" and len(json.loads(out.read_text())["cells"]) == 2


def test_a_kernel_cap_neither_library_knows_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    # oneDNN ignores an ISA name it does not know: the cell would record a cap it did not run under.
    out = tmp_path / "margins.json"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    with pytest.raises(SystemExit) as done:
        main(["--controls", "healthy", "--seeds", "0", "--work", str(tmp_path / "work"), "--out", str(out)])
    assert done.value.code == 2 and not out.exists() and not (tmp_path / "work").exists()
    assert "ONEDNN_MAX_CPU_ISA='avx2' is not one of" in capsys.readouterr().err
