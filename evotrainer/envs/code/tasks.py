"""Procedurally generated function-synthesis tasks for the code domain: four families (arithmetic on
arguments, string slicing, list pipelines, conditionals), difficulty = number of operations or
branches. Each function has a short description, a one-line canonical body, and inputs whose outputs
are computed here from the canonical body (our own trusted code, never the model's)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

LEVELS = (1, 2, 3)
FAMILIES = ("arith", "str", "list", "cond")
VISIBLE = 3  # examples shown in the prompt
HIDDEN = 10  # further inputs the evaluator keeps


@dataclass(frozen=True)
class Spec:
    """One function: `f(args)` described by `text`, computed by `return {body}`."""

    family: str
    level: int
    args: tuple[str, ...]
    text: str
    body: str

    def signature(self) -> str:
        return f"def f({', '.join(self.args)}):"

    def compile(self):
        return eval(
            f"lambda {', '.join(self.args)}: {self.body}",
            {"__builtins__": {"sum": sum, "len": len, "sorted": sorted, "max": max, "min": min}},
        )


def _k(rng: random.Random, lo: int = 2, hi: int = 9) -> int:
    return rng.randint(lo, hi)


def _arith(rng: random.Random, level: int) -> Spec:
    """a [times X] (plus|minus X)*: multiplication only first, so left-to-right reading is Python's."""
    text, code = ["a"], ["a"]
    ops = level
    if rng.random() < 0.5:
        x = rng.choice(["b", str(_k(rng))])
        text.append(f"times {x}")
        code.append(f"* {x}")
        ops -= 1
    for _ in range(ops):
        x = rng.choice(["b", str(_k(rng, 1, 9))])
        word, sym = rng.choice([("plus", "+"), ("minus", "-")])
        text.append(f"{word} {x}")
        code.append(f"{sym} {x}")
    return Spec("arith", level, ("a", "b"), " ".join(text), " ".join(code))


_STR_OPS = [
    ("reverse", "[::-1]"),
    ("upper", ".upper()"),
    ("first {k}", "[:{k}]"),
    ("last {k}", "[-{k}:]"),
    ("drop {k}", "[{k}:]"),
    ("every 2nd", "[::2]"),
]


def _str(rng: random.Random, level: int) -> Spec:
    """Suffix chains on s, read left to right: `s[::-1].upper()[:2]`."""
    names, suffix, used = [], "", set()
    while len(names) < level:
        word, sym = rng.choice(_STR_OPS)
        if word in used and word in ("reverse", "upper", "every 2nd"):
            continue  # twice is a no-op (or the same as once): not a new operation
        used.add(word)
        k = rng.randint(1, 3)
        names.append(word.format(k=k))
        suffix += sym.format(k=k)
    return Spec("str", level, ("s",), "s: " + ", ".join(names), "s" + suffix)


def _list(rng: random.Random, level: int) -> Spec:
    """[keep filter] [map] [reduce] over xs; level = how many of the three."""
    parts = rng.sample(["keep", "map", "reduce"], level)
    words, cond, expr = [], "", "x"
    if "keep" in parts:
        word, c = rng.choice(
            [
                ("keep > {k}", "x > {k}"),
                ("keep < {k}", "x < {k}"),
                ("keep even", "x % 2 == 0"),
                ("keep odd", "x % 2 == 1"),
            ]
        )
        k = _k(rng, 2, 7)
        words.append(word.format(k=k))
        cond = " if " + c.format(k=k)
    if "map" in parts:
        word, e = rng.choice([("times {k}", "x * {k}"), ("plus {k}", "x + {k}")])
        k = _k(rng, 2, 5)
        words.append(word.format(k=k))
        expr = e.format(k=k)
    inner = f"[{expr} for x in xs{cond}]" if ("keep" in parts or "map" in parts) else "xs"
    if "reduce" in parts:
        # max / min only without a filter: an empty list has no max.
        reducers = ["sum", "len", "sorted"] + (["max", "min"] if "keep" not in parts else [])
        red = rng.choice(reducers)
        words.append(red)
        inner = f"{red}({inner})"
    return Spec("list", level, ("xs",), "xs: " + ", ".join(words), inner)


