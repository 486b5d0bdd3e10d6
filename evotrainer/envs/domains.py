"""The domain registry: each domain folder exports a DomainSpec from its `__init__.py` (its config class, detectors
with their defaults, remedies for its findings, audited variants of its reward terms); the built-in ones are found
by scanning this package's subpackages, others are registered by `register`. The env section of the config, the
diagnostic suite and the heuristic catalog are built from here, so a new domain touches nothing outside its folder."""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from evotrainer.diagnostics.detector import Detector
from evotrainer.envs.config import DomainConfig
from evotrainer.harness.remedies import Remedy


class DetectorDefaults(NamedTuple):
    """A built-in detector and its default parameters (starting points: suite revision recalibrates them)."""

    fn: Detector
    defaults: dict[str, float]


@dataclass(frozen=True)
class DomainSpec:
    """What a domain brings besides its factory (named by its config class): everything the config, the
    suite and the proposer need to know about it."""

    name: str
    """`env.domain` for this domain; its config class's `domain` field defaults to it."""
    config: type[DomainConfig]
    """The env section of this domain (its fields, its factory, its demo-neutral fields)."""
    detectors: Mapping[str, DetectorDefaults] = field(default_factory=dict)
    """Detectors of the domain's own failure modes, by finding name; they must stay quiet on other domains'
    rollouts, since the default suite runs every domain's detectors."""
    remedies: Mapping[str, tuple[Remedy, ...]] = field(default_factory=dict)
    """Heuristic remedies by finding name, most recommended first (after the core catalog's, for a core finding)."""
    audited_variants: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Reward term -> graders of the domain that score the same thing without the exploit's channel, the
    preferred first (a regrade remedy replaces the term with the first the harness does not pay yet)."""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"domain name {self.name!r}: a plain identifier (`module:Class` names a user class)")
        if not (isinstance(self.config, type) and issubclass(self.config, DomainConfig)):
            raise TypeError(f"domain {self.name!r}: config must be a DomainConfig subclass, not {self.config!r}")
        declared = self.config.model_fields.get("domain")
        if declared is None or declared.default != self.name:
            raise ValueError(f"domain {self.name!r}: {self.config.__name__}.domain must default to {self.name!r}")


_LOCK = threading.RLock()
_REGISTRY: dict[str, DomainSpec] = {}
_scanned = False


def _scan() -> None:
    """Register the spec (`DOMAIN`) of every subpackage of evotrainer.envs, in name order, once per process."""
    global _scanned
    with _LOCK:
        if _scanned:
            return
        _scanned = True
        package = importlib.import_module(__package__)
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
            if info.ispkg:
                spec = getattr(importlib.import_module(f"{__package__}.{info.name}"), "DOMAIN", None)
                if isinstance(spec, DomainSpec):
                    _add(spec)


def _add(spec: DomainSpec) -> None:
    if (known := _REGISTRY.get(spec.name)) is not None and known != spec:
        raise ValueError(f"domain {spec.name!r} is already registered")
    for other in _REGISTRY.values():
        if other.name != spec.name and (clash := sorted(set(other.detectors) & set(spec.detectors))):
            raise ValueError(f"domain {spec.name!r}: detector(s) {clash} already belong to domain {other.name!r}")
    _REGISTRY[spec.name] = spec


def register(spec: DomainSpec) -> None:
    """Add a domain (after the built-in ones); registering the same spec again does nothing, another spec under a
    registered name or a detector name another domain has is a ValueError."""
    _scan()
    with _LOCK:
        _add(spec)


def unregister(name: str) -> None:
    """Remove a registered domain (a test's, once the test is done); an unknown name does nothing."""
    _scan()
    with _LOCK:
        _REGISTRY.pop(name, None)


def registered() -> dict[str, DomainSpec]:
    """Every registered domain by name: the built-in ones in name order, then the others as registered."""
    _scan()
    with _LOCK:
        return dict(_REGISTRY)


def lookup(name: str) -> DomainSpec | None:
    """The registered domain of that name, or None."""
    return registered().get(name)


def detectors() -> dict[str, DetectorDefaults]:
    """Every domain's detectors, domain by domain in registry order."""
    return {name: d for spec in registered().values() for name, d in spec.detectors.items()}


def remedies() -> dict[str, tuple[Remedy, ...]]:
    """Every domain's remedies by finding name (two domains' remedies for one finding: in registry order)."""
    out: dict[str, tuple[Remedy, ...]] = {}
    for spec in registered().values():
        for finding, rs in spec.remedies.items():
            out[finding] = (*out.get(finding, ()), *rs)
    return out


def variants_of(domain: str) -> dict[str, tuple[str, ...]]:
    """One domain's audited variants by reward term (none for a domain not registered here: a `module:Class`)."""
    spec = lookup(domain)
    return dict(spec.audited_variants) if spec else {}


def audited_variants() -> dict[str, tuple[str, ...]]:
    """Every domain's audited variants by reward term, in registry order without repeats."""
    out: dict[str, tuple[str, ...]] = {}
    for spec in registered().values():
        for term, variants in spec.audited_variants.items():
            out[term] = tuple(dict.fromkeys((*out.get(term, ()), *variants)))
    return out
