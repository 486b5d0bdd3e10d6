"""The mini-repository generator of the SWE domain: tiny modules with plain test functions, seeded with
one bug from a known family, at graded difficulty. Deterministic for a seed; every repo is checked
with the trusted in-process runner (our own code only) before it becomes a task."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any

from evotrainer.envs.swe.runner import load_in_process, run_in_process

FAMILIES = ("operator", "off_by_one", "constant", "swapped_args", "missing_case")
LEVELS = {
    0: "one module and its test file; the bug is in the function the failing test calls",
    1: "two modules with their test files; the failing test names the function to fix",
    2: "a module whose functions call helpers in a second, untested module; the bug is in the caller's "
    "call or in the helper (two files away from the failing test)",
    3: "as 2, with two bugs: one in a caller, one in a helper of the second module; each breaks a visible test, "
    "so a solver reads both files, edits one, runs the tests, reads the failure and edits the other",
}


@dataclass(frozen=True)
class Fn:
    """One function of the pool: its correct body, the bugs it can carry (family, body line, buggy
    text) and argument lists for tests. Names carry their meaning (area, minutes), which is what lets a
    small model learn what the correct line is."""

    name: str
    params: str
    body: tuple[str, ...]
    bugs: tuple[tuple[str, int, str], ...]
    inputs: tuple[str, ...]
    uses: tuple[str, ...] = ()


def _f(name, params, body, bugs, inputs, uses=()) -> Fn:
    body = (body,) if isinstance(body, str) else tuple(body)
    return Fn(name, params, body, tuple(bugs), tuple(inputs), tuple(uses))


# Standalone functions (levels 0 and 1).
POOL: tuple[Fn, ...] = (
    _f("area", "w, h", "return w * h", [("operator", 0, "return w + h")], ["2, 3", "4, 5", "3, 7"]),
    _f(
        "perimeter",
        "w, h",
        "return 2 * (w + h)",
        [("constant", 0, "return 4 * (w + h)"), ("operator", 0, "return 2 * (w - h)")],
        ["2, 3", "1, 4", "5, 2"],
    ),
    _f(
        "diff",
        "a, b",
        "return a - b",
        [("swapped_args", 0, "return b - a"), ("operator", 0, "return a + b")],
        ["7, 2", "9, 4", "5, 1"],
    ),
    _f("half", "n", "return n // 2", [("constant", 0, "return n // 3")], ["8", "10", "14"]),
    _f("minutes", "h", "return h * 60", [("constant", 0, "return h * 100")], ["2", "3", "5"]),
    _f("is_even", "n", "return n % 2 == 0", [("constant", 0, "return n % 2 == 1")], ["4", "7", "10"]),
    _f("last", "xs", "return xs[-1]", [("off_by_one", 0, "return xs[-2]")], ["[1, 2, 3]", "[4, 5]", "[7, 8, 9]"]),
    _f(
        "upto",
        "n",
        "return list(range(1, n + 1))",
        [("off_by_one", 0, "return list(range(1, n))"), ("constant", 0, "return list(range(0, n + 1))")],
        ["3", "4", "2"],
    ),
    _f(
        "countdown",
        "n",
        "return list(range(n, 0, -1))",
        [("off_by_one", 0, "return list(range(n, 1, -1))")],
        ["3", "4", "2"],
    ),
    _f("passed", "score", "return score >= 50", [("off_by_one", 0, "return score > 50")], ["50", "70", "20"]),
    _f("power", "b, e", "return pow(b, e)", [("swapped_args", 0, "return pow(e, b)")], ["2, 3", "2, 5", "3, 4"]),
    _f("mod", "a, b", "return a % b", [("swapped_args", 0, "return b % a")], ["7, 3", "9, 4", "5, 2"]),
    _f(
        "sign",
        "x",
        ["if x > 0:", "    return 1", "return -1 if x < 0 else 0"],
        [("missing_case", 2, "return -1")],
        ["0", "5", "-3"],
    ),
    _f(
        "safe_div",
        "a, b",
        "return a // b if b else 0",
        [("missing_case", 0, "return a // b")],
        ["9, 0", "7, 2", "8, 4"],
    ),
    _f("first", "xs", "return xs[0] if xs else None", [("missing_case", 0, "return xs[0]")], ["[]", "[3, 4]", "[9]"]),
    _f("absval", "x", "return x if x >= 0 else -x", [("missing_case", 0, "return x")], ["-4", "3", "-7"]),
    _f(
        "total",
        "xs",
        ["t = 0", "for x in xs:", "    t += x", "return t"],
        [("constant", 0, "t = 1"), ("operator", 2, "    t -= x")],
        ["[1, 2, 3]", "[4, 5]", "[2, 2]"],
    ),
)

# Level 2: helpers (in an untested module) and the callers that use them.
HELPERS: tuple[Fn, ...] = (
    _f("mul", "a, b", "return a * b", [("operator", 0, "return a + b")], []),
    _f("sub", "a, b", "return a - b", [("operator", 0, "return a + b")], []),
    _f("inc", "n", "return n + 1", [("constant", 0, "return n + 2")], []),
    _f("div", "a, b", "return a // b", [("operator", 0, "return a * b")], []),
)
CALLERS: tuple[Fn, ...] = (
    _f(
        "box",
        "w, h, d",
        "return mul(mul(w, h), d)",
        [("constant", 0, "return mul(mul(w, h), 2)")],
        ["2, 3, 4", "1, 5, 3"],
        ("mul",),
    ),
    _f("square", "x", "return mul(x, x)", [("off_by_one", 0, "return mul(x, x - 1)")], ["3", "5", "7"], ("mul",)),
    _f("gap", "lo, hi", "return sub(hi, lo)", [("swapped_args", 0, "return sub(lo, hi)")], ["2, 9", "3, 5"], ("sub",)),
    _f(
        "next_odd",
        "n",
        "return inc(n) if n % 2 == 0 else inc(inc(n))",
        [("off_by_one", 0, "return inc(n)")],
        ["4", "7", "2"],
        ("inc",),
    ),
    _f(
        "mean2",
        "a, b",
        "return div(a + b, 2)",
        [("swapped_args", 0, "return div(2, a + b)")],
        ["4, 8", "3, 5"],
        ("div",),
    ),
    _f("tenth", "n", "return div(n, 10)", [("constant", 0, "return div(n, 100)")], ["50", "120", "90"], ("div",)),
)
MODULES = ("calc", "geo", "nums", "core", "tools", "mathx")
CALLER_MODULES = ("shapes", "ops", "stats")
HELPER_MODULES = ("util", "helpers", "base")
_MISSING = object()
FILLERS = 5  # working functions above the callers in a level-3 module


@dataclass(frozen=True)
class Repo:
    """A generated repository: the buggy files, its visible tests (inside `files`) and hidden tests
    (evaluator-owned, never shown), the reference one-line fix and which tests the bug breaks."""

    files: dict[str, str]
    test_files: tuple[str, ...]
    hidden: dict[str, str]
    fix: dict[str, Any]  # {"file", "line" (1-based), "text", "buggy", "function", "def_line"}
    family: str
    level: int
    failing: tuple[str, ...]  # visible test ids the bug fails, in file order
    visible_tests: int
    hidden_tests: int
    modules: tuple[str, ...] = field(default=())  # source modules, the one to open first first
    fixes: tuple[dict[str, Any], ...] = field(default=())  # every line to fix (level 3: two), `fix` first

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.files, sort_keys=True).encode()).hexdigest()[:16]


def _source(
    fns: list[Fn], bugs: list[tuple[Fn, tuple[str, int, str]]], imports: str = ""
) -> tuple[str, dict[int, tuple[int, int]]]:
    """Module text and, by index into `bugs`, the 1-based lines of each buggy function's def and of its bug
    (bugs not in this module are absent)."""
    lines = [imports] if imports else []
    where = {}
    for fn in fns:
        lines.append(f"def {fn.name}({fn.params}):")
        for i, text in enumerate(fn.body):
            for k, (bug_fn, (_, line, buggy)) in enumerate(bugs):
                if bug_fn is fn and line == i:
                    text, where[k] = buggy, (len(lines) - i, len(lines) + 1)
            lines.append("    " + text)
    return "\n".join(lines) + "\n", where


def _test_source(
    module: str, fns: list[Fn], args: dict[str, list[str]], expect: dict[str, dict[str, str]], suffix: str = ""
) -> str:
    lines = [f"from {module} import {', '.join(fn.name for fn in fns)}"]
    for fn in fns:
        if not args[fn.name]:
            continue
        lines.append(f"def test_{fn.name}{suffix}():")
        lines += [f"    assert {fn.name}({a}) == {expect[fn.name][a]}" for a in args[fn.name]]
    return "\n".join(lines) + "\n"


def _values(files: dict[str, str], module: str, fns: list[Fn]) -> dict[str, dict[str, str]]:
    """repr of each function's value on each of its inputs ("raises X" for an exception), computed by
    loading the (trusted, generated) module in process with the runner's own loader."""
    mod = load_in_process(files)(module)
    out: dict[str, dict[str, str]] = {}
    for fn in fns:
        for a in fn.inputs:
            try:
                out.setdefault(fn.name, {})[a] = repr(getattr(mod, fn.name)(*eval(f"({a},)")))  # our own literals
            except Exception as e:
                out.setdefault(fn.name, {})[a] = f"raises {type(e).__name__}"
    return out


