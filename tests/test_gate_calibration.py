"""The gate calibration's resampling (benchmarks/gate_calibration.py) on planted pools: a round's arms are distinct,
the race stops a candidate where stopping.futile says, a planted large gain is promoted on every path and arms of one
harness mostly are not."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.gate_calibration import Exhausted, PoolRound, first_rounds, main, resampled
from benchmarks.gate_paths import PATHS
from benchmarks.paths import RESULTS

TASKS = 250


def _arm(rng: np.random.Generator, skill: float, curve_skill: float | None = None) -> dict:
    """Outcomes of an arm whose tasks pass with probability `skill`; its checkpoint reads at `curve_skill`."""
    ids = [f"t{i}" for i in range(TASKS)]

    def read(p: float) -> dict[str, bool]:
        return dict(zip(ids, (rng.random(TASKS) < p).tolist(), strict=True))

    c = skill if curve_skill is None else curve_skill
    return {"curve": {"10": read(c), "20": read(c), "30": read(c)}, "final": read(skill)}


def _pool(seed: int, null: float = 0.5, fix: float = 0.5, n_null: int = 10, n_fix: int = 4) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "domain": "planted",
        "base_seed": seed,
        "start": _arm(rng, null)["final"],
        "nulls": [_arm(rng, null) for _ in range(n_null)],
        "fixes": [_arm(rng, fix) for _ in range(n_fix)],
    }


def test_a_round_draws_each_arm_once_and_a_thin_pool_says_so():
    pool = _pool(0, n_null=4)
    r = PoolRound(pool, np.random.default_rng(1), stand_in=True)
    drawn = [r.start] + [r.arm() for _ in range(3)]
    assert len({id(a) for a in drawn}) == 4
    with pytest.raises(Exhausted):
        r.arm()
    # A bootstrap pool repeats arms; a round still never draws one twice.
    boot = resampled([pool], np.random.default_rng(2))[0]
    r = PoolRound(boot, np.random.default_rng(3), stand_in=False)
    seen = []
    with pytest.raises(Exhausted):
        while True:
            seen.append(id(r.arm()))
    assert len(seen) == len(set(seen)) == len({id(a) for a in boot["nulls"]})


def test_the_race_stops_a_candidate_behind_at_its_first_checkpoint():
    rng = np.random.default_rng(4)
    control, behind, ahead = _arm(rng, 0.5, 0.5), _arm(rng, 0.5, 0.2), _arm(rng, 0.5, 0.8)
    pool = {"start": {}, "nulls": [control, behind, ahead], "fixes": []}
    r = PoolRound(pool, np.random.default_rng(5), stand_in=False)
    arms = {id(r.arm()): None for _ in range(3)}
    assert len(arms) == 3
    assert r.stopped(behind["final"], control["final"]) and not r.stopped(ahead["final"], control["final"])


@pytest.mark.parametrize("path", [p for p in PATHS if p != "sign"])
def test_a_planted_large_gain_is_promoted_and_equal_arms_rarely_are(path):
    pools = [_pool(s, null=0.5, fix=0.8) for s in (10, 11, 12)]
    rng = np.random.default_rng(6)
    assert np.mean(first_rounds(pools, rng, path, 1, 40, fix=True)) > 0.9
    # Arms of one harness whose tasks pass independently: the A-A pairs sit at the binomial floor, far below the
    # noise prior's centre, so the first round's level (0.0125) is kept with room to spare.
    assert np.mean(first_rounds(pools, rng, path, 2, 200, fix=False)) < 0.05


def test_a_pool_too_small_for_the_rounds_is_refused_before_any_arm_trains(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--ks", "1", "9", "--nulls", "12", "--fixes", "10", "--work", str(tmp_path / "w")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--fixes (10)" in err and "K + 4 = 13" in err
    assert not (tmp_path / "w").exists()  # nothing built


def test_the_committed_calibration_holds_every_gate_mode_in_use_at_or_under_its_nominal_rates():
    """What benchmarks/RESULTS.md and the README say of the committed rows: every path a new run can take is at or
    under nominal, per round and per run, on both domains and both null families; the refused mode (`sign`) is
    kept to show why it is refused."""
    rows = json.loads((RESULTS / "gate_calibration.json").read_text())
    assert {r["domain"] for r in rows} == {"math", "digits"} and len({r["null"] for r in rows}) == 2
    in_use = [r for r in rows if r["gate_mode"] == "in use"]
    assert {r["path"] for r in in_use} == set(PATHS) - {"sign"} and {r["K"] for r in in_use} == {1, 2}
    for r in in_use:
        assert r["false_promotion_rate"]["rate"] <= r["nominal"], r
        assert r["per_run_false_promotion_rate"]["rate"] <= r["nominal_run"], r
    assert all(r["gate_mode"] == "refused for new runs" for r in rows if r["path"] == "sign")