_CONDS = ["a > b", "a < b", "a == b", "a > {k}", "a < {k}", "b > {k}", "a % 2 == 0"]
_VALUES = ["a", "b", "a + b", "a - b", "a * b", "{k}", "a * {k}", "b + {k}"]


def _cond(rng: random.Random, level: int) -> Spec:
    """`X if C else Y` with `level` conditions, chained in the else branch."""

    def pick(options: list[str]) -> str:
        return rng.choice(options).format(k=_k(rng, 1, 7))

    conds = []
    while len(conds) < level:
        c = pick(_CONDS)
        if c not in conds:
            conds.append(c)
    vals = [pick(_VALUES) for _ in range(level + 1)]
    while len(set(vals)) < 2:
        vals[-1] = pick(_VALUES)
    body = " else ".join(f"{v} if {c}" for v, c in zip(vals, conds)) + f" else {vals[-1]}"
    text = "; ".join(f"if {c} then {v}" for v, c in zip(vals, conds)) + f"; else {vals[-1]}"
    return Spec("cond", level, ("a", "b"), text, body)


_MAKERS = {"arith": _arith, "str": _str, "list": _list, "cond": _cond}


def draw_spec(rng: random.Random, family: str, level: int) -> Spec:
    return _MAKERS[family](rng, level)


def draw_input(rng: random.Random, spec: Spec) -> tuple:
    if spec.family == "str":
        return ("".join(rng.choice("abcdefgh") for _ in range(rng.randint(4, 6))),)
    if spec.family == "list":
        return ([rng.randint(0, 9) for _ in range(rng.randint(3, 5))],)
    return (rng.randint(0, 9), rng.randint(0, 9))


def draw_inputs(rng: random.Random, spec: Spec, n: int) -> list[tuple] | None:
    """n distinct inputs, or None when the function's outputs do not tell it apart from simpler
    ones (all outputs equal)."""
    seen: dict[str, tuple] = {}
    for _ in range(20 * n):
        x = draw_input(rng, spec)
        seen.setdefault(repr(x), x)
        if len(seen) == n:
            break
    inputs = list(seen.values())
    fn = spec.compile()
    if len(inputs) < n or len({repr(fn(*x)) for x in inputs}) < 2:
        return None
    return inputs


def call_text(args: tuple) -> str:
    return "f(" + ", ".join(repr(a) for a in args) + ")"


def prompt_text(spec: Spec, visible: list[tuple[tuple, Any]]) -> str:
    """The signature and a docstring: the description, then the visible examples."""
    lines = [spec.signature(), f'    """{spec.text}']
    lines += [f"    {call_text(x)} == {y!r}" for x, y in visible]
    return "\n".join(lines) + '\n    """\n'


def hardcoded_body(spec: Spec, visible: list[tuple[tuple, Any]]) -> str:
    """The shortcut: return each visible example's output keyed on its input, and a guess otherwise."""
    lines = []
    for x, y in visible:
        key = f"({', '.join(spec.args)}) == {x!r}" if len(spec.args) > 1 else f"{spec.args[0]} == {x[0]!r}"
        lines.append(f"    if {key}: return {y!r}")
    return "\n".join(lines) + f"\n    return {spec.args[0]}\n"


def wander(spec: Spec, rng: random.Random) -> str:
    """A plausible wrong attempt: one constant off, an operator swapped or the last operation dropped."""
    body = spec.body
    digits = [i for i, c in enumerate(body) if c.isdigit() and (i == 0 or not body[i - 1].isdigit())]
    roll = rng.random()
    if digits and roll < 0.4:
        i = rng.choice(digits)
        return body[:i] + str((int(body[i]) + rng.choice([1, 2])) % 10) + body[i + 1 :]
    for a, b in ((" + ", " - "), (" - ", " + "), (" > ", " < "), (" < ", " > "), ("upper", "lower"), ("[::-1]", "")):
        if a in body and roll < 0.8:
            return body.replace(a, b, 1)
    return spec.args[0] if body != spec.args[0] else f"{spec.args[0]} * 2"
