"""The minimal test runner of the SWE domain: plain `test*` functions of the given test files, run by
one small script (no pytest: ~0.7 s a run is too slow for RL), in the sandbox for model-edited code
and in process for the generator's and the scripted solver's own code. Results are cached by content."""

from __future__ import annotations

import atexit
import hashlib
import json
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from evotrainer import sandbox

MARK = "@@evotrainer-report@@ "

# The runner, as source: the sandbox executes it as a script, the in-process path execs the same text,
# so a report means the same thing on both paths. Modules are loaded by our own importer from a
# `read(path) -> text | None` function (the repo's files), falling through to the real import for
# the standard library: no sys.modules, sys.path or .pyc cache is shared between two runs.
RUNNER = r'''
import builtins as _b, contextlib as _cl, sys as _sys, types as _t


def make_loader(read):
    real = _b.__import__
    mods = {}
    scope = dict(vars(_b))

    def find(name):
        base = name.replace(".", "/")
        for path, pkg in ((base + ".py", False), (base + "/__init__.py", True)):
            src = read(path)
            if src is not None:
                return path, pkg, src
        return None

    def load(name):
        if name in mods:
            return mods[name]
        found = find(name)
        if found is None:
            return None
        path, pkg, src = found
        parent = load(name.rpartition(".")[0]) if "." in name else None
        mod = _t.ModuleType(name)
        mod.__file__ = path
        mod.__package__ = name if pkg else name.rpartition(".")[0]
        if pkg:
            mod.__path__ = [path.rpartition("/")[0]]
        mod.__dict__["__builtins__"] = scope
        mods[name] = mod
        try:
            exec(compile(src, path, "exec"), mod.__dict__)
        except BaseException:
            del mods[name]
            raise
        if parent is not None:
            setattr(parent, name.rpartition(".")[2], mod)
        return mod

    def imp(name, globals=None, locals=None, fromlist=(), level=0):
        if level:
            parts = ((globals or {}).get("__package__") or "").split(".")
            base = ".".join(parts[:len(parts) - level + 1])
            name = base + "." + name if name else base
        mod = load(name) if name else None
        if mod is None:
            if level:
                raise ImportError("no module %r in the repository" % name)
            return real(name, globals, locals, fromlist, 0)
        if fromlist:
            for item in fromlist:
                if item != "*" and not hasattr(mod, item):
                    load(name + "." + item)
            return mod
        return load(name.partition(".")[0]) if "." in name else mod

    scope["__import__"] = imp
    return load


def _where(e, path=None):
    """Where an exception happened: the last frame in `path`, else the innermost frame in a repo file
    (relative file names; the runner and the standard library have '<...>' or absolute ones)."""
    if path is None and isinstance(e, SyntaxError) and e.filename and not e.filename.startswith(("<", "/")):
        return "%s:%s" % (e.filename, e.lineno)
    found, tb = None, e.__traceback__
    while tb is not None:
        f = tb.tb_frame.f_code.co_filename
        if (f == path) if path else not f.startswith(("<", "/")):
            found = "%s:%s" % (f, tb.tb_lineno)
        tb = tb.tb_next
    return found


class _Null:
    def write(self, s):
        return len(s)

    def flush(self):
        pass


def run_suite(read, test_files, select=None):
    load = make_loader(read)
    tests, failures, errors = {}, {}, {}
    want = None if select is None else set(select)
    with _cl.redirect_stdout(_Null()), _cl.redirect_stderr(_Null()):
        for path in test_files:
            if want is not None and not any(w.partition("::")[0] == path for w in want):
                continue
            try:
                mod = load(path[:-3].replace("/", "."))
                if mod is None:
                    raise FileNotFoundError(path)
            except BaseException as e:
                errors[path] = "%s at %s" % (type(e).__name__, _where(e) or path)
                continue
            for attr, fn in list(vars(mod).items()):
                if not (
                    attr.startswith("test") and isinstance(fn, _t.FunctionType) and fn.__code__.co_filename == path
                ):
                    continue
                nid = path + "::" + attr
                if want is not None and nid not in want:
                    continue
                try:
                    fn()
                    tests[nid] = "passed"
                except BaseException as e:
                    tests[nid] = "failed"
                    where = _where(e, path)
                    failures[nid] = type(e).__name__ + (" line " + where.rpartition(":")[2] if where else "")
    return {"tests": tests, "failures": failures, "collection_errors": errors}


def main(spec):
    import json
    _sys.dont_write_bytecode = True
    # The run's key comes on stdin, never in the source or the files the tested code can read: a
    # report line without it (printed by the code under test, which then exits) is not a report.
    key = _sys.stdin.readline().strip()
    _sys.stdin = None

    def read(p):
        if p.startswith("/") or ".." in p.split("/"):
            return None
        try:
            with open(p, encoding="utf-8") as fh:
                return fh.read()
        except (OSError, UnicodeDecodeError, ValueError):
            return None

    out = run_suite(read, spec["test_files"], spec.get("select"))
    _sys.__stdout__.write("\n" + spec["mark"] + key + " " + json.dumps(out) + "\n")
    _sys.__stdout__.flush()
'''


