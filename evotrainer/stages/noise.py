"""The run's noise bank: A-A pairs (the control harness trained twice on other seeds, from a confirmation's
control replicate or an A-A arm), kept on the mainline from round to round. Only pairs measured under the
mainline's current harness enter its estimate: seed-to-seed spread grows with how far a harness moves
the policy (on the math demo it was 0.008 at learning rate 1e-5 and 0.016 at 1e-4)."""

from __future__ import annotations

from evotrainer.backtest.gate import moderated
from evotrainer.backtest.statistics import Noise, Pair
from evotrainer.backtest.verdict import NoiseLine
from evotrainer.records import Record


class BankedPair(Record):
    """One A-A pair as the bank keeps it: the outcomes' counts, the harness it measured, where it came from."""

    wins: int
    losses: int
    n: int
    harness: str
    round: int
    arms: list[str]

    @classmethod
    def of(cls, pair: Pair, harness_version: str, rnd: int, arm: str, against: str) -> BankedPair:
        return cls(
            wins=pair.wins, losses=pair.losses, n=pair.n, harness=harness_version, round=rnd, arms=[arm, against]
        )

    def pair(self) -> Pair:
        return Pair(self.wins, self.losses, self.n)


class NoiseBank(NoiseLine):
    """Every A-A pair the run has measured, and the estimate from those under the mainline's harness."""

    pairs: list[BankedPair] = []


def bank_pairs(bank: NoiseBank | None, harness_version: str) -> list[Pair]:
    return [p.pair() for p in (bank.pairs if bank else []) if p.harness == harness_version]


def bank_noise(bank: NoiseBank | None, harness_version: str, new: list[Pair]) -> Noise:
    """The noise model from the bank's pairs under this harness plus `new` ones."""
    return moderated(bank_pairs(bank, harness_version) + new)


def with_pairs(bank: NoiseBank | None, harness_version: str, rnd: int, new: list[tuple[Pair, str, str]]) -> NoiseBank:
    """The bank with this round's pairs (pair, arm, against) added, and the estimate for this harness."""
    pairs = (bank.pairs if bank else []) + [BankedPair.of(p, harness_version, rnd, a, b) for p, a, b in new]
    est = moderated([p.pair() for p in pairs if p.harness == harness_version])
    return NoiseBank(
        pairs=pairs, harness=harness_version, phi=est.phi, pairs_used=est.pairs, dof=est.dof, valid=est.valid
    )