Group = tuple[str, list[Fn], str]  # module name, its functions, its import line
Bug = tuple[Fn, tuple[str, int, str]]  # the function and one of its bugs (family, body line, buggy text)


def generate(rng: random.Random, level: int) -> Repo | None:
    """One repo at `level`, or None when the drawn bug does not break a visible test (the caller draws again)."""
    if level not in LEVELS:
        raise ValueError(f"env.levels: unknown difficulty level {level}; known: {sorted(LEVELS)}")
    groups, bugs = _layout(rng, level)
    clean, files, fixes = _plant(groups, bugs)
    fix = fixes[0]
    test_files, hidden, visible_n, hidden_n = _write_tests(rng, groups, clean, files, fix["file"], level)
    before = run_in_process(files, test_files)
    failing = tuple(t for t, s in before.tests.items() if s == "failed")
    if not failing or before.collection_errors:
        return None
    # Two bugs: each must fail a visible test on its own, so the tests after the first edit still fail.
    if len(fixes) > 1 and any(not run_in_process(_apply(files, [f]), test_files).failed for f in fixes):
        return None
    # The reference fix must pass every visible and hidden test: a generator bug must never become a task.
    after = run_in_process({**_apply(files, fixes), **hidden}, test_files + list(hidden))
    if after.failed or after.collection_errors or after.collected != visible_n + hidden_n:
        raise AssertionError(f"generator: the reference fix of {bugs} in {fix['file']} fails {after.failures}")
    modules = [fix["file"]] + [f"{m}.py" for m, _, _ in groups if f"{m}.py" != fix["file"]]
    if level >= 2:  # a solver opens the tested module first, then follows its import
        modules = [f"{groups[0][0]}.py", f"{groups[1][0]}.py"]
    family = bugs[0][1][0]
    counts = (failing, visible_n, hidden_n)
    return Repo(files, tuple(test_files), hidden, fix, family, level, *counts, tuple(modules), tuple(fixes))


