"""The in-sandbox half of :class:`PythonSandbox`: a persistent Python session served over pipes.

Runs as a script inside the sandbox (stdlib only: it must not import rz_agents, which the sandbox
cannot see). The host imports it as a module only to share the framing helpers.

Protocol: each message is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON.
The worker sends ``{"ready": true}`` once, then answers each ``{"code", "timeout_s"}`` request
with one result ``{"stdout", "stderr", "error", "timed_out", "duration_s", ...}``.

Why it is shaped this way:
- the code runs in this process (not a fork per call) so variables and imports persist;
- user output goes to memfds dup'ed onto fds 1 and 2, so C-level and child-process writes are
  captured too, and RLIMIT_FSIZE bounds them;
- a Python-level timeout (SIGALRM) keeps the session alive for ordinary infinite loops; code that
  blocks signals or spins in C is killed by the host's wall-clock deadline instead;
- after every call ``kill(-1, SIGKILL)`` removes every other process of the sandbox's pid namespace
  (the worker and the namespace's init are exempt), so nothing runs in the background between calls.
"""

from __future__ import annotations

import ast
import io
import json
import linecache
import os
import resource
import signal
import struct
import sys
import threading
import time
import traceback
from typing import Any

HEADER = struct.Struct(">I")


def write_frame(fd: int, obj: dict[str, Any]) -> None:
    """Write one length-prefixed JSON message to ``fd``."""
    data = json.dumps(obj).encode("utf-8")
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def read_exact(fd: int, n: int) -> bytes | None:
    """Read exactly ``n`` bytes (None on end of file)."""
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> dict[str, Any] | None:
    """Read one length-prefixed JSON message (None on end of file)."""
    head = read_exact(fd, HEADER.size)
    if head is None:
        return None
    body = read_exact(fd, HEADER.unpack(head)[0])
    return None if body is None else json.loads(body)


