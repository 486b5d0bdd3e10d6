"""Which isolation layers this machine has, and the command line that applies them.

Layers, strongest available first (`mechanisms()` says which are active, and warns once about the rest):
  bwrap     mount + pid + net + ipc + uts namespaces: the job sees /usr, the Python install (read-only)
            and its own directory; nothing of the run directory, the store or the evaluator's data.
  unshare   without bwrap: pid + net namespaces (plus a user namespace when not root).
  uid_drop  as root, the job runs under an unprivileged uid of its own (setpriv): RLIMIT_NPROC is not
            enforced for root, so this is what makes the process limit hold; it also keeps the job
            out of root-only files.
  rlimits   always: CPU seconds, address space, file size, no core files; processes where `nproc`.
With none of bwrap, unshare and uid_drop the sandbox fails closed: `require_isolation()` raises
SandboxUnavailable rather than run model code, unless the user opts in with
EVOTRAINER_SANDBOX_UNISOLATED=accept. What that gives up: model code can then read and write whatever the
trainer's user can (the run directory, the store, the evaluator's hidden data, the user's files) and reach
the network; only the rlimits and the wall and output caps still hold.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from evotrainer.errors import UserError
from evotrainer.sandbox.limits import Limits

log = logging.getLogger(__name__)

_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32")
# The opt-in to running model code where no layer isolates it (the value must be `accept`).
UNISOLATED_ENV = "EVOTRAINER_SANDBOX_UNISOLATED"
_FIX = (
    "Install bubblewrap (apt-get install bubblewrap, which scripts/setup.sh does as root), or accept running "
    f"model code without isolation by setting {UNISOLATED_ENV}=accept."
)


# -- which isolation layers this machine has ---------------------------------------------------------
_mech: dict[str, bool] | None = None
_mech_lock = threading.Lock()


def python_executable() -> str:
    """The real interpreter (a venv's python is a symlink into an install the sandbox binds)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _install_prefix() -> str:
    return os.path.realpath(sys.base_prefix)


def _world_reachable(path: str) -> bool:
    """Can an unprivileged uid execute `path` (every parent directory searchable by others)?"""
    p = Path(path)
    return all(os.stat(d).st_mode & 0o001 for d in p.parents) and bool(os.stat(p).st_mode & 0o005)


def mechanisms() -> dict[str, bool]:
    """The isolation layers active on this machine, probed once. Missing layers are logged once, and
    the sandbox falls back to the strongest remaining; rlimits and session kills always apply. With no
    isolating layer at all, `require_isolation()` refuses to run model code (see the module docstring)."""
    global _mech
    with _mech_lock:
        if _mech is None:
            _mech = _probe()
            missing = [k for k in ("bwrap", "netns", "pidns", "nproc") if not _mech[k]]
            if not isolated(_mech):
                log.warning(
                    "sandbox: %s not available on this machine, and no dropped uid: %s",
                    ", ".join(missing),
                    f"model code runs WITHOUT isolation ({UNISOLATED_ENV}=accept)"
                    if _accepted()
                    else "model code will be refused. " + _FIX,
                )
            elif missing:
                log.warning(
                    "sandbox: %s not available on this machine; model code runs with %s. "
                    "Install bubblewrap (apt-get install bubblewrap) for full isolation.",
                    ", ".join(missing),
                    ", ".join(k for k, v in _mech.items() if v),
                )
        return dict(_mech)


# -- failing closed --------------------------------------------------------------------------------------
class SandboxUnavailable(UserError):
    """No isolation layer (bubblewrap, a network namespace, a dropped uid) works on this machine, and the
    user has not opted in to running model code without one."""


def isolated(m: dict[str, bool]) -> bool:
    """Does at least one layer beyond rlimits keep the job from the network or the trainer's files?"""
    return m["bwrap"] or m["netns"] or m["uid_drop"]


def _accepted() -> bool:
    return os.environ.get(UNISOLATED_ENV) == "accept"


def require_isolation() -> dict[str, bool]:
    """The active layers (as `mechanisms()`), or SandboxUnavailable where none isolates the job and
    EVOTRAINER_SANDBOX_UNISOLATED is not `accept`. Read on every call, so setting the variable (or
    unsetting it) takes effect for the next job. Opting in gives up this: model code can read and write
    whatever the trainer's user can, and reach the network."""
    m = mechanisms()
    if isolated(m) or _accepted():
        return m
    value = os.environ.get(UNISOLATED_ENV)
    disabled = os.environ.get("EVOTRAINER_SANDBOX_DISABLE")
    raise SandboxUnavailable(
        "sandbox: refusing to run model code: no isolation layer works on this machine (no bubblewrap, no "
        "network namespace, no unprivileged uid to drop to"
        + (f"; EVOTRAINER_SANDBOX_DISABLE={disabled} turned layers off" if disabled else "")
        + "). Run without isolation, model code could read and write whatever the trainer's user can (the run "
        "directory, the store, the evaluator's hidden data) and reach the network. "
        + _FIX
        + (f" ({UNISOLATED_ENV} is set to {value!r}; only the exact value 'accept' opts in.)" if value else "")
    )


def _probe() -> dict[str, bool]:
    # EVOTRAINER_SANDBOX_DISABLE=bwrap,unshare,setpriv skips layers: to test the fallbacks, or where a
    # layer exists but misbehaves. It can only weaken isolation to a level this module supports.
    off = set(filter(None, os.environ.get("EVOTRAINER_SANDBOX_DISABLE", "").split(",")))
    root = os.geteuid() == 0
    m = {
        "bwrap": False,
        "mountns": False,
        "netns": False,
        "pidns": False,
        "userns": False,
        "uid_drop": False,
        "rlimits": True,
        "nproc": False,
        "prlimit": shutil.which("prlimit") is not None,
        "tmpfs": False,
    }
    setpriv = root and "setpriv" not in off and shutil.which("setpriv") is not None
    with tempfile.TemporaryDirectory(prefix="evotrainer-probe-") as d:
        uid = next_uid() if setpriv else None
        if uid is not None:
            os.chown(d, uid, uid)
        if "bwrap" not in off and shutil.which("bwrap"):
            cmd = (
                _bwrap_prefix(d, (), die_with_parent=True, root=root)
                + _setpriv(uid)
                + [python_executable(), "-S", "-I", "-c", "pass"]
            )
            m["bwrap"] = _probe_ok(cmd)
            # --size (bwrap >= 0.8) caps the pool workers' tmpfs; older versions bind a host directory.
            m["tmpfs"] = m["bwrap"] and _probe_ok(
                _bwrap_prefix(d, (), die_with_parent=True, root=root, tmpfs_bytes=1 << 20)
                + _setpriv(uid)
                + [python_executable(), "-S", "-I", "-c", "open('x', 'w')"]
            )
        if not m["bwrap"] and "unshare" not in off and shutil.which("unshare"):
            m["unshare"] = _probe_ok(_unshare_prefix(root) + ["true"])
    m["mountns"] = m["bwrap"]
    m["netns"] = m["pidns"] = m["bwrap"] or m.pop("unshare", False)
    m.pop("unshare", None)
    m["userns"] = m["netns"] and not root
    # As root the dropped uid needs to reach the interpreter: bwrap binds it; otherwise it must be
    # world-executable where it lies (a pyenv under /root is not).
    m["uid_drop"] = setpriv and (m["bwrap"] or _world_reachable(python_executable()))
    # RLIMIT_NPROC holds for a non-root uid: the dropped uid, or the user itself inside a fresh user
    # namespace (counted there from zero). Root without uid drop, or a user without a namespace (whose
    # own processes would count), get no process limit: the pid namespace and the wall limit bound it.
    m["nproc"] = m["uid_drop"] or m["userns"]
    return m


def _probe_ok(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


_uid_lock = threading.Lock()
_uid_counter = 0


def next_uid() -> int:
    """An unprivileged uid for one sandbox (root only): distinct per sandbox in this process and
    spread by pid across processes, so their process counts (RLIMIT_NPROC is per uid) do not mix."""
    global _uid_counter
    with _uid_lock:
        _uid_counter += 1
        return 200_000 + (os.getpid() * 97 + _uid_counter) % 1_000_000


# -- building the command ------------------------------------------------------------------------------
def _bwrap_prefix(
    workdir: str, readonly: Sequence[str], *, die_with_parent: bool, root: bool, tmpfs_bytes: int | None = None
) -> list[str]:
    """tmpfs_bytes: make workdir a fresh tmpfs of that size instead of binding the host directory
    (the pool's workers: job files never touch the disk, and their total size is capped)."""
    cmd = [
        "bwrap",
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--new-session",
    ]
    if not root:
        cmd.append("--unshare-user")
    if die_with_parent:
        cmd.append("--die-with-parent")
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            cmd += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            cmd += ["--ro-bind", d, d]
    binds = [_install_prefix(), os.path.dirname(python_executable())] + [os.path.realpath(p) for p in readonly]
    binds = [p for p in dict.fromkeys(binds) if not any(p == d or p.startswith(d + "/") for d in _SYSTEM_DIRS)]
    # bwrap copies the mode of a bound path's parents (/root is 0700): make them searchable, or the
    # job's unprivileged uid cannot reach the interpreter it is about to exec.
    parents = dict.fromkeys(str(a) for p in binds for a in reversed(Path(p).parents) if str(a) != "/")
    for a in parents:
        cmd += ["--perms", "0755", "--dir", a]
    for p in binds:
        cmd += ["--ro-bind", p, p]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for a in reversed(Path(workdir).parents):  # the same for the workdir (pytest's tmp dirs are 0700)
        if str(a) not in ("/", "/tmp") and str(a) not in parents:
            cmd += ["--perms", "0755", "--dir", str(a)]
    if tmpfs_bytes:
        cmd += ["--perms", "0777", "--size", str(tmpfs_bytes), "--tmpfs", workdir]
    else:
        cmd += ["--bind", workdir, workdir]
    cmd += ["--chdir", workdir, "--clearenv"]
    for k, v in job_env(workdir).items():
        cmd += ["--setenv", k, v]
    return cmd


def _unshare_prefix(root: bool) -> list[str]:
    # --kill-child: the namespace's first process dies with unshare, and with it every process in it.
    return ["unshare", "-n", "--pid", "--fork", "--kill-child"] + ([] if root else ["-r"])


def _setpriv(uid: int | None) -> list[str]:
    if uid is None:
        return []
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
    ]


def _rlimit_prefix(limits: Limits, nproc: bool) -> list[str]:
    cpu = max(1, int(-(-limits.cpu_seconds // 1)))
    spec = {"cpu": (cpu, cpu + 1), "as": limits.memory_mb << 20, "fsize": limits.file_bytes, "core": 0}
    if nproc:
        spec["nproc"] = limits.processes
    if shutil.which("prlimit"):
        return ["prlimit", f"--cpu={cpu}:{cpu + 1}"] + [f"--{k}={v}" for k, v in spec.items() if k != "cpu"] + ["--"]
    # No prlimit binary: a Python launcher sets the limits and execs the command.
    launcher = (
        "import os,resource,sys,json;s=json.loads(sys.argv[1])\n"
        "for k,v in s.items():\n v=v if isinstance(v,list) else [v,v]\n"
        " resource.setrlimit(getattr(resource,'RLIMIT_'+k.upper()),tuple(v))\n"
        "os.execvp(sys.argv[2],sys.argv[2:])"
    )
    return [python_executable(), "-S", "-I", "-c", launcher, json.dumps(spec)]


def job_env(workdir: str) -> dict[str, str]:
    return {"HOME": workdir, "TMPDIR": workdir, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def command(
    argv: list[str],
    workdir: str,
    limits: Limits | None,
    readonly: Sequence[str],
    *,
    die_with_parent: bool,
    uid: int | None,
    tmpfs_bytes: int | None = None,
) -> list[str]:
    """The full command line. rlimits are set last, inside the namespaces: for a non-root user the
    process limit then counts only the processes of the new user namespace. Fails closed: raises
    SandboxUnavailable where no layer isolates the job and the user has not opted in."""
    m = require_isolation()
    root = os.geteuid() == 0
    exe = shutil.which(argv[0]) or argv[0]
    inner = _setpriv(uid) + (_rlimit_prefix(limits, m["nproc"]) if limits else []) + [os.path.realpath(exe), *argv[1:]]
    if m["bwrap"]:
        return (
            _bwrap_prefix(
                workdir,
                readonly,
                die_with_parent=die_with_parent,
                root=root,
                tmpfs_bytes=tmpfs_bytes if m["tmpfs"] else None,
            )
            + inner
        )
    if m["netns"]:
        return _unshare_prefix(root) + inner
    return inner


def give(path: Path, uid: int | None) -> None:
    """Hand the job's directory to its uid, so the job can write there and nowhere else."""
    if uid is None:
        return
    os.chown(path, uid, uid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)