def _layout(rng: random.Random, level: int) -> tuple[list[Group], list[Bug]]:
    """The modules and the bug(s) of a repo at `level` (the draws of levels 0-2 are those they always were)."""
    if level in (0, 1):
        fns = rng.sample(POOL, 2 * (level + 1))
        names = rng.sample(MODULES, level + 1)
        groups = [(names[k], fns[2 * k : 2 * k + 2], "") for k in range(level + 1)]
        buggy = rng.choice(fns[:2])  # the first module holds the bug; its test is named in the issue
        return groups, [(buggy, rng.choice(buggy.bugs))]
    callers = rng.sample(CALLERS, 2)
    helpers = sorted({h for c in callers for h in c.uses}, key=lambda n: [f.name for f in HELPERS].index(n))
    helper_fns = [next(f for f in HELPERS if f.name == n) for n in helpers]
    caller_mod, helper_mod = rng.choice(CALLER_MODULES), rng.choice(HELPER_MODULES)
    groups = [(caller_mod, callers, f"from {helper_mod} import {', '.join(helpers)}"), (helper_mod, helper_fns, "")]
    if level == 2:  # half the time in a helper: the failing caller's test is two files away from it
        target = rng.choice(helper_fns) if rng.random() < 0.5 else rng.choice(callers)
        return groups, [(target, rng.choice(target.bugs))]
    # Level 3: the callers sit below FILLERS working functions of their own, so reading the module whole costs
    # a long observation, and a cut one can hide the bug.
    groups[0] = (caller_mod, rng.sample(POOL, FILLERS) + callers, groups[0][2])
    return groups, [(fn, rng.choice(fn.bugs)) for fn in (rng.choice(callers), rng.choice(helper_fns))]