class CellTimeout(BaseException):
    """Raised inside user code when the per-call wall or CPU limit fires (BaseException so a bare
    ``except Exception`` in user code does not swallow it)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise CellTimeout("wall time limit exceeded" if signum == signal.SIGALRM else "CPU time limit exceeded")


def _restore_signals() -> None:
    # user code may have changed any of these; put back the worker's own handling before each call
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGXCPU, _on_alarm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(
        signal.SIGXFSZ, signal.SIG_IGN
    )  # over-size writes then fail with EFBIG instead of killing us
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _descendants(root: int) -> list[int]:
    """Pids whose parent chain leads to ``root`` (used when there is no private pid namespace)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
                parents[int(name)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        frontier += children
    return found


def _kill_other_processes(own_pid_namespace: bool) -> None:
    """SIGKILL every process of the sandbox but us and pid 1, then reap our children.

    Without a private pid namespace (the explicitly allowed unsandboxed mode) ``kill(-1)`` would
    hit every process of the user, so only our descendants are killed; a process that
    daemonised away from us escapes in that mode.
    """
    if not own_pid_namespace:
        for _ in range(20):
            pids = _descendants(os.getpid())
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            _reap()
        _reap()
        return
    for _ in range(50):
        try:
            os.kill(-1, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _reap()
        me = os.getpid()
        others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not others:
            return
        time.sleep(0.001)  # orphans re-parented to pid 1 are reaped by it; give it a moment


def _reap() -> None:
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def _read_capped(fd: int, cap: int) -> tuple[str, int]:
    """Text written to the memfd ``fd``: all of it, or its head and tail with a marker if over ``cap``."""
    size = os.fstat(fd).st_size
    if size <= cap:
        data = os.pread(fd, size, 0)
    else:
        half = cap // 2
        cut = size - 2 * half
        data = (
            os.pread(fd, half, 0)
            + f"\n... [{cut} bytes of output cut] ...\n".encode()
            + os.pread(fd, half, size - half)
        )
    return data.decode("utf-8", errors="replace"), size


def _short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


class Session:
    """The persistent interpreter state and the logic of one call."""

    def __init__(self, limits: dict[str, Any]) -> None:
        self.limits = limits
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
        self.cell = 0
        self.pid = os.getpid()
        self.out_fd = os.memfd_create("stdout")
        self.err_fd = os.memfd_create("stderr")

    def _redirect(self) -> None:
        for fd in (self.out_fd, self.err_fd):
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
        os.dup2(self.out_fd, 1)
        os.dup2(self.err_fd, 2)
        # fresh text wrappers each call: an earlier call may have broken or replaced them
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", write_through=True)

    def _arm_limits(self, timeout_s: float) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        used = usage.ru_utime + usage.ru_stime
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        soft = int(used + self.limits["cpu_s"]) + 1
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        signal.setitimer(signal.ITIMER_REAL, timeout_s)

    def _execute(self, code: str) -> None:
        try:
            self._execute_cell(code)
        finally:
            # a child forked by user code must never come back into the worker loop: it would
            # answer on the shared control pipe
            if os.getpid() != self.pid:
                os._exit(0)

    def _execute_cell(self, code: str) -> None:
        self.cell += 1
        filename = f"<cell {self.cell}>"
        # register the source so tracebacks show the offending line
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        tree = ast.parse(code, filename, "exec")
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.Expr):
            # notebook behaviour: show the value of a trailing expression
            body = ast.Module(body=tree.body[:-1], type_ignores=[])
            exec(compile(body, filename, "exec"), self.namespace)
            value = eval(compile(ast.Expression(last.value), filename, "eval"), self.namespace)
            if value is not None:
                self.namespace["_"] = value
                print(repr(value))
        else:
            exec(compile(tree, filename, "exec"), self.namespace)

    def run(self, code: str, timeout_s: float) -> dict[str, Any]:
        """Run one cell; never raises."""
        _restore_signals()
        self._redirect()
        error, timed_out = None, False
        threads_before = threading.active_count()
        start = time.monotonic()
        try:
            self._arm_limits(timeout_s)
            self._execute(code)
        except CellTimeout as exc:
            timed_out = True
            error = f"TimeoutError: {exc} ({self.limits['cpu_s'] if 'CPU' in str(exc) else timeout_s} s)"
        except SystemExit as exc:
            error = f"SystemExit: {exc.code}"
        except SyntaxError as exc:
            error = _short_error(exc)
            traceback.print_exception(exc, limit=0, file=sys.stderr)
        except BaseException as exc:  # noqa: BLE001 - any user failure becomes an error result
            error = _short_error(exc)
            tb = exc.__traceback__
            while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
                tb = tb.tb_next  # hide the worker's own frames
            try:
                traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - stderr may be full or broken
                pass
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        duration = time.monotonic() - start
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - e.g. EFBIG after an output flood
                pass
        _kill_other_processes(self.limits.get("own_pid_namespace", False))
        cap = self.limits["output_bytes"]
        stdout, out_size = _read_capped(self.out_fd, cap)
        stderr, err_size = _read_capped(self.err_fd, cap)
        return {
            "stdout": stdout,
            "stderr": stderr,
            "error": error,
            "timed_out": timed_out,
            "duration_s": duration,
            "stdout_bytes": out_size,
            "stderr_bytes": err_size,
            "threads_left": max(0, threading.active_count() - threads_before),
        }


def _set_rlimits(limits: dict[str, Any]) -> None:
    def cap(res: int, value: int) -> None:
        resource.setrlimit(res, (value, value))

    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_FSIZE, limits["file_bytes"])
    cap(resource.RLIMIT_NOFILE, limits["open_files"])
    if limits.get("nproc_rlimit", True):
        # counted per uid (per user namespace): meaningful only when the sandbox has a uid of its own
        cap(resource.RLIMIT_NPROC, limits["processes"])
    cap(resource.RLIMIT_AS, limits["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"] + 1, limits["session_cpu_s"]))


def _die_with_parent() -> None:
    """Without a sandbox around us (unsandboxed mode) nothing else ties our life to the host's.

    The signal follows the host's forking *thread*: the host forks on its process-long spawner
    thread (``spawner.py``), so this fires when the host process dies, not a thread of it.
    """
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the host died before the prctl took effect
        os._exit(1)


def main() -> None:
    """Serve calls until the host closes the pipe."""
    limits = json.loads(sys.argv[1])
    if not limits.get("own_pid_namespace"):
        _die_with_parent()
    ctrl_in, ctrl_out = os.dup(0), os.dup(1)  # dup() makes them close-on-exec: children never see them
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    workdir = limits.get("workdir")
    if workdir:
        os.chdir(workdir)
    session = Session(limits)
    _restore_signals()
    _set_rlimits(limits)
    write_frame(ctrl_out, {"ready": True, "pid": os.getpid()})
    while True:
        request = read_frame(ctrl_in)
        if request is None:
            return
        result = session.run(str(request.get("code", "")), float(request.get("timeout_s", limits["wall_s"])))
        write_frame(ctrl_out, result)


if __name__ == "__main__":
    main()