@dataclass(frozen=True)
class TestReport:
    """What the runner saw. `run_failure` is set when no report came back (timeout, memory, output cap,
    a crash): then nothing is known to pass."""

    __test__ = False  # not a pytest class
    tests: dict[str, str] = field(default_factory=dict)  # test id (file::function) -> passed | failed
    failures: dict[str, str] = field(default_factory=dict)  # test id -> short reason
    collection_errors: dict[str, str] = field(default_factory=dict)  # test file -> short reason
    run_failure: str | None = None

    @property
    def collected(self) -> int:
        return len(self.tests)

    @property
    def passed(self) -> int:
        return sum(s == "passed" for s in self.tests.values())

    @property
    def failed(self) -> int:
        return self.collected - self.passed

    @property
    def pass_fraction(self) -> float:
        """The naive score a harness reads off the counts: passed over collected, and 1.0 when nothing
        was collected ("no failures"). Collection errors are not counted. This trust is the exploit
        channel of the SWE domain; the audit never reads this number."""
        if self.run_failure:
            return 0.0
        return self.passed / self.collected if self.collected else 1.0

    def summary(self) -> str:
        if self.run_failure:
            return f"tests did not finish: {self.run_failure}"
        lines = [f"FAIL {t} {r}" for t, r in self.failures.items()]
        lines += [f"ERROR {f} {r}" for f, r in self.collection_errors.items()]
        tail = f"{self.passed} passed, {self.failed} failed"
        if self.collection_errors:
            tail += f", {len(self.collection_errors)} error{'s' * (len(self.collection_errors) > 1)}"
        return "\n".join(lines + [tail])

    def to_info(self) -> dict[str, Any]:
        return {
            "collected": self.collected,
            "passed": self.passed,
            "failed": self.failed,
            "collection_errors": sorted(self.collection_errors),
            "run_failure": self.run_failure,
        }


def _report(out: dict[str, Any], run_failure: str | None = None) -> TestReport:
    return TestReport(
        dict(out.get("tests", {})), dict(out.get("failures", {})), dict(out.get("collection_errors", {})), run_failure
    )


_NS: dict[str, Any] = {}


def _runner_ns() -> dict[str, Any]:
    if not _NS:
        exec(compile(RUNNER, "<swe-runner>", "exec"), _NS)
    return _NS


def load_in_process(files: dict[str, str]) -> Callable[[str], Any]:
    """The runner's module loader over `files`, in this process. Only for code we generated ourselves."""
    return _runner_ns()["make_loader"](files.get)


def run_in_process(files: dict[str, str], test_files: list[str], select: list[str] | None = None) -> TestReport:
    """Run tests in this process. Only for trusted code (the generator's repos and the scripted
    solver's edits); anything a policy wrote goes through SandboxRunner."""
    return _report(_runner_ns()["run_suite"](files.get, list(test_files), select))


def sandbox_source(test_files: list[str], select: list[str] | None = None) -> str:
    """The script the sandbox runs: the runner compiled under a '<swe-runner>' name (so its frames are
    never mistaken for repo files), then main() on the spec."""
    spec = {"test_files": list(test_files), "select": select, "mark": MARK}
    return (
        f"RUNNER = {RUNNER!r}\nSPEC = {json.dumps(spec)!r}\nimport json\ng = {{'__name__': 'swe_runner'}}\n"
        "exec(compile(RUNNER, '<swe-runner>', 'exec'), g)\ng['main'](json.loads(SPEC))\n"
    )


def parse_output(stdout: str, termination: str, key: str) -> TestReport:
    """The report is the last line that starts with MARK and this run's key (code under test may print
    anything before it, including report lines of its own: without the key they are ignored).
    The key is a bar, not a wall: code that walks the runner's frames can still find it; the audit's
    hidden tests and the SWE detectors are the defence behind it."""
    head = MARK + key + " "
    for line in reversed(stdout.splitlines()):
        if line.startswith(head):
            try:
                return _report(json.loads(line[len(head) :]))
            except (ValueError, AttributeError):
                break
    return TestReport(run_failure=termination if termination != "ok" else "no report")


class SandboxRunner:
    """Runs the minimal runner on model-edited files in the sandbox's pre-started worker pool. Results
    are cached by the content of (files, tests): a group of rollouts often leaves the same repo, and
    a test run is deterministic. One runner (and pool) per process: see `sandbox_runner()`."""

    def __init__(self, limits: Any = None, cache_size: int = 8192, pool: Any = None):
        """pool: a sandbox.WorkerPool to use (shared with other domains); default: one of our own."""
        self._new_pool = sandbox.WorkerPool
        self.limits = limits or sandbox.Limits(cpu_seconds=1.0, wall_seconds=4.0, memory_mb=256)
        self._pool: Any = pool
        self._cache: OrderedDict[str, TestReport] = OrderedDict()
        self.cache_size = cache_size
        self.runs = 0  # sandbox runs actually made (cache misses)

    def __call__(self, files: dict[str, str], test_files: list[str], select: list[str] | None = None) -> TestReport:
        key = hashlib.sha256(json.dumps([sorted(files.items()), list(test_files), select]).encode()).hexdigest()
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        if self._pool is None:
            self._pool = self._new_pool()
        secret = secrets.token_hex(16)  # per run; `key` is the cache's content key
        res = self._pool.run_python(
            sandbox_source(test_files, select), files=files, limits=self.limits, stdin=secret + "\n"
        )
        self.runs += 1
        if res.worker_lost:
            raise OSError(res.stderr)  # infrastructure: neither a report on the code nor one to cache
        report = parse_output(res.stdout, res.termination, secret)
        self._cache[key] = report
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return report

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


_SHARED: list[SandboxRunner] = []


def sandbox_runner() -> SandboxRunner:
    """The process's shared runner: one pool of sandboxed workers, however many domains are built."""
    if not _SHARED:
        _SHARED.append(SandboxRunner())
        atexit.register(_SHARED[0].close)
    return _SHARED[0]
