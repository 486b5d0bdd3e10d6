"""The sandbox: model-written code runs in a separate, resource-limited process with no network, a private
working directory and, where bubblewrap exists, a filesystem view of only the Python install and that
directory. The trainer never imports it (docs/design.md invariant 8).

Layers, strongest available first (`mechanisms()` says which are active, and warns once about the rest):
  bwrap     mount + pid + net + ipc + uts namespaces: the job sees /usr, the Python install (read-only)
            and its own directory; nothing of the run directory, the store or the evaluator's data.
  unshare   without bwrap: pid + net namespaces (plus a user namespace when not root).
  uid_drop  as root, the job runs under an unprivileged uid of its own (setpriv): RLIMIT_NPROC is not
            enforced for root, so this is what makes the process limit hold; it also keeps the job
            out of root-only files.
  rlimits   always: CPU seconds, address space, file size, no core files; processes where `nproc`.
With none of bwrap, unshare and uid_drop it fails closed: run, run_python and WorkerPool raise
SandboxUnavailable, unless EVOTRAINER_SANDBOX_UNISOLATED=accept, with which model code can read and write
whatever the trainer's user can, and reach the network (isolation.py).
Wall time and output size are enforced here: the pipes are read incrementally and the job's whole
session is killed at the cap; with a pid namespace, killing its first process ends every process in it.

The public API: run and run_python here, WorkerPool (pool.py) for many small jobs, Limits and
ExecResult (limits.py), mechanisms and SandboxUnavailable (isolation.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from evotrainer.sandbox import worker
from evotrainer.sandbox.isolation import command, give, next_uid, python_executable, require_isolation
from evotrainer.sandbox.limits import ExecResult, Limits
from evotrainer.sandbox.process import exit_code, pump, spawn, stop


# -- one process ------------------------------------------------------------------------------------------
def run(
    argv: list[str], workdir: Path, limits: Limits = Limits(), stdin: str = "", *, readonly: Sequence[Path] = ()
) -> ExecResult:
    """Run argv in the sandbox with `workdir` as its cwd and HOME (the only writable place it sees
    under bwrap). `readonly`: extra paths bound read-only (bwrap only; e.g. a repository to test).
    Hidden data the job must not read stays out of workdir, or goes in over stdin. Raises
    SandboxUnavailable where no isolation layer works and the user has not opted in (isolation.py)."""
    workdir = Path(workdir).resolve()
    if not workdir.is_dir():
        raise FileNotFoundError(f"sandbox workdir {workdir} is not a directory")
    m = require_isolation()
    uid = next_uid() if m["uid_drop"] else None
    give(workdir, uid)
    cmd = command(argv, str(workdir), limits, [str(p) for p in readonly], die_with_parent=True, uid=uid)
    t0 = time.monotonic()
    proc, ns_fd = spawn(cmd, workdir)
    try:
        out, err, killed = pump(proc, stdin.encode(), limits, t0 + limits.wall_seconds)
    finally:
        stop(proc, ns_fd)  # whatever is left of it, and wait until it is gone
    rc = exit_code(proc.returncode, m["bwrap"])
    reason = killed or worker.classify(rc, err, time.monotonic() - t0, limits.cpu_seconds)
    return ExecResult(reason, None if killed else rc, out, err, time.monotonic() - t0)


def run_python(source: str, workdir: Path, limits: Limits = Limits(), stdin: str = "") -> ExecResult:
    """Write `source` to workdir/main.py and run it with `python -S -I` in the sandbox."""
    workdir = Path(workdir)
    (workdir / "main.py").write_text(source)
    return run([python_executable(), "-S", "-I", "main.py"], workdir, limits, stdin)
