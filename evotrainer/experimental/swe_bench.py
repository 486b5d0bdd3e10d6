"""SWE-bench-format instances on local checkouts (no network): load an instance file, check the repo
out at its base commit into a temp dir, apply a candidate patch, reset the test files and apply the
test patch (as SWE-bench's harness does), run FAIL_TO_PASS and PASS_TO_PASS in the sandbox, score.
Also exports generated SWE-domain tasks as instances, and episode edits as a patch."""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evotrainer.envs.swe.runner import TestReport, sandbox_runner
from evotrainer.types import Task

REQUIRED = ("instance_id", "problem_statement", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")


@dataclass(frozen=True)
class Instance:
    instance_id: str
    problem_statement: str
    patch: str
    """The reference (gold) patch."""
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    repo_path: Path
    """Local checkout (a git repository, or a plain directory when base_commit is empty)."""
    base_commit: str = ""
    repo: str = ""


@dataclass
class Evaluation:
    instance_id: str
    patch_applied: bool
    fail_to_pass: dict[str, bool] = field(default_factory=dict)
    pass_to_pass: dict[str, bool] = field(default_factory=dict)
    log: str = ""

    @property
    def resolved(self) -> bool:
        """SWE-bench's criterion: the patch applies, every FAIL_TO_PASS and PASS_TO_PASS test passes."""
        return self.patch_applied and all(self.fail_to_pass.values()) and all(self.pass_to_pass.values())


def _test_ids(value: Any, where: str) -> tuple[str, ...]:
    # The SWE-bench dataset stores these lists as JSON-encoded strings; files written by hand often do not.
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"{where}: not a list of test ids nor a JSON-encoded one: {value[:80]!r}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: must be a list of test ids (strings)")
    return tuple(value)


def load_instances(path: str | Path, repos_dir: str | Path | None = None) -> list[Instance]:
    """Instances from a JSON file (a list or one object) or JSONL. Each needs the SWE-bench fields
    (REQUIRED) and a local checkout: its `repo_path` (relative to the file's directory), else
    repos_dir / `repo` with '/' as '__' (SWE-bench's naming), else repos_dir / `repo`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"instance file not found: {path}")
    text = path.read_text()
    try:
        rows = json.loads(text)
        rows = rows if isinstance(rows, list) else [rows]
    except ValueError:
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as e:
            raise ValueError(f"{path}: neither JSON nor JSON lines: {e}") from None
    out = []
    for k, row in enumerate(rows):
        where = f"{path}: instance {row.get('instance_id', k) if isinstance(row, dict) else k}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: must be an object")
        missing = [f for f in REQUIRED if f not in row]
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}")
        if row.get("repo_path"):
            repo_path = path.parent / row["repo_path"]
        elif repos_dir is not None and row.get("repo"):
            base = Path(repos_dir)
            repo_path = base / row["repo"].replace("/", "__")
            repo_path = repo_path if repo_path.exists() else base / row["repo"]
        else:
            raise ValueError(f"{where}: no local checkout: give `repo_path`, or `repo` and repos_dir")
        if not repo_path.is_dir():
            raise FileNotFoundError(f"{where}: local checkout {repo_path} does not exist")
        out.append(
            Instance(
                row["instance_id"],
                row["problem_statement"],
                row["patch"],
                row["test_patch"],
                _test_ids(row["FAIL_TO_PASS"], f"{where}: FAIL_TO_PASS"),
                _test_ids(row["PASS_TO_PASS"], f"{where}: PASS_TO_PASS"),
                repo_path.resolve(),
                row.get("base_commit") or "",
                row.get("repo") or "",
            )
        )
    return out


def _git(*args: str, cwd: Path, input: bytes | None = None) -> subprocess.CompletedProcess:
    # GIT_CEILING_DIRECTORIES: a work dir that sits inside some other git repository must not be
    # taken for part of it (git apply would then resolve paths against that repository's root).
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(cwd.parent)}
    if shutil.which("git") is None:
        raise RuntimeError("SWE-bench instances need git on PATH (to check out base commits and apply patches)")
    return subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, env=env, timeout=60)


def checkout(inst: Instance, dest: Path) -> None:
    """The repository at its base commit in `dest` (the checkout itself is never touched)."""
    dest.mkdir(parents=True, exist_ok=True)
    if inst.base_commit:
        archive = _git("archive", "--format=tar", inst.base_commit, cwd=inst.repo_path)
        if archive.returncode:
            raise RuntimeError(
                f"{inst.instance_id}: git archive {inst.base_commit} failed: {archive.stderr.decode()[-300:]}"
            )
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True, timeout=60)
    else:
        shutil.copytree(inst.repo_path, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))


def apply_patch(workdir: Path, patch: str) -> tuple[bool, str]:
    """Apply a unified diff with `git apply` (which refuses paths outside the directory); an empty
    patch applies trivially."""
    if not patch.strip():
        return True, ""
    res = _git("apply", "--whitespace=nowarn", "-", cwd=workdir, input=patch.encode())
    return res.returncode == 0, res.stderr.decode(errors="replace")[-2000:]


def patched_files(patch: str) -> list[str]:
    """Paths a unified diff writes (its +++ lines), without the b/ prefix."""
    out = []
    for line in patch.splitlines():
        if line.startswith("+++ ") and not line.startswith("+++ /dev/null"):
            name = line[4:].split("\t")[0].strip()
            out.append(name[2:] if name.startswith("b/") else name)
    return out


def _read_tree(root: Path) -> dict[str, str]:
    """The repository's Python files (what the minimal runner can load), by relative path."""
    files = {}
    for p in sorted(root.rglob("*.py")):
        if ".git" in p.parts:
            continue
        try:
            files[p.relative_to(root).as_posix()] = p.read_text()
        except UnicodeDecodeError:
            continue
    return files


