"""The diagnostic suite: the built-in detectors (the core ones here, each domain's from the domain registry), and
Suite, a versioned set of detectors (built-in, plugin, induced rule or agent-written) with their parameters."""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import replace
from types import ModuleType

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evotrainer.diagnostics import agent, builtin, groups, rules, validity
from evotrainer.diagnostics.detector import Detector, Finding, Window, check_detector
from evotrainer.diagnostics.window import open_window
from evotrainer.envs import domains as registry
from evotrainer.envs.domains import DetectorDefaults
from evotrainer.store.rollouts import RolloutStore

# The core detectors, name -> (detector, default parameters); each domain brings its own (envs/domains.py). The
# defaults are starting points: suite revision recalibrates them against audits, and every change gives the suite
# a new version.
CORE: dict[str, DetectorDefaults] = {
    "zero_variance_groups": DetectorDefaults(
        builtin.zero_variance_groups, {"std_threshold": 1e-6, "max_fraction": 0.5}
    ),
    "truncation": DetectorDefaults(builtin.truncation, {"max_fraction": 0.1}),
    # A blow-up, not growth: a healthy digits run grew 1.51x first to last third (seed 1, AVX2 kernels), the
    # planted length exploit 2.37-3.01x (examples/failures/length_blowup.yaml, seeds 0-2).
    "length_blowup": DetectorDefaults(builtin.length_blowup, {"max_growth": 2.0}),
    "entropy_collapse": DetectorDefaults(builtin.entropy_collapse, {"min_entropy": 0.05}),
    "entropy_explosion": DetectorDefaults(
        builtin.entropy_explosion,
        {
            "max_entropy": 2.0,
            "min_rise": 0.1,
            "gibberish_logprob": -3.0,
            "max_odd_chars": 0.5,
            "max_gibberish": 0.2,
            "sample_size": 2000,
        },
    ),
    "reward_hacking": DetectorDefaults(
        validity.reward_hacking, {"min_rise": 0.1, "max_audit_rise": 0.02, "min_audited": 10, "audit_z": 1.645}
    ),
    "repetition": DetectorDefaults(
        builtin.repetition,
        {"min_repeats": 4, "min_dup_fraction": 0.5, "max_compression": 0.1, "max_fraction": 0.1, "sample_size": 2000},
    ),
    "kl_spike": DetectorDefaults(
        builtin.kl_spike,
        {
            "spike_factor": 5.0,
            "grad_spike_factor": 10.0,
            "kl_floor": 0.05,
            "clip_floor": 0.05,
            "grad_norm_floor": 0.1,
            "min_steps": 5,
        },
    ),
    "nonfinite": DetectorDefaults(builtin.nonfinite, {}),
    "tool_errors": DetectorDefaults(validity.tool_errors, {"max_error_fraction": 0.2, "max_turn_cap_fraction": 0.2}),
    "infra_errors": DetectorDefaults(validity.infra_errors, {"max_fraction": 0.02, "std_threshold": 1e-6}),
    "reward_audit_gap": DetectorDefaults(
        validity.reward_audit_gap,
        {"rewarded_threshold": 0.5, "max_gap": 0.1, "min_audited": 20, "min_passes": 5, "audit_z": 1.645},
    ),
    "plateau": DetectorDefaults(builtin.plateau, {"min_slope": 1e-3, "min_steps": 20, "ceiling": 0.9}),
    # float32 sampling and training agree to ~1e-5 nats a token; bfloat16 weights put them ~0.03 apart.
    "sampling_mismatch": DetectorDefaults(builtin.sampling_mismatch, {"max_mean": 0.01, "min_steps": 2}),
    # Dead groups on the outcome where shaping keeps the total spread (diagnostics/groups.py).
    "dead_outcome_groups": DetectorDefaults(
        groups.dead_outcome_groups, {"std_threshold": 1e-6, "max_fraction": 0.5, "min_hidden": 0.2}
    ),
    "solution_collapse": DetectorDefaults(groups.solution_collapse, {"max_distinct": 0.3, "ceiling": 0.5}),
    "logprob_collapse": DetectorDefaults(
        groups.logprob_collapse, {"max_logprob": -0.05, "min_rise": 0.1, "ceiling": 0.5}
    ),
}


class _Builtin(Mapping[str, DetectorDefaults]):
    """The built-in detectors: the core ones, then every registered domain's, read from the registry at each
    lookup (a domain may register after this module is imported)."""

    def _table(self) -> dict[str, DetectorDefaults]:
        domains = registry.detectors()
        if clash := sorted(set(CORE) & set(domains)):
            raise ValueError(f"domain detector(s) {clash} take a core detector's name")
        return {**CORE, **domains}

    def __getitem__(self, name: str) -> DetectorDefaults:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


BUILTIN: Mapping[str, DetectorDefaults] = _Builtin()


