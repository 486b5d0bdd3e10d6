"""The sandbox: model-written code runs in a separate, resource-limited process with no network, a private
working directory and, where bubblewrap exists, a filesystem view of only the Python install and that
directory. The trainer never imports it (DESIGN.md invariant 8).

Layers, strongest available first (`mechanisms()` says which are active, and warns once about the rest):
  bwrap     mount + pid + net + ipc + uts namespaces: the job sees /usr, the Python install (read-only)
            and its own directory; nothing of the run directory, the store or the evaluator's data.
  unshare   without bwrap: pid + net namespaces (plus a user namespace when not root).
  uid_drop  as root, the job runs under an unprivileged uid of its own (setpriv): RLIMIT_NPROC is not
            enforced for root, so this is what makes the process limit hold; it also keeps the job
            out of root-only files.
  rlimits   always: CPU seconds, address space, file size, no core files; processes where `nproc`.
Wall time and output size are enforced here: the pipes are read incrementally and the job's whole
session is killed at the cap; with a pid namespace, killing its first process ends every process in it.
"""
from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from evotrainer.envs import sandbox_worker

log = logging.getLogger(__name__)

Termination = str  # "ok" | "error" | "timeout" | "memory" | "output"
TERMINATIONS = ("ok", "error", "timeout", "memory", "output")
_WORKER_SOURCE = Path(sandbox_worker.__file__).read_text()
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32")
# Everything a pool worker's jobs may hold on disk at once (one job at a time, so one job's files).
WORKER_TMPFS_BYTES = 256 << 20


@dataclass(frozen=True)
class Limits:
    cpu_seconds: float = 2.0
    """CPU time (RLIMIT_CPU, whole seconds, rounded up): SIGXCPU, then SIGKILL a second later."""
    wall_seconds: float = 5.0
    """Wall clock from start to exit; the whole process group is killed at the limit."""
    memory_mb: int = 256
    """Address space (RLIMIT_AS); Python raises MemoryError past it."""
    processes: int = 32
    """RLIMIT_NPROC for the job's uid (enforced where mechanisms()['nproc'])."""
    output_bytes: int = 64_000
    """stdout + stderr together; the job is killed when it writes more. Each stream keeps its tail."""
    file_bytes: int = 4_000_000
    """Largest file the job may write (RLIMIT_FSIZE)."""