def evaluate(inst: Instance, candidate: str, runner=None) -> Evaluation:
    """Score one candidate patch. Test files named by the test patch are reset to the base commit
    before it is applied, so a candidate's edits to them do not count. Test ids are `path::function`
    (plain test functions; the minimal runner does not run pytest classes or fixtures)."""
    runner = runner or sandbox_runner()
    with tempfile.TemporaryDirectory(prefix="evo-swebench-") as tmp:
        work = Path(tmp) / "repo"
        checkout(inst, work)
        ok, log = apply_patch(work, candidate)
        if not ok:
            return Evaluation(inst.instance_id, False, log=f"candidate patch does not apply:\n{log}")
        with tempfile.TemporaryDirectory(prefix="evo-swebench-base-") as base_tmp:
            base = Path(base_tmp) / "repo"
            checkout(inst, base)
            for name in patched_files(inst.test_patch):
                target = work / name
                if (base / name).is_file():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(base / name, target)
                elif target.exists():
                    target.unlink()  # a file the test patch creates: the candidate's version goes
        ok, tlog = apply_patch(work, inst.test_patch)
        if not ok:
            raise RuntimeError(f"{inst.instance_id}: the instance's test patch does not apply:\n{tlog}")
        wanted = list(inst.fail_to_pass) + list(inst.pass_to_pass)
        test_files = sorted({t.partition("::")[0] for t in wanted})
        report: TestReport = runner(_read_tree(work), test_files, wanted)
    ev = Evaluation(
        inst.instance_id,
        True,
        {t: report.tests.get(t) == "passed" for t in inst.fail_to_pass},
        {t: report.tests.get(t) == "passed" for t in inst.pass_to_pass},
        report.summary(),
    )
    return ev


# -- bridges from the generated SWE domain ----------------------------------------------------------
def make_patch(old: dict[str, str], new: dict[str, str]) -> str:
    """A git-applicable unified diff from one set of files to another (added and changed files)."""
    out = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        diff = difflib.unified_diff(
            (a or "").splitlines(keepends=True),
            (b or "").splitlines(keepends=True),
            "/dev/null" if a is None else f"a/{name}",
            "/dev/null" if b is None else f"b/{name}",
        )
        out.append("".join(diff))
    return "".join(out)


def episode_patch(task: Task, info: dict[str, Any]) -> str:
    """An SWE-domain episode's edits as a patch against its task's repository (a SWE-bench prediction)."""
    files = task.data["files"]
    return make_patch(files, {**files, **{n: t for n, t in (info.get("edits") or {}).items() if n in files}})


def export_instance(task: Task, root: Path) -> dict[str, Any]:
    """Write a generated task as a git repository under root/<task id> (one commit: the buggy repo)
    and return its SWE-bench-format instance. The hidden tests become the test patch."""
    from evotrainer.envs.swe.repos import apply_line
    from evotrainer.envs.swe.runner import run_in_process

    d = task.data
    repo = root / task.id
    repo.mkdir(parents=True)
    for name, text in d["files"].items():
        (repo / name).write_text(text)
    for args in (
        ("init", "-q"),
        ("add", "-A"),
        ("-c", "user.name=evotrainer", "-c", "user.email=evotrainer@localhost", "commit", "-q", "-m", "base"),
    ):
        res = _git(*args, cwd=repo)
        if res.returncode:
            raise RuntimeError(f"git {args[0]} failed in {repo}: {res.stderr.decode()}")
    commit = _git("rev-parse", "HEAD", cwd=repo).stdout.decode().strip()
    fixed = apply_line(d["files"], d["fix"]["file"], d["fix"]["line"], d["fix"]["text"])
    tests = list(d["test_files"]) + sorted(d["hidden"])
    # Which tests the bug fails and the fix passes: our own generated code, run in process.
    before = run_in_process({**d["files"], **d["hidden"]}, tests).tests
    after = run_in_process({**fixed, **d["hidden"]}, tests).tests
    return {
        "instance_id": task.id,
        "repo": f"evotrainer/{task.id}",
        "base_commit": commit,
        "repo_path": task.id,
        "problem_statement": task.prompt.split("\n")[0],
        "patch": make_patch(d["files"], fixed),
        "test_patch": make_patch({}, d["hidden"]),
        "FAIL_TO_PASS": json.dumps(sorted(t for t, s in after.items() if s == "passed" and before.get(t) != "passed")),
        "PASS_TO_PASS": json.dumps(sorted(t for t, s in after.items() if s == "passed" and before.get(t) == "passed")),
    }