class DetectorSpec(BaseModel):
    """One detector of a suite."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    params: dict[str, float] = Field(default_factory=dict)
    """Parameters; for a built-in, the ones given override its defaults."""
    path: str | None = None
    """`module:function` of a detector that is not built in; None: BUILTIN entry of the same name."""
    rule: rules.Rule | None = None
    """An induced detector (diagnostics/rules.py): data, not code; its params are rules.RULE_DEFAULTS."""
    sql: agent.SqlQuery | None = None
    """An agent-written SQL detector (diagnostics/agent.py) flagging rollouts by id; params: agent.AGENT_DEFAULTS."""
    python: agent.Predicate | None = None
    """An agent-written Python predicate, run in the sandbox (diagnostics/agent.py); params: agent.AGENT_DEFAULTS."""


class Suite(BaseModel):
    """A versioned set of detectors. The version hashes names, resolved parameters and each detector's
    source, so editing a detector's code changes the version as much as retuning it does."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    detectors: dict[str, DetectorSpec] = Field(default_factory=lambda: {name: DetectorSpec() for name in BUILTIN})
    """Detectors by name, run in this order."""
    parent: str | None = None
    """Version of the suite this one was revised from (None for a root)."""

    @model_validator(mode="after")
    def _check(self) -> Suite:
        for name, spec in self.detectors.items():
            if spec.sql is not None or spec.python is not None:
                if spec.path is not None or spec.rule is not None or (spec.sql and spec.python) or name in BUILTIN:
                    raise ValueError(
                        f"detector {name!r}: an agent detector has one of sql / python, no path or rule, "
                        "and cannot take a built-in's name"
                    )
                if unknown := sorted(set(spec.params) - set(agent.AGENT_DEFAULTS)):
                    raise ValueError(
                        f"detector {name!r}: unknown parameter(s) {unknown}; known: {sorted(agent.AGENT_DEFAULTS)}"
                    )
                continue
            if spec.rule is not None:
                if spec.path is not None or name in BUILTIN:
                    raise ValueError(
                        f"detector {name!r}: a rule detector has no path and cannot take a built-in's name"
                    )
                unknown = sorted(set(spec.params) - set(rules.RULE_DEFAULTS))
                if unknown:
                    raise ValueError(
                        f"detector {name!r}: unknown parameter(s) {unknown}; known: {sorted(rules.RULE_DEFAULTS)}"
                    )
                continue
            if spec.path is None and name not in BUILTIN:
                raise ValueError(
                    f"detector {name!r} is not built in ({', '.join(BUILTIN)}); give its path as module:function"
                )
            if spec.path is None and set(spec.params) - set(BUILTIN[name][1]):
                raise ValueError(
                    f"detector {name!r}: unknown parameter(s) {sorted(set(spec.params) - set(BUILTIN[name][1]))}; "
                    f"known: {sorted(BUILTIN[name][1])}"
                )
        return self

    @classmethod
    def default(cls) -> Suite:
        return cls()

    def resolve(self, name: str) -> tuple[Detector, dict[str, float]]:
        """One detector's function and full parameters."""
        spec = self.detectors[name]
        if spec.rule is not None:
            return rules.detector(spec.rule, name), {**rules.RULE_DEFAULTS, **spec.params}
        if spec.sql is not None:
            return agent.sql_detector(spec.sql, name), {**agent.AGENT_DEFAULTS, **spec.params}
        if spec.python is not None:
            return agent.predicate_detector(spec.python, name), {**agent.AGENT_DEFAULTS, **spec.params}
        if spec.path is None:
            fn, defaults = BUILTIN[name]
            return fn, {**defaults, **spec.params}
        return load_detector(spec.path), dict(spec.params)

    def resolved(self) -> list[tuple[str, Detector, dict[str, float]]]:
        """(name, function, full parameters) of every detector, in run order."""
        return [(name, *self.resolve(name)) for name in self.detectors]

    def with_params(self, name: str, **params: float) -> Suite:
        """A revision with some of one detector's parameters changed; its parent is this suite."""
        spec = self.detectors[name]
        new = {**self.detectors, name: spec.model_copy(update={"params": {**spec.params, **params}})}
        return Suite(detectors=new, parent=self.version)

    def with_detector(self, name: str, spec: DetectorSpec) -> Suite:
        """A revision with one detector added (an induced rule, a plugin); its parent is this suite."""
        if name in self.detectors:
            raise ValueError(f"detector {name!r} is already in suite {self.version}")
        return Suite(detectors={**self.detectors, name: spec}, parent=self.version)

    def canonical(self) -> str:
        body = {}
        for name, fn, params in self.resolved():
            spec = self.detectors[name]
            # A rule's meaning is its data plus the code that turns any rule into SQL and findings: hash
            # the rule and the rules module. The "rule" key is added only for rule detectors, so the
            # versions of existing suites do not move.
            body[name] = {
                "params": params,
                "path": spec.path,
                "source": _source_hash(rules if spec.rule else agent if spec.sql or spec.python else fn),
            }
            if spec.rule is not None:
                body[name]["rule"] = spec.rule.model_dump(mode="json")
            for key in ("sql", "python"):  # likewise: keys only agent detectors have
                if getattr(spec, key) is not None:
                    body[name][key] = getattr(spec, key).model_dump(mode="json")
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @property
    def version(self) -> str:
        """Content hash of the canonical suite plus the parent's version."""
        return "s-" + hashlib.sha256((self.canonical() + "|" + (self.parent or "")).encode()).hexdigest()[:12]

    def rewarded_threshold(self) -> float:
        """The reward from which a rollout counts as paid (the reward-audit gap detector's threshold)."""
        if "reward_audit_gap" in self.detectors and not self.detectors["reward_audit_gap"].path:
            return float(self.resolve("reward_audit_gap")[1]["rewarded_threshold"])
        return 0.5

    def run(self, store: RolloutStore, branch: str, first_step: int, last_step: int) -> list[Finding]:
        """Every detector over one window, on one DuckDB connection. A detector that raises (or a plugin
        that fails check_detector) does not stop the others: it becomes a `detector_error` finding."""
        w = open_window(store, branch, first_step, last_step)
        findings: list[Finding] = []
        try:
            for name in self.detectors:
                try:
                    fn, params = self.resolve(name)  # here, so that a plugin that fails to import is one error
                    win = Window(w.con, branch, first_step, last_step, params)
                    # A plugin runs under check_detector (docs/style.md 7): twice, with its findings checked. The
                    # built-ins pass it in tests and run once.
                    out = check_detector(fn, win) if self.detectors[name].path else fn(win)
                    if not isinstance(out, list) or not all(isinstance(f, Finding) for f in out):
                        raise TypeError(f"returned {type(out).__name__}, not a list of Finding")
                    findings.extend(weigh(win, f, self.rewarded_threshold()) for f in out)
                except Exception as e:  # noqa: BLE001 -- one broken (user) detector must not hide the other findings
                    findings.append(
                        Finding(
                            name="detector_error",
                            severity="info",
                            value=0.0,
                            threshold=0.0,
                            evidence=(),
                            knobs=(),
                            message=f"{name}: {type(e).__name__}: {e}",
                            branch=branch,
                            first_step=first_step,
                            last_step=last_step,
                        )
                    )
        finally:
            w.con.close()
        return findings