@dataclass(frozen=True)
class ExecResult:
    termination: Termination
    """ok | error (nonzero exit) | timeout (wall or CPU) | memory | output (output or file size cap)."""
    returncode: int | None
    """Exit code (negative: killed by that signal); None when the sandbox killed it at a limit."""
    stdout: str
    stderr: str
    wall_seconds: float

    @property
    def ok(self) -> bool:
        return self.termination == "ok"


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
    the sandbox falls back to the strongest remaining; rlimits and session kills always apply."""
    global _mech
    with _mech_lock:
        if _mech is None:
            _mech = _probe()
            missing = [k for k in ("bwrap", "netns", "pidns", "nproc") if not _mech[k]]
            if missing:
                log.warning("sandbox: %s not available on this machine; model code runs with %s. "
                            "Install bubblewrap (apt-get install bubblewrap) for full isolation.",
                            ", ".join(missing), ", ".join(k for k, v in _mech.items() if v) or "rlimits only")
        return dict(_mech)


def _probe() -> dict[str, bool]:
    # EVOTRAINER_SANDBOX_DISABLE=bwrap,unshare,setpriv skips layers: to test the fallbacks, or where a
    # layer exists but misbehaves. It can only weaken isolation to a level this module supports.
    off = set(filter(None, os.environ.get("EVOTRAINER_SANDBOX_DISABLE", "").split(",")))
    root = os.geteuid() == 0
    m = {"bwrap": False, "mountns": False, "netns": False, "pidns": False, "userns": False, "uid_drop": False,
         "rlimits": True, "nproc": False, "prlimit": shutil.which("prlimit") is not None, "tmpfs": False}
    setpriv = root and "setpriv" not in off and shutil.which("setpriv") is not None
    with tempfile.TemporaryDirectory(prefix="evotrainer-probe-") as d:
        uid = _next_uid() if setpriv else None
        if uid is not None:
            os.chown(d, uid, uid)
        if "bwrap" not in off and shutil.which("bwrap"):
            cmd = _bwrap_prefix(d, (), die_with_parent=True, root=root) + _setpriv(uid) + [python_executable(), "-S", "-I", "-c", "pass"]
            m["bwrap"] = _probe_ok(cmd)
            # --size (bwrap >= 0.8) caps the pool workers' tmpfs; older versions bind a host directory.
            m["tmpfs"] = m["bwrap"] and _probe_ok(_bwrap_prefix(d, (), die_with_parent=True, root=root, tmpfs_bytes=1 << 20)
                                                  + _setpriv(uid) + [python_executable(), "-S", "-I", "-c", "open('x', 'w')"])
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


def _next_uid() -> int:
    """An unprivileged uid for one sandbox (root only): distinct per sandbox in this process and
    spread by pid across processes, so their process counts (RLIMIT_NPROC is per uid) do not mix."""
    global _uid_counter
    with _uid_lock:
        _uid_counter += 1
        return 200_000 + (os.getpid() * 97 + _uid_counter) % 1_000_000


# -- building the command ------------------------------------------------------------------------------
def _bwrap_prefix(workdir: str, readonly: Sequence[str], *, die_with_parent: bool, root: bool,
                  tmpfs_bytes: int | None = None) -> list[str]:
    """tmpfs_bytes: make workdir a fresh tmpfs of that size instead of binding the host directory
    (the pool's workers: job files never touch the disk, and their total size is capped)."""
    cmd = ["bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
           "--new-session"]
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
    for k, v in _env(workdir).items():
        cmd += ["--setenv", k, v]
    return cmd


def _unshare_prefix(root: bool) -> list[str]:
    # --kill-child: the namespace's first process dies with unshare, and with it every process in it.
    return ["unshare", "-n", "--pid", "--fork", "--kill-child"] + ([] if root else ["-r"])


def _setpriv(uid: int | None) -> list[str]:
    if uid is None:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs"]


def _rlimit_prefix(limits: Limits, nproc: bool) -> list[str]:
    cpu = max(1, int(-(-limits.cpu_seconds // 1)))
    spec = {"cpu": (cpu, cpu + 1), "as": limits.memory_mb << 20, "fsize": limits.file_bytes, "core": 0}
    if nproc:
        spec["nproc"] = limits.processes
    if shutil.which("prlimit"):
        return ["prlimit", f"--cpu={cpu}:{cpu + 1}"] + [f"--{k}={v}" for k, v in spec.items() if k != "cpu"] + ["--"]
    # No prlimit binary: a Python launcher sets the limits and execs the command.
    launcher = ("import os,resource,sys,json;s=json.loads(sys.argv[1])\n"
                "for k,v in s.items():\n v=v if isinstance(v,list) else [v,v]\n"
                " resource.setrlimit(getattr(resource,'RLIMIT_'+k.upper()),tuple(v))\n"
                "os.execvp(sys.argv[2],sys.argv[2:])")
    return [python_executable(), "-S", "-I", "-c", launcher, json.dumps(spec)]


def _env(workdir: str) -> dict[str, str]:
    return {"HOME": workdir, "TMPDIR": workdir, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def _command(argv: list[str], workdir: str, limits: Limits | None, readonly: Sequence[str], *, die_with_parent: bool,
             uid: int | None, tmpfs_bytes: int | None = None) -> list[str]:
    """The full command line. rlimits are set last, inside the namespaces: for a non-root user the
    process limit then counts only the processes of the new user namespace."""
    m = mechanisms()
    root = os.geteuid() == 0
    exe = shutil.which(argv[0]) or argv[0]
    inner = _setpriv(uid) + (_rlimit_prefix(limits, m["nproc"]) if limits else []) + [os.path.realpath(exe), *argv[1:]]
    if m["bwrap"]:
        return _bwrap_prefix(workdir, readonly, die_with_parent=die_with_parent, root=root,
                             tmpfs_bytes=tmpfs_bytes if m["tmpfs"] else None) + inner
    if m["netns"]:
        return _unshare_prefix(root) + inner
    return inner


def _give(path: Path, uid: int | None) -> None:
    """Hand the job's directory to its uid, so the job can write there and nowhere else."""
    if uid is None:
        return
    os.chown(path, uid, uid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _spawn(cmd: list[str], workdir: Path, stderr: int = subprocess.PIPE) -> tuple[subprocess.Popen, int | None]:
    """Start a sandbox command; with bwrap also return a pidfd of the pid namespace's first process
    (reported on --info-fd), through which _stop ends every process in the namespace."""
    info_r = info_w = None
    if cmd[0] == "bwrap":
        info_r, info_w = os.pipe()
        cmd = [cmd[0], "--info-fd", str(info_w), *cmd[1:]]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=workdir,
                            env=_env(str(workdir)), start_new_session=True, close_fds=True,
                            pass_fds=(info_w,) if info_w is not None else ())
    if info_r is None:
        return proc, None
    os.close(info_w)
    info = b""
    while b"}" not in info:
        chunk = _read_exact(info_r, 1, 10.0)
        if not chunk:
            break
        info += chunk
    os.close(info_r)
    try:
        return proc, os.pidfd_open(int(json.loads(info)["child-pid"]))
    except (ValueError, KeyError, OSError):
        return proc, None


def _stop(proc: subprocess.Popen, ns_fd: int | None) -> None:
    """Kill a sandbox and wait until every process in it is gone. Killing the pid namespace's first
    process makes the kernel kill the rest (even those that left the session), but asynchronously:
    its pidfd turns readable only once they are dead. Without bwrap (unshare), that first process is
    unshare's child, found while unshare is alive; without a namespace, the session kill is all."""
    fds = [ns_fd] if ns_fd is not None else []
    if ns_fd is None and proc.poll() is None:
        try:
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            fds = [os.pidfd_open(int(k)) for k in kids]
        except OSError:
            pass
    for fd in fds:
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
    _kill_group(proc.pid)
    proc.wait()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
    for fd in fds:
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        sel.select(5.0)
        sel.close()
        os.close(fd)


# -- one process ------------------------------------------------------------------------------------------
def run(argv: list[str], workdir: Path, limits: Limits = Limits(), stdin: str = "", *,
        readonly: Sequence[Path] = ()) -> ExecResult:
    """Run argv in the sandbox with `workdir` as its cwd and HOME (the only writable place it sees
    under bwrap). `readonly`: extra paths bound read-only (bwrap only; e.g. a repository to test).
    Hidden data the job must not read stays out of workdir, or goes in over stdin."""
    workdir = Path(workdir).resolve()
    if not workdir.is_dir():
        raise FileNotFoundError(f"sandbox workdir {workdir} is not a directory")
    m = mechanisms()
    uid = _next_uid() if m["uid_drop"] else None
    _give(workdir, uid)
    cmd = _command(argv, str(workdir), limits, [str(p) for p in readonly], die_with_parent=True, uid=uid)
    t0 = time.monotonic()
    proc, ns_fd = _spawn(cmd, workdir)
    try:
        out, err, killed = _pump(proc, stdin.encode(), limits, t0 + limits.wall_seconds)
    finally:
        _stop(proc, ns_fd)  # whatever is left of it, and wait until it is gone
    rc = _exit_code(proc.returncode, m["bwrap"])
    reason = killed or sandbox_worker.classify(rc, err, time.monotonic() - t0, limits.cpu_seconds)
    return ExecResult(reason, None if killed else rc, out, err, time.monotonic() - t0)


def _exit_code(rc: int, bwrap: bool) -> int:
    # bwrap reports a child killed by signal N as exit status 128 + N; unshare re-raises the signal.
    return -(rc - 128) if bwrap and 128 < rc < 160 else rc


def _pump(proc: subprocess.Popen, data: bytes, limits: Limits, deadline: float) -> tuple[str, str, str | None]:
    """Feed stdin, read stdout / stderr incrementally (tails kept), stop at the wall or output cap."""
    sel = selectors.DefaultSelector()
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    for f in bufs:
        sel.register(f, selectors.EVENT_READ)
    view = memoryview(data)
    if view:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    total, reason, cap = 0, None, limits.output_bytes
    while sel.get_map() and reason is None:
        left = deadline - time.monotonic()
        if left <= 0:
            reason = "timeout"
            break
        for key, _ in sel.select(left):
            f = key.fileobj
            if f is proc.stdin:
                try:
                    view = view[os.write(f.fileno(), view[:65536]):]
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    view = view[:0]
                if not view:
                    sel.unregister(f)
                    f.close()
                continue
            chunk = os.read(f.fileno(), 65536)
            if not chunk:
                sel.unregister(f)
                continue
            total += len(chunk)
            sandbox_worker.keep_tail(bufs[f], chunk, cap)
            if total > cap:
                reason = "output"
    sel.close()
    if reason is None:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            reason = "timeout"
    return bufs[proc.stdout].decode("utf-8", "replace"), bufs[proc.stderr].decode("utf-8", "replace"), reason


def run_python(source: str, workdir: Path, limits: Limits = Limits(), stdin: str = "") -> ExecResult:
    """Write `source` to workdir/main.py and run it with `python -S -I` in the sandbox."""
    workdir = Path(workdir)
    (workdir / "main.py").write_text(source)
    return run([python_executable(), "-S", "-I", "main.py"], workdir, limits, stdin)


def _read_exact(fd: int, n: int, timeout: float) -> bytes | None:
    deadline = time.monotonic() + timeout
    buf = b""
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return None
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf
    finally:
        sel.close()
