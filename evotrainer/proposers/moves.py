"""Graded moves of one knob: the values a proposer tries for it, nearest the decisive first. Numeric knobs
move by a ladder of factors in both directions (x10, then x3 and x0.3, then x1.5 and x0.67: after a
decade is rejected, the finer steps still get their chance), from zero by first values worth trying;
flags toggle, choices cycle, thresholds switch on. screen() drops the moves already rejected, so the
first move left is the next rung. Every harness knob has at least one move (tests/test_search.py). `explore`
orders the moves a proposer tries without a finding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evotrainer.diagnostics.detector import Finding
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Hypothesis, Intervention, knob_value
from evotrainer.harness.knobs import knob
from evotrainer.harness.remedies import ACC
from evotrainer.proposers.proposer import PastTrial, intervention_key, rejected_under

# Each rung's factor, coarse to fine. A decade is the usual first step of a learning-rate sweep; knobs with
# a narrow useful range (temperature, clip ranges) move by smaller factors.
RUNGS: dict[str, tuple[float, ...]] = {
    "optimizer.learning_rate": (10.0, 3.0, 1.5),
    "optimizer.max_grad_norm": (10.0, 3.0),
    "sampling.temperature": (1.3, 1.15),
    "sampling.top_p": (1.1,),
    "loss.epsilon": (1.5, 1.25),
    "loss.epsilon_high": (1.5, 1.25),
    "loss.num_iterations": (2.0,),  # a second pass over each batch first; 3 passes from 1 is a bigger jump
}
DEFAULT_RUNGS = (3.0, 1.5)
# Numeric knobs that are off at 0: their first values to try (multiplying 0 goes nowhere).
FROM_ZERO: dict[str, tuple[float, ...]] = {
    "loss.entropy_coef": (0.001, 0.01),
    "loss.beta": (0.01, 0.04),
    "optimizer.weight_decay": (0.01, 0.1),
    "optimizer.warmup_steps": (10, 30),
    "optimizer.decay_steps": (200, 600),
    "optimizer.min_lr_ratio": (0.1,),
    "shaping.length_penalty": (0.001, 0.003),
    "shaping.overlong_buffer_len": (2, 4),
    "optimizer.learning_rate": (1e-5, 1e-4),
    "multi_turn.max_observation_tokens": (128, 64),  # 0 keeps whole observations: cutting starts generous
}
# Thresholds that are off at None: the value that switches them on.
SWITCH_ON: dict[str, Any] = {
    "filters.zero_std_threshold": 1e-6,
    "filters.std_keep_ratio": 0.9,  # the paper's SWE run
    "curriculum.easy_threshold": 1.0,
    "curriculum.hard_threshold": 0.0,
    "loss.epsilon_high": 0.28,
    "loss.tis_cap": 2.0,  # the cap most TIS recipes start from (verl's rollout_is_threshold default)
}
# Choices tried in this order (the rest after, in the registry's): Dr. GRPO's unscaled advantages first, since
# dividing by the group's std weights groups by how sure the policy already is (Liu et al., 2025).
PREFERRED: dict[str, tuple[Any, ...]] = {"loss.scale_rewards": ("none",)}
NOT_MOVED = frozenset({"suite_version", "reward_weights.*"})


def moves(h: Harness, path: str, up: bool | None = None) -> list[Any]:
    """The values to try for knob `path` of harness h, in order; `up` puts that direction first."""
    if path in NOT_MOVED or path.startswith("reward_weights."):
        return []  # reward terms move by the catalog's remedies (regrade, drop, reweigh): they are not a dial
    k, v = knob(path), knob_value(h, path)
    if path in SWITCH_ON:
        return [SWITCH_ON[path]] if v is None else [None]
    if isinstance(v, bool):
        return [not v]
    if k.choices and not isinstance(v, tuple):
        first = PREFERRED.get(path, ())
        return sorted((c for c in k.choices if c != v), key=lambda c: first.index(c) if c in first else len(first))
    if isinstance(v, tuple) or v is None:
        return _tuple_moves(path, v)
    if not v:
        return [x for x in FROM_ZERO.get(path, ()) if _in_range(k, x)]
    return _ladder(k, v, up)


# Knobs explored without a finding, the most often decisive first (the learning rate), each by its graded
# moves; the round takes the first moves not yet rejected, rung by rung across the knobs, so
# the search spreads before it refines. num_generations and dynamic sampling are not here: they change
# the compute per step, which a trial at equal steps would not charge fairly (they remedy dead groups);
# nor warm-up and decay, which act at the start of a run and over its length, not in a 20-step trial.
# num_iterations is: a second pass over each batch costs training seconds but no generated token, which is what
# a token budget and a trial at equal tokens count. The clip ranges act only once it is above 1 (harness/inert.py):
# before, the screen refuses their moves and the next knob's come up.
_EXPLORE = (
    "optimizer.learning_rate",
    "sampling.temperature",
    "loss.num_iterations",
    "loss.scale_rewards",
    "loss.epsilon_high",
    "loss.entropy_coef",
    "loss.epsilon",
)
_UNSTABLE = {"kl_spike", "entropy_explosion", "nonfinite", "length_blowup", "repetition"}


def explore(h: Harness, findings: list[Finding], history: Sequence[PastTrial] = ()) -> list[Intervention]:
    """Exploration candidates: every explored knob's moves, rung-major. The learning rate goes down first
    when a finding says training is unstable, up otherwise. A move rejected under this harness goes after every
    move not yet tried: its rejection expires (proposer.standing) once the mainline has moved on, but an untried
    move says more (on SWE a learning rate x10 that collapsed the policy came back each time it expired)."""
    tried = {intervention_key(t.intervention) for t in history if rejected_under(t, h)}
    unstable = any(f.name in _UNSTABLE for f in findings)
    ladders = [(t, moves(h, t, (not unstable) if t == "optimizer.learning_rate" else None)) for t in _EXPLORE]
    out = []
    for rung in range(max(len(m) for _, m in ladders)):
        for target, m in ladders:
            if rung < len(m):
                out.append(
                    Intervention(
                        kind="set_knob",
                        target=target,
                        value=m[rung],
                        hypothesis=Hypothesis(
                            finding="explore",
                            signal=ACC,
                            direction="up",
                            rationale=f"exploration: {target}, graded move",
                        ),
                    )
                )
    return sorted(out, key=lambda iv: intervention_key(iv) in tried)


def _ladder(k, v: float, up: bool | None) -> list[Any]:
    """The first rung (x10 for the learning rate) one way, or both when no direction is preferred; then
    each finer rung both ways (x3 and x0.3), the preferred direction first; with a direction, the opposite
    first rung comes last."""
    big, *fine = RUNGS.get(k.path, DEFAULT_RUNGS)
    first = [big] if up else [1 / big] if up is False else [big, 1 / big]
    factors = first + [f for r in fine for f in ((r, 1 / r) if up is not False else (1 / r, r))]
    if up is not None:
        factors.append(1 / big if up else big)
    out: list[Any] = []
    for f in factors:
        x = v * f
        x = int(round(x)) if k.type == "int" else float(f"{x:.3g}")
        if k.low is not None:
            x = max(x, type(x)(k.low))
        if k.high is not None:
            x = min(x, type(x)(k.high))
        if x != v and x not in out:
            out.append(x)
    return out


def _tuple_moves(path: str, v: tuple | None) -> list[Any]:
    if path == "filters.mask_terminations":
        present = set(v or ())
        return [tuple(sorted(present | {t})) for t in ("length", "error", "timeout", "tool_error") if t not in present]
    if path == "curriculum.levels" and v and len(v) > 1:
        return [tuple(sorted(v)[1:]), tuple(sorted(v)[:-1])]  # drop the easiest level, or the hardest
    return []


def _in_range(k, x: Any) -> bool:
    return (k.low is None or x >= k.low) and (k.high is None or x <= k.high)
