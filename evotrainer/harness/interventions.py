"""Interventions: typed single-factor patches of the harness, each with the hypothesis it tests.
Applying one gives a new harness version whose parent is the old one; reverting restores the parent
exactly. A patch that would change more (or less) than one knob is refused, with one exception: a two-factor
remedy (`paired`), proposed only where one factor failed alone in a way the diagnostics put on another knob, is
two single-knob changes trialled as one hypothesis, and recorded as such."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from evotrainer.errors import validation_lines
from evotrainer.harness.harness import Harness
from evotrainer.harness.knobs import is_replayable, knob

Kind = Literal[
    "set_knob",
    "set_reward_weight",
    "add_reward_term",
    "remove_reward_term",
    "replace_reward_term",
    "add_filter",
    "remove_filter",
    "swap_estimator",
    "swap_loss_type",
    "set_curriculum",
]

# Which knobs each kind may touch: the kind documents intent, the target says exactly where.
_KIND_TARGETS: dict[str, tuple[str, ...]] = {
    "set_knob": ("sampling.", "loss.", "shaping.", "optimizer.", "multi_turn.", "filters.", "curriculum."),
    "set_reward_weight": ("reward_weights.",),
    "add_reward_term": ("reward_weights.",),
    "remove_reward_term": ("reward_weights.",),
    # One factor: which grader the weight pays for (e.g. SWE's `tests` -> `tests_restored`, the same
    # visible tests scored with the original test files put back). The weight moves unchanged.
    "replace_reward_term": ("reward_weights.",),
    "add_filter": ("filters.", "loss.mask_truncated_completions"),
    "remove_filter": ("filters.", "loss.mask_truncated_completions"),
    "swap_estimator": ("loss.advantage_estimator", "loss.scale_rewards"),
    "swap_loss_type": ("loss.loss_type",),
    "set_curriculum": ("curriculum.",),
}


class InterventionError(ValueError):
    """An intervention that cannot be applied; the message says why and how to fix it."""


class Hypothesis(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    finding: str
    """The finding (detector name) this intervention answers."""
    signal: str
    """The metric expected to move, e.g. `completions/clipped_ratio` or `heldout/accuracy`."""
    direction: Literal["up", "down"]
    """Which way the signal should move if the hypothesis holds."""
    rationale: str = ""
    """Why, in a sentence."""


class Intervention(BaseModel):
    """One change to one knob. `before` and `base_parent` are filled by bind() from the harness it
    is applied to, so the change can be reverted exactly and reported as old -> new."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Kind
    target: str
    """Dotted knob path, e.g. `sampling.max_completion_length` or `reward_weights.format`."""
    value: Any = None
    """The new value (ignored by remove_reward_term; remove_filter restores the knob's default)."""
    hypothesis: Hypothesis
    before: Any = None
    before_absent: bool = False
    base_parent: str | None = None
    bound: bool = False
    paired: Intervention | None = None
    """A second factor the hypothesis needs: this change failed alone in a way the diagnostics put on another knob
    (a finding on its trial's window, absent from the control's, naming that knob), so the two are tried together.
    It changes one other knob and carries no pair of its own; the pair is one hypothesis, one trial, one verdict."""

    @model_serializer(mode="wrap")
    def _omit_no_pair(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A single change is written as before pairs existed: its JSON, keys and hashes do not change.
        data = handler(self)
        if isinstance(data, dict) and data.get("paired", 0) is None:
            del data["paired"]
        return data

    @model_validator(mode="after")
    def _one_pair(self) -> Intervention:
        if self.paired is not None and (self.paired.paired is not None or self.paired.target == self.target):
            raise ValueError(
                f"paired: {self.describe()} may pair with one change of another knob, not {self.paired.describe()}; "
                "give `paired` a single change of another knob, or drop it"
            )
        return self

    @property
    def parts(self) -> list[Intervention]:
        """The changes it makes: itself, or a two-factor remedy's two."""
        return [self] if self.paired is None else [self, self.paired]

    def unbound(self) -> Intervention:
        """What it sets (its pair's too), without what it replaced in the harness it was bound to."""
        pair = None if self.paired is None else self.paired.unbound()
        return Intervention(
            kind=self.kind, target=self.target, value=self.value, hypothesis=self.hypothesis, paired=pair
        )

    @property
    def replayable(self) -> bool:
        return is_replayable(self.target) and (self.paired is None or self.paired.replayable)

    def describe(self) -> str:
        if self.kind == "replace_reward_term":
            own = f"{self.kind} {self.target} -> reward_weights.{self.value}"
        else:
            old = f"{self.before!r} -> " if self.bound else ""
            own = f"{self.kind} {self.target}: {old}{self.value!r}"
        return own if self.paired is None else f"{own} + {self.paired.describe()}"

    def bind(self, h: Harness) -> Intervention:
        """This intervention with the harness's current value recorded (for revert and reports). The pair's second
        change is bound to the same harness: its knob is another, so the first change does not move it."""
        old = _get(h, self.target)
        absent = old is _MISSING
        update = {"before": None if absent else old, "before_absent": absent, "base_parent": h.parent, "bound": True}
        if self.paired is not None:
            update["paired"] = self.paired.bind(h)
        return self.model_copy(update=update)

    def apply(self, h: Harness) -> Harness:
        if self.paired is None:
            return self._apply_one(h)
        # Each part is held to one knob by its own apply; the child's parent is h: the pair is one step.
        both = self.paired.apply(self.model_copy(update={"paired": None}).apply(h)).model_dump(mode="python")
        return _validate({**both, "parent": h.version}, self.target)

    def _apply_one(self, h: Harness) -> Harness:
        _check_kind(self)
        data = h.model_dump(mode="python")
        if self.kind == "remove_reward_term":
            if self.target.split(".", 1)[1] not in h.reward_weights:
                raise InterventionError(f"{self.target}: the harness has no such reward term to remove")
            _set(data, self.target, _REMOVE)
        elif self.kind == "replace_reward_term":
            old = self.target.split(".", 1)[1]
            if old not in h.reward_weights:
                raise InterventionError(f"{self.target}: the harness has no such reward term to replace")
            if self.value in h.reward_weights:
                raise InterventionError(
                    f"{self.target}: the harness already pays {self.value!r}; set or remove a weight instead"
                )
            _rename_term(data, old, self.value)
        elif self.kind == "remove_filter":
            _set(data, self.target, _default(self.target))
        elif self.target in Harness.model_fields and isinstance(self.value, dict):
            data[self.target] = {**data[self.target], **self.value}
        else:
            _set(data, self.target, self.value)
        data["parent"] = h.version
        child = _validate(data, self.target)
        changed = [p for p, _, _ in diff(h, child)]
        if self.kind == "replace_reward_term" and set(changed) == {self.target, f"reward_weights.{self.value}"}:
            changed = [self.target]  # the weight moved from one grader to the other: one factor
        if not changed:
            raise InterventionError(f"{self.describe()} changes nothing: the harness already has that value")
        if len(changed) > 1:
            raise InterventionError(
                f"an intervention must change exactly one knob; {self.describe()} changes "
                f"{', '.join(changed)}. Split it into single-factor interventions, one per knob."
            )
        return child

    def revert(self, child: Harness) -> Harness:
        """The exact parent of `child` (same canonical spec, same version)."""
        if not self.bound:
            raise InterventionError("revert needs a bound intervention: call bind(parent) before apply")
        if self.paired is not None:
            child = self.paired.revert(child)
        data = child.model_dump(mode="python")
        if self.kind == "replace_reward_term":
            _rename_term(data, self.value, self.target.split(".", 1)[1])
        _set(data, self.target, _REMOVE if self.before_absent else self.before)
        data["parent"] = self.base_parent
        return _validate(data, self.target)


def load_intervention(path: str | Path) -> Intervention:
    """Read one intervention from YAML. A list of several is refused: one factor at a time."""
    path = Path(path)
    if not path.is_file():
        raise InterventionError(f"intervention file not found: {path}")
    raw = yaml.safe_load(path.read_text())
    if isinstance(raw, list):
        if len(raw) != 1:
            raise InterventionError(
                f"{path}: holds {len(raw)} interventions; an intervention changes one factor, "
                "so write one per file and test them one at a time"
            )
        raw = raw[0]
    try:
        return Intervention.model_validate(raw)
    except ValidationError as e:
        raise InterventionError(validation_lines(e, str(path))) from None


def diff(a: Harness, b: Harness) -> list[tuple[str, Any, Any]]:
    """Changed knobs between two harnesses as (path, old, new); the parent field is not a knob."""
    fa, fb = (
        _flatten(a.model_dump(mode="json", exclude={"parent"})),
        _flatten(b.model_dump(mode="json", exclude={"parent"})),
    )
    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


# -- helpers -------------------------------------------------------------------------------------
class _Sentinel:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


_MISSING = _Sentinel("<absent>")
_REMOVE = _Sentinel("<remove>")


def _check_kind(iv: Intervention) -> None:
    if iv.target in Harness.model_fields and isinstance(iv.value, dict):
        return  # a whole section: allowed through so that the one-knob check can say what it changes
    try:
        knob(iv.target)
    except KeyError as e:
        raise InterventionError(str(e.args[0])) from None
    if not iv.target.startswith(_KIND_TARGETS[iv.kind]):
        raise InterventionError(f"{iv.kind} cannot target {iv.target}; it targets {', '.join(_KIND_TARGETS[iv.kind])}")
    if iv.kind == "add_reward_term" and iv.value in (None, 0):
        raise InterventionError(f"{iv.target}: add_reward_term needs a non-zero weight as value")
    if iv.kind == "replace_reward_term" and not (isinstance(iv.value, str) and iv.value):
        raise InterventionError(
            f"{iv.target}: replace_reward_term needs the new term's name as value, e.g. value: tests_restored"
        )


def knob_value(h: Harness, path: str) -> Any:
    """The harness's current value at a dotted knob path; KeyError names a path it does not have."""
    v = _get(h, path)
    if v is _MISSING:
        raise KeyError(f"the harness has no knob {path!r}")
    return v


def _get(h: Harness, path: str) -> Any:
    node: Any = h.model_dump(mode="python")
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _set(data: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = data
    for p in parents:
        node = node[p]
    if value is _REMOVE or value is _MISSING:
        node.pop(leaf, None)
    else:
        node[leaf] = value


def _rename_term(data: dict, old: str, new: str) -> None:
    """The reward term `old` becomes `new` with the same weight, in place and in the same order."""
    data["reward_weights"] = {(new if k == old else k): w for k, w in data["reward_weights"].items()}


def _default(path: str) -> Any:
    return knob(path).default


def _validate(data: dict, target: str) -> Harness:
    try:
        return Harness.model_validate(data)
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or target}: {err['msg']}" for err in e.errors())
        raise InterventionError(f"{target}: the new value is out of range or of the wrong type ({msgs})") from None


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out
