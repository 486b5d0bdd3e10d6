"""The package's shape, checked from its source (docs/style.md 10, 15, 16): no import cycle between modules, no
file over 500 lines, no function over 80 lines. Written here rather than taken from a linter: ruff has no
import-cycle rule, and the limits are the project's own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "evotrainer"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 500, 80


def modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the package that `name` imports, anywhere in its body (a function-level import
    is a dependency too)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            # A package and its own modules (an __init__ re-exporting them; `from pkg import mod`, which
            # names the package on the way to the module) form no cycle.
            if t and t != name and not t.startswith(name + ".") and not name.startswith(t + "."):
                found.add(t)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as the list of modules on it, or None (depth-first search with colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w) :] + [w]
            if w not in state and (cycle := visit(w)):
                return cycle
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (cycle := visit(v)):
            return cycle
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle_between_modules():
    mods = modules()
    graph = {m: imports(m, f, set(mods)) for m, f in mods.items()}
    assert graph["evotrainer.loop"], "the import graph is empty: the parser no longer sees imports"
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_files_and_functions_stay_small(path):
    lines = path.read_text().splitlines()
    assert len(lines) <= MAX_FILE_LINES, f"{path.name}: {len(lines)} lines; split it by concept"
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            assert n <= MAX_FUNCTION_LINES, f"{path.name}:{node.lineno} {node.name} has {n} lines"


def test_the_loop_reads_in_one_sitting():
    assert len((PACKAGE / "loop.py").read_text().splitlines()) <= 200


def test_domain_folders_sit_below_the_config_the_suite_and_the_proposers():
    """A domain folder (envs/NAME/) is read by the config, the suite and the proposers through the registry
    (envs/domains.py); none of its modules imports them back."""
    mods = modules()
    folders = {m for m, f in mods.items() if f.name == "__init__.py" and m.startswith("evotrainer.envs.")}
    assert {"evotrainer.envs.math", "evotrainer.envs.swe", "evotrainer.envs.code"} <= folders
    above = ("evotrainer.config", "evotrainer.diagnostics.suite", "evotrainer.proposers")
    for m, f in mods.items():
        if any(m == d or m.startswith(d + ".") for d in folders):
            up = sorted(t for t in imports(m, f, set(mods)) if any(t == a or t.startswith(a + ".") for a in above))
            assert not up, f"{m} imports {up}"


# The tiers of docs/design.md ("Tiers"), lowest first: a module imports only its own tier and those below. A
# module belongs to the tier of the longest prefix that names it, so an aggregator (the suite, the revision, the
# config, envs.registry) sits above the parts it gathers while its package's parts stay below.
TIERS = (
    ("types", "errors", "ids", "section", "records", "sandbox", "store"),
    ("harness", "diagnostics"),
    ("envs", "harness.rewards"),
    ("config", "diagnostics.suite", "diagnostics.revision"),
    ("envs.registry",),
    ("policies", "training", "trackers", "evaluation", "backtest", "proposers", "skills"),
    ("training.run", "trackers.forward", "integrations", "stages", "report", "loop", "cli", "testing", "experimental"),
)
# Below the drivers a module takes the sections it reads, not the whole RunConfig. These are the drivers' peers
# that do read all of it: the bridge from a config to its domain, and an arm worker rebuilding its config.
WHOLE_CONFIG = ("evotrainer.envs.registry", "evotrainer.backtest.trial")


def tier(module: str) -> int:
    rest = module.removeprefix("evotrainer.")
    named = [(len(p), i) for i, t in enumerate(TIERS) for p in t if rest == p or rest.startswith(p + ".")]
    return max(named)[1] if named else len(TIERS) - 1  # the package itself is the top


def test_tier_reads_the_longest_prefix():
    assert tier("evotrainer.diagnostics.detector") == 1
    assert tier("evotrainer.diagnostics.suite") == 3
    assert tier("evotrainer.training.run") == len(TIERS) - 1 > tier("evotrainer.training.grpo")


def test_no_import_runs_back_up_the_tiers():
    mods = modules()
    up = [
        f"{m} (tier {tier(m)}) imports {t} (tier {tier(t)})"
        for m, f in sorted(mods.items())
        for t in sorted(imports(m, f, set(mods)))
        if tier(t) > tier(m)
    ]
    assert not up, "imports that run back up (docs/design.md, Tiers):\n" + "\n".join(up)


def test_below_the_drivers_modules_take_sections_not_the_whole_config():
    drivers = len(TIERS) - 1
    whole = sorted(
        m
        for m, f in modules().items()
        if tier(m) < drivers
        and m not in ("evotrainer.config", *WHOLE_CONFIG)
        and any(
            isinstance(n, ast.ImportFrom)
            and n.module == "evotrainer.config"
            and any(a.name == "RunConfig" for a in n.names)
            for n in ast.walk(ast.parse(f.read_text()))
        )
    )
    assert not whole, f"{whole} import RunConfig: pass them the sections they read"


def test_the_design_notes_layout_matches_the_tree():
    """docs/design.md's layout names every module of the package (a domain folder's own files aside: the folder
    is the unit there) and no module that is gone, so a clone's design notes describe the code it has."""
    text = (PACKAGE.parent / "docs" / "design.md").read_text()
    layout = text[text.index("## Layout") :]
    layout = layout[layout.index("evotrainer/") : layout.index("\nbenchmarks/")]  # the package's part
    named = set(re.findall(r"\b(\w+\.py)\b", layout)) | {f"{d}/" for d in re.findall(r"\b(\w+)/", layout)}
    domains = {p.parent for p in PACKAGE.glob("envs/*/__init__.py")}
    own = [p for p in PACKAGE.rglob("*.py") if p.parent not in domains]
    files = [p for p in own if p.name not in ("__init__.py", "__main__.py")]
    missing = sorted(str(p.relative_to(PACKAGE)) for p in files if p.name not in named)
    assert not missing, f"docs/design.md's layout does not name {missing}"
    assert not {f"{p.name}/" for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} - named
    gone = sorted(n for n in named if n.endswith(".py") and not any(PACKAGE.rglob(n)))
    assert not gone, f"docs/design.md's layout names modules that do not exist: {gone}"
