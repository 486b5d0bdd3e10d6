"""The run's noise bank: A-A pairs (the control harness trained twice on other seeds, from a confirmation's
control replicate or an A-A arm), kept on the mainline from round to round. Only pairs measured under the
mainline's current harness enter its estimate: seed-to-seed spread grows with how far a harness moves
the policy (on the math demo it was 0.008 at learning rate 1e-5 and 0.016 at 1e-4)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from evotrainer.backtest.gate import BASE_DOF
from evotrainer.backtest.statistics import Noise, Pair, noise_of


def bank_pairs(noise: dict[str, Any] | None, harness_version: str) -> list[Pair]:
    return [
        Pair(p["wins"], p["losses"], p["n"])
        for p in (noise or {}).get("pairs", [])
        if p.get("harness") == harness_version
    ]


def bank_noise(noise: dict[str, Any] | None, harness_version: str, new: list[Pair]) -> Noise:
    """The noise model from the bank's pairs under this harness plus `new` ones."""
    return noise_of(bank_pairs(noise, harness_version) + new, BASE_DOF)


def banked(pair: Pair, harness_version: str, rnd: int, arm: str, against: str) -> dict[str, Any]:
    """One A-A pair as the bank keeps it: the outcomes' counts, the harness it measured, where it came from."""
    return {**asdict(pair), "harness": harness_version, "round": rnd, "arms": [arm, against]}


def with_pairs(noise: dict[str, Any] | None, harness_version: str, rnd: int, new: list[tuple[Pair, str, str]]) -> dict:
    """The bank with this round's pairs (pair, arm, against) added, and the estimate for this harness."""
    pairs = list((noise or {}).get("pairs", [])) + [banked(p, harness_version, rnd, a, b) for p, a, b in new]
    est = noise_of(bank_pairs({"pairs": pairs}, harness_version), BASE_DOF)
    return {
        "pairs": pairs,
        "harness": harness_version,
        "phi": est.phi,
        "pairs_used": est.pairs,
        "dof": est.dof,
        "valid": est.valid,
    }
