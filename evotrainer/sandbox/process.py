"""Starting, feeding and stopping one sandboxed process: incremental pipes with output caps, a wall
deadline, and a kill that waits until every process of the sandbox is gone."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from pathlib import Path

from evotrainer.sandbox import worker
from evotrainer.sandbox.isolation import job_env
from evotrainer.sandbox.limits import Limits


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def spawn(cmd: list[str], workdir: Path, stderr: int = subprocess.PIPE) -> tuple[subprocess.Popen, int | None]:
    """Start a sandbox command; with bwrap also return a pidfd of the pid namespace's first process
    (reported on --info-fd), through which _stop ends every process in the namespace."""
    info_r = info_w = None
    if cmd[0] == "bwrap":
        info_r, info_w = os.pipe()
        cmd = [cmd[0], "--info-fd", str(info_w), *cmd[1:]]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        cwd=workdir,
        env=job_env(str(workdir)),
        start_new_session=True,
        close_fds=True,
        pass_fds=(info_w,) if info_w is not None else (),
    )
    if info_r is None:
        return proc, None
    os.close(info_w)
    info = b""
    while b"}" not in info:
        chunk = read_exact(info_r, 1, 10.0)
        if not chunk:
            break
        info += chunk
    os.close(info_r)
    try:
        return proc, os.pidfd_open(int(json.loads(info)["child-pid"]))
    except (ValueError, KeyError, OSError):
        return proc, None


def stop(proc: subprocess.Popen, ns_fd: int | None) -> None:
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
    kill_group(proc.pid)
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


def exit_code(rc: int, bwrap: bool) -> int:
    # bwrap reports a child killed by signal N as exit status 128 + N; unshare re-raises the signal.
    return -(rc - 128) if bwrap and 128 < rc < 160 else rc


def pump(proc: subprocess.Popen, data: bytes, limits: Limits, deadline: float) -> tuple[str, str, str | None]:
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
                    view = view[os.write(f.fileno(), view[:65536]) :]
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
            worker.keep_tail(bufs[f], chunk, cap)
            if total > cap:
                reason = "output"
    sel.close()
    if reason is None:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            reason = "timeout"
    return bufs[proc.stdout].decode("utf-8", "replace"), bufs[proc.stderr].decode("utf-8", "replace"), reason


def read_exact(fd: int, n: int, timeout: float) -> bytes | None:
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
