"""How far past its detector's bar does each planted failure sit, per seed and kernel set?

tests/test_failures.py asks that each plant's detector fire (at one seed of three, for the plants whose failure
develops at some seeds only): pass or fail. This reads the margin behind it: each plant trained as the test trains
it, at each seed, then the default suite (what fired) and the plant's detector alone with its bar moved out of
reach, so that it reports its statistic whether or not that crosses the bar: plateau's reward slope, the shares
of dead groups, truncated rollouts, tool errors and capped episodes, entropy_collapse's last third, and
length_blowup's growth. A detector's other conditions stay (entropy must fall, the clipped share must rise); where
one does not hold the statistic is null, and the detector could not have fired. The plants whose detectors ask
several things at once (reward_hacking, kl_spike, repetition...) have no one statistic to read. It is
benchmarks/control_margins.py's grid on the other side of each bar, cell for cell:

    [ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=AVX2] python -m benchmarks.plant_margins [--seeds 0 1 2]
        [--plants plateau length_blowup] [--set train.steps=40]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from benchmarks.control_margins import (
    BARS,
    PRESSED,
    fired_by_default,
    grid_arguments,
    measure,
    pressed_findings,
    trained,
)
from benchmarks.paths import RESULTS
from evotrainer.config import RunConfig
from evotrainer.diagnostics.builtin import _entropy_thirds
from evotrainer.diagnostics.suite import BUILTIN
from evotrainer.diagnostics.window import open_window
from evotrainer.training.run import BRANCH


@dataclass(frozen=True)
class Reading:
    finding: str
    """The finding the plant must produce, whose value is the statistic."""
    detector: str
    pressed: dict[str, float]
    """The detector's parameters with its bar out of reach."""
    bar: str
    """The parameter the statistic is held to."""
    fires_when: str
    """"below" or "above" the bar."""


def _control_side(finding: str, detector: str) -> Reading:
    bar, side = BARS[finding]
    return Reading(finding, detector, PRESSED[detector], bar, side)


PLANTS = {
    "plateau": _control_side("plateau", "plateau"),
    "zero_variance": _control_side("zero_variance_groups", "zero_variance_groups"),
    "truncation": _control_side("truncation", "truncation"),
    "tool_errors": _control_side("tool_errors", "tool_errors"),
    "turn_cap": _control_side("turn_cap", "tool_errors"),
    "entropy_collapse": Reading(
        "entropy_collapse", "entropy_collapse", {"min_entropy": math.inf}, "min_entropy", "below"
    ),
    "length_blowup": Reading("length_blowup", "length_blowup", {"max_growth": 0.0}, "max_growth", "above"),
}


def read_plant(plant: str, cfg: RunConfig) -> dict:
    """The plant (its config `cfg`) trained, what fired, and its detector's statistic against the
    default bar; the entropy's thirds besides."""
    store, last = trained(cfg)
    r = PLANTS[plant]
    found = [f.value for f in pressed_findings(store, last, {r.detector: r.pressed}) if f.name == r.finding]
    return {
        "fired": fired_by_default(store, last),
        "reading": {
            "finding": r.finding,
            "value": found[0] if found else None,
            "bar": BUILTIN[r.detector][1][r.bar],
            "fires_when": r.fires_when,
        },
        "entropy_thirds": _entropy_thirds(open_window(store, BRANCH, 1, last)),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.plant_margins", description=__doc__.split("\n\n")[0])
    ap.add_argument("--plants", nargs="+", default=list(PLANTS), choices=PLANTS)
    grid_arguments(ap, RESULTS / "plant-margins.json")
    args = ap.parse_args(argv)
    measure(ap, args, "plant", args.plants, read_plant, _brief)


def _brief(cell: dict) -> str:
    r = cell["reading"]
    value = "not read (a condition besides the bar failed)" if r["value"] is None else f"{r['value']:.3g}"
    return f"{r['finding']} {value} ({r['fires_when']} {r['bar']:g} fires)"


if __name__ == "__main__":
    main()