# A validity finding about particular rollouts counts against the window only when its reward pays them
# while the audit fails them: among its flagged, audited rollouts, at least PAID_FAILING paid (reward at
# or above the suite's rewarded threshold) and audit-failing, once WEIGH_MIN_AUDITED are audited.
PAID_FAILING = 0.5
WEIGH_MIN_AUDITED = 10


def weigh(w: Window, f: Finding, rewarded: float) -> Finding:
    """A validity finding whose flagged rollouts the window's own reward does not pay (or the audit
    passes) is no exploit of this reward: it stays as a warning, its figures kept in `demoted` as
    evidence for the next revision. Aggregate findings (no `flagged` query) and findings with too few
    audited flagged rollouts are left as they are."""
    if not f.validity or not f.flagged:
        return f
    n, audited, paid_failing, mean = w.con.execute(
        f"SELECT count(*), count(audit), count(*) FILTER (WHERE audit = false AND reward >= ?), avg(reward) "
        f"FROM rollout_stats WHERE id IN (SELECT id FROM ({f.flagged}))",
        [rewarded],
    ).fetchone()
    if audited < WEIGH_MIN_AUDITED or paid_failing / audited >= PAID_FAILING:
        return f
    why = (
        f"the window's reward does not pay what it flags: of {n} flagged rollouts (mean reward {mean:.2f}), "
        f"{paid_failing} of the {audited} audited are paid (reward >= {rewarded:g}) and fail the audit "
        f"({100 * paid_failing / audited:.1f}%, below {100 * PAID_FAILING:.0f}%)"
    )
    return replace(f, severity="warning", validity=False, demoted=why, message=f"{f.message} Not counted: {why}.")


def load_detector(path: str) -> Detector:
    """A detector given as `module:function`."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"detector path {path!r} is not module:function")
    fn = getattr(importlib.import_module(module), attr)
    if not callable(fn):
        raise TypeError(f"{path} is not callable")
    return fn


def _source_hash(fn: Detector | ModuleType) -> str:
    """A detector's code as its syntax tree, not its text: reformatting or a comment does not move the
    suite's version, a changed expression does."""
    try:
        src = ast.dump(ast.parse(textwrap.dedent(inspect.getsource(fn))))
    except (OSError, TypeError, SyntaxError):  # defined in a REPL or built dynamically: hash its bytecode instead
        code = getattr(fn, "__code__", None)
        name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
        src = f"{name}:{code.co_code.hex() if code else ''}"
    return hashlib.sha256(src.encode()).hexdigest()[:16]
