"""The pool worker: a long-lived process inside the sandbox that runs one small Python job at a time in a
forked child with its own rlimits, private job directory and session. Standard library only: it is
passed to `python -S -I -c` and never imported by the trainer.

Protocol on the worker's stdin / stdout: 8-byte big-endian length + JSON, one job in, one result out.
Job: {"source", "files", "stdin", "cpu", "wall", "memory_mb", "processes", "output_bytes", "file_bytes"}.
Result: {"termination", "returncode", "stdout", "stderr", "wall_seconds"}.
"""

import json
import os
import resource
import select
import shutil
import signal
import struct
import sys
import time

MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
# Python ignores SIGXFSZ, so a write past RLIMIT_FSIZE raises EFBIG instead of killing the process.
FILE_SIZE_MARKER = "[Errno 27] File too large"


def _nondumpable():
    # The worker's /proc/PID/fd and ptrace are then closed to the job's processes (same uid): a job
    # cannot write a forged result into the worker's channel to the trainer.
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


def _read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _send(obj):
    data = json.dumps(obj).encode()
    os.write(1, struct.pack(">Q", len(data)) + data)


def _child(job, jobdir, in_r, out_w, err_w):
    """In the forked child: never returns."""
    code = 1
    try:
        os.setsid()
        os.dup2(in_r, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 4096)  # the worker's channel to the trainer is fd 0/1, replaced above
        os.chdir(jobdir)
        os.environ.clear()
        os.environ.update(HOME=jobdir, TMPDIR=jobdir, PATH="/usr/bin:/bin", LANG="C.UTF-8")
        cpu = max(1, int(-(-job["cpu"] // 1)))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (job["memory_mb"] << 20,) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (job["file_bytes"],) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if job.get("nproc"):
            resource.setrlimit(resource.RLIMIT_NPROC, (job["processes"],) * 2)
        sys.argv = ["main.py"]
        sys.path.insert(0, jobdir)
        import builtins

        glb = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
        try:
            exec(compile(job["source"], "main.py", "exec"), glb)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException as e:
            import traceback

            # Without the worker's own frame: the traceback starts in the job's code.
            traceback.print_exception(type(e), e, e.__traceback__.tb_next)
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            code = code or 1
        os._exit(code & 0xFF)


def _run(job, root, seq, kill_all):
    t0 = time.monotonic()
    jobdir = os.path.join(root, f"job{seq}")
    os.mkdir(jobdir, 0o700)
    for name, text in (job.get("files") or {}).items():
        path = os.path.join(jobdir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    with open(os.path.join(jobdir, "main.py"), "w") as f:
        f.write(job["source"])
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _child(job, jobdir, in_r, out_w, err_w)
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    deadline = t0 + job["wall"]
    bufs, reason, writers = _pump(job, in_w, out_r, err_r, deadline)
    status = None
    if reason is None:  # pipes closed: the job's own process may still be running
        while status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
            elif time.monotonic() >= deadline:
                reason = "timeout"
                break
            else:
                time.sleep(0.001)
    for kill in (os.killpg, os.kill):  # the job's session (its children too), and the job itself
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    rest = kill_all and _kill_the_rest()
    if status is None:
        status = os.waitpid(pid, 0)[1]
    if rest:
        _wait_for_the_rest()
    while True:  # reap orphans reparented to us (the worker is pid 1 under `unshare --pid`)
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    for fd in [out_r, err_r] + writers:
        os.close(fd)
    shutil.rmtree(jobdir, ignore_errors=True)
    stdout = bufs[out_r].decode("utf-8", "replace")
    stderr = bufs[err_r].decode("utf-8", "replace")
    rc = os.waitstatus_to_exitcode(status)
    killed = reason is not None
    if reason is None:
        reason = classify(rc, stderr, time.monotonic() - t0, job["cpu"])
    return {
        "termination": reason,
        "returncode": None if killed else rc,
        "stdout": stdout,
        "stderr": stderr,
        "wall_seconds": time.monotonic() - t0,
    }


def _pump(job, in_w, out_r, err_r, deadline):
    """Feed the job's stdin and read its stdout / stderr (tails kept) until both close, the wall deadline
    passes or the output cap is crossed. Returns (buffers by fd, reason or None, writers still open)."""
    pending = memoryview(job.get("stdin", "").encode())
    os.set_blocking(in_w, False)
    if not pending:
        os.close(in_w)
    bufs = {out_r: bytearray(), err_r: bytearray()}
    cap, total, reason = job["output_bytes"], 0, None
    readers = [out_r, err_r]
    writers = [in_w] if pending else []
    while readers and reason is None:
        left = deadline - time.monotonic()
        if left <= 0:
            reason = "timeout"
            break
        r, w, _ = select.select(readers, writers, [], left)
        for fd in w:
            try:
                pending = pending[os.write(fd, pending[:65536]) :]
            except BlockingIOError:
                pass
            except BrokenPipeError:  # the job does not read its stdin: fine
                pending = pending[:0]
            if not pending:
                os.close(fd)
                writers = []
        for fd in r:
            data = os.read(fd, 65536)
            if not data:
                readers.remove(fd)
                continue
            total += len(data)
            keep_tail(bufs[fd], data, cap)
            if total > cap:
                reason = "output"
    return bufs, reason, writers


def _kill_the_rest():
    """Kill everything else this uid runs in this sandbox (a child that left the session with setsid,
    a daemon meant to tamper with the next job); kill(-1) spares only the worker and the namespace's
    init. True when something was there to kill."""
    try:
        os.kill(-1, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _wait_for_the_rest():
    """kill(-1) delivers asynchronously: wait until those processes are gone."""
    me, uid = os.getpid(), os.getuid()
    if me == 1:  # under `unshare --pid` every other process descends from us: reap them all
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                return
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        alive = False
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in (me, 1):
                continue
            try:
                with open(f"/proc/{name}/status") as f:
                    fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
            except OSError:
                continue
            if int(fields.get("Uid", "-1").split()[0]) == uid and not fields.get("State", "").strip().startswith(
                ("Z", "X")
            ):
                alive = True
                break
        if not alive:
            return
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.002)


def keep_tail(buf, data, cap):
    """Append `data` to `buf`, keeping only its last `cap` bytes (the tail holds the error)."""
    buf += data
    if len(buf) > cap:
        del buf[: len(buf) - cap]


UNSHARE_LOST_SIGNAL = "unshare: sigprocmask unblock failed"


def classify(rc, stderr, wall, cpu):
    """Termination of a process that ended on its own (sandbox.py uses the same rules)."""
    if rc == 0:
        return "ok"
    sig = -rc if rc < 0 else None
    # RLIMIT_CPU sends SIGXCPU at the soft limit and SIGKILL at the hard one; a SIGKILL that came
    # sooner than the CPU limit could have is something else (the job killing itself, say).
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and wall >= cpu):
        return "timeout"
    # util-linux's `unshare --fork` (the fallback without bwrap) re-raises the signal its child died of, but
    # fails to for SIGXCPU: it prints this and exits 1, and which signal it was is lost. The rule above for an
    # unnamed kill applies: one that came no sooner than the CPU limit could have is the limit.
    if rc == 1 and UNSHARE_LOST_SIGNAL in stderr[-2000:] and wall >= cpu:
        return "timeout"
    if sig == signal.SIGXFSZ or FILE_SIZE_MARKER in stderr[-2000:]:
        return "output"
    if any(m in stderr[-2000:] for m in MEMORY_MARKERS):
        return "memory"
    return "error"


def main():
    cfg = json.loads(sys.argv[1])
    root = cfg["root"]
    os.chdir(root)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _nondumpable()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    seq = 0
    while True:
        hdr = _read_exact(0, 8)
        if hdr is None:
            return  # the trainer closed the channel (or died): the sandbox goes with us
        job = json.loads(_read_exact(0, struct.unpack(">Q", hdr)[0]))
        job["nproc"] = cfg["nproc"]
        seq += 1
        _send(_run(job, root, seq, cfg["kill_all"]))
        del job


if __name__ == "__main__":
    main()
