"""benchmarks/plant_margins.py on real plants: the plant's detector, its bar out of reach, reports the statistic the
default suite holds to that bar, so a reading beyond the bar is exactly the finding the default suite fired."""

from __future__ import annotations

import json

import numpy as np

from benchmarks.control_margins import FAILURES
from benchmarks.plant_margins import PLANTS, main
from evotrainer.diagnostics.suite import BUILTIN
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.run import BRANCH


def test_every_reading_presses_parameters_its_detector_has():
    # A renamed parameter would press nothing: the plant's reading would then be null, or the default bar's.
    for plant, r in PLANTS.items():
        assert (FAILURES / f"{plant}.yaml").exists(), plant
        params = BUILTIN[r.detector][1]
        assert r.bar in params and set(r.pressed) <= set(params), plant
        assert r.fires_when in ("below", "above"), plant


def test_a_plants_reading_agrees_with_the_default_suite(tmp_path):
    out, work = tmp_path / "plants.json", tmp_path / "work"
    main(["--plants", "plateau", "entropy_collapse", "--seeds", "0", "--work", str(work), "--out", str(out)])
    cells = {c["plant"]: c for c in json.loads(out.read_text())["cells"]}
    assert sorted(cells) == ["entropy_collapse", "plateau"]
    for plant, cell in cells.items():
        r = cell["reading"]
        assert r["bar"] == BUILTIN[PLANTS[plant].detector][1][PLANTS[plant].bar]
        below = r["fires_when"] == "below"
        beyond = r["value"] is not None and (r["value"] < r["bar"] if below else r["value"] > r["bar"])
        assert beyond == (r["finding"] in cell["fired"]), (plant, r, cell["fired"])
    # plateau's statistic is the reward's least-squares slope per step, read here from the stored metrics; the
    # plant is frozen (learning rate 0), so it is near zero whatever it reads.
    [store] = work.rglob("plateau-0/store")
    reward = np.array([m["reward"] for _, m in sorted(RolloutStore(store).metrics(BRANCH).items())])
    slope = np.polyfit(np.arange(1, len(reward) + 1), reward, 1)[0]
    assert np.isclose(cells["plateau"]["reading"]["value"], abs(slope), rtol=1e-6, atol=1e-9)
    # entropy_collapse's statistic is the last third's mean entropy, the reading's second third.
    e = cells["entropy_collapse"]
    assert e["reading"]["value"] is None or np.isclose(e["reading"]["value"], e["entropy_thirds"][1])