def _plant(groups: list[Group], bugs: list[Bug]) -> tuple[dict[str, str], dict[str, str], list[dict[str, Any]]]:
    """The clean and the buggy sources, and the fix of each bug (in the order of `bugs`)."""
    clean: dict[str, str] = {}
    files: dict[str, str] = {}
    fixes: dict[int, dict[str, Any]] = {}
    for module, fns_, imports in groups:
        clean[f"{module}.py"], _ = _source(fns_, [], imports)
        files[f"{module}.py"], where = _source(fns_, bugs, imports)
        for k, (def_line, line) in where.items():
            fn, (_, i, buggy) = bugs[k]
            fixes[k] = {
                "file": f"{module}.py",
                "line": line,
                "def_line": def_line,
                "function": fn.name,
                "text": "    " + fn.body[i],
                "buggy": "    " + buggy,
            }
    return clean, files, [fixes[k] for k in sorted(fixes)]


def _write_tests(
    rng: random.Random, groups: list[Group], clean: dict[str, str], files: dict[str, str], fix_file: str, level: int
) -> tuple[list[str], dict[str, str], int, int]:
    """Visible test files (added to `files`: one input per function, one the bug changes where it can) and
    hidden ones (the other inputs); returns their names, the hidden files and both test counts."""
    test_files, hidden, visible_n, hidden_n = [], {}, 0, 0
    tested = [(m, f) for m, f, _ in groups if any(fn.inputs for fn in f)]
    for module, fns_ in tested:
        good = _values(clean, module, fns_)
        bad = _values(files, module, fns_) if f"{module}.py" == fix_file or level >= 2 else good
        vis, hid = {}, {}
        for fn in fns_:
            differs = [a for a in fn.inputs if bad.get(fn.name, {}).get(a, _MISSING) != good[fn.name][a]]
            pick = rng.choice(differs) if differs else rng.choice(fn.inputs)
            vis[fn.name] = [pick]
            hid[fn.name] = [a for a in fn.inputs if a != pick]
        tf = f"test_{module}.py"
        files[tf] = _test_source(module, fns_, vis, good)
        hidden[f"test_hidden_{module}.py"] = _test_source(module, fns_, hid, good, "_hidden")
        test_files.append(tf)
        visible_n += sum(bool(v) for v in vis.values())
        hidden_n += sum(bool(v) for v in hid.values())
    return test_files, hidden, visible_n, hidden_n


def _apply(files: dict[str, str], fixes: list[dict[str, Any]]) -> dict[str, str]:
    for f in fixes:
        files = apply_line(files, f["file"], f["line"], f["text"])
    return files


def apply_line(files: dict[str, str], path: str, line: int, text: str) -> dict[str, str]:
    lines = files[path].split("\n")
    lines[line - 1] = text
    return {**files, path: "\n".join(lines)}
