"""The ``local`` backend: one bubblewrap sandbox per session, talking over pipes.

Isolation (bubblewrap 0.8 namespaces + rlimits set by the worker itself):
- private network (loopback only), pid, ipc, uts and cgroup namespaces;
- a fresh root with read-only, nosuid binds of the system directories (/usr, /lib*, /bin, /sbin,
  /etc) and of the Python installation; no /home, /root, /work, /var, /run or host /tmp;
- a private size-limited tmpfs as /tmp (the only writable place), a tiny one as /dev/shm, and a
  read-only minimal /dev;
- ``--clearenv`` and an empty process environment: nothing of the parent's environment leaks.

Who the code runs as:
- host running as root: bubblewrap runs privileged and the worker is started through
  ``setpriv`` as a fresh random uid with no capabilities and ``no_new_privs``. A uid of its own
  per sandbox means file permissions hold, other sandboxes cannot be signalled, and
  RLIMIT_NPROC (never enforced for root, counted per uid) bounds each sandbox's fork bomb alone;
  a seccomp filter refuses nested user namespaces (privileged bwrap cannot ``--disable-userns``);
- host running as a normal user: an unprivileged user namespace (``--unshare-user``, nested
  user namespaces disabled); RLIMIT_NPROC is then counted per user namespace, i.e. per sandbox.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rz_agents.envs.python_tool.limits import MiB, SandboxLimits
from rz_agents.envs.python_tool.seccomp import user_namespace_filter
from rz_agents.envs.python_tool.spawn import spawn
from rz_agents.envs.python_tool.spawner import on_spawner
from rz_agents.envs.python_tool.transport import DeadlineExceeded, Transport, WorkerGone
from rz_agents.envs.python_tool.usage import tree_usage

WORKER_PATH = Path(__file__).with_name("worker.py")
SANDBOX_WORKER = "/rz/worker.py"
CHECK_EVERY_S = 0.1  # how often a running call's total memory is checked
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "MPLCONFIGDIR": "/tmp",
}


class SandboxUnavailable(RuntimeError):
    """No sandbox can be built here (e.g. bubblewrap missing) and running unsandboxed was not allowed."""


@dataclass
class LaunchSpec:
    """A ready-to-run worker command, and the temp dir it owns (unsandboxed mode only)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    fd3_data: bytes | None = None  # written to a pipe the child reads as fd 3 (the seccomp filter)
    sandboxed: bool = True
    temp_dir: str | None = None


@functools.lru_cache(maxsize=1)
def python_dirs() -> list[str]:
    """The directories holding the interpreter and its packages (deduplicated, outermost first)."""
    dirs = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix)}
    out: list[str] = []
    for d in sorted(dirs, key=len):
        if not any(d == o or d.startswith(o + os.sep) for o in out):
            out.append(d)
    return out


def _visible_to_system_binds(path: str) -> bool:
    return any(path == d or path.startswith(d + os.sep) for d in SYSTEM_DIRS if os.path.isdir(d))


@functools.lru_cache(maxsize=1)
def _system_binds() -> list[str]:
    # computed once: each filesystem check releases and retakes the GIL, which adds up when dozens
    # of threads start sandboxes at once
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    return args


def namespace_args(privileged: bool) -> list[str]:
    """bubblewrap's isolation arguments: the namespaces, a new session, an empty environment."""
    if privileged:
        # no user namespace: privileged bwrap keeps real uids so setpriv can switch to the sandbox's uid
        ns = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    else:
        ns = ["--unshare-all", "--unshare-user", "--disable-userns"]
    return [*ns, "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox"]


def drop_privileges_args(setpriv: str, uid: int | None) -> list[str]:
    """What runs the sandboxed command as ``uid`` with no capabilities and ``no_new_privs`` (host root)."""
    argv = ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP", "--"]
    argv += [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all"]
    return argv + ["--bounding-set=-all", "--no-new-privs"]


def system_binds() -> list[str]:
    """bubblewrap arguments binding the system directories read-only (shared by the shell sandbox)."""
    return list(_system_binds())


@functools.lru_cache(maxsize=1)
def _executables() -> tuple[str, str | None]:
    return shutil.which("bwrap") or "bwrap", shutil.which("setpriv")


@functools.lru_cache(maxsize=1)
def _extra_python_dirs() -> list[str]:
    return [d for d in python_dirs() if not _visible_to_system_binds(d)]


def sandbox_uid() -> int:
    """A random uid for one sandbox (used when the host is root); collisions are negligible."""
    return 2_000_000 + secrets.randbelow(2_000_000_000)


def bwrap_command(
    limits: SandboxLimits,
    *,
    bwrap: str = "bwrap",
    setpriv: str | None = None,
    uid: int | None = None,
    python: str = sys.executable,
    extra_ro_dirs: list[str] | None = None,
    seccomp_fd: int | None = None,
) -> list[str]:
    """The full argv that starts a worker inside bubblewrap.

    With ``setpriv`` and ``uid`` (host is root) bubblewrap runs privileged and the worker drops
    to ``uid``; without them bubblewrap uses an unprivileged user namespace. ``extra_ro_dirs``
    are bound read-only at the same path (the Python installation when outside /usr).
    ``seccomp_fd``: the fd number (in bwrap) of a compiled seccomp filter to apply.
    """
    argv = [bwrap, *namespace_args(privileged=bool(setpriv))]
    argv += _system_binds()
    for d in extra_ro_dirs or []:
        # parents bwrap creates would be 0700 root-owned: make them traversable first
        argv += ["--perms", "0755", "--dir", os.path.dirname(d), "--ro-bind", d, d]
    argv += ["--perms", "0755", "--dir", os.path.dirname(SANDBOX_WORKER)]
    argv += ["--ro-bind", str(WORKER_PATH), SANDBOX_WORKER]
    argv += ["--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "1777", "--size", str(1 * MiB), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    for key, value in SANDBOX_ENV.items():
        argv += ["--setenv", key, value]
    argv += ["--chdir", "/tmp"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if setpriv:
        argv += drop_privileges_args(setpriv, uid)
    argv += ["--", python, "-I", "-B", SANDBOX_WORKER]
    argv.append(json.dumps(limits.for_worker(own_pid_namespace=True, workdir="/tmp")))
    return argv


@functools.lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot sandbox here (None when it works); probed once per process."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed; install it with `apt-get install bubblewrap`"
    unshare = ["--unshare-pid", "--unshare-net"] if os.geteuid() == 0 else ["--unshare-all", "--unshare-user"]
    argv = [bwrap, *unshare, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=30, env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap failed to start: {exc}"
    if proc.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {proc.stderr.decode(errors='replace').strip()}"
    return None


def local_launch(limits: SandboxLimits, allow_unsandboxed: bool = False) -> LaunchSpec:
    """How to start one worker: inside bubblewrap, or (only if allowed) as a plain process.

    Raises :class:`SandboxUnavailable` naming the reason when bubblewrap cannot be used and
    ``allow_unsandboxed`` is False.
    """
    problem = bwrap_problem()
    if problem is None:
        root = os.geteuid() == 0
        bwrap, setpriv = _executables()
        if root and setpriv is None:
            raise SandboxUnavailable("running as root needs `setpriv` (util-linux) to drop privileges")
        # privileged bwrap cannot --disable-userns: a seccomp filter forbids user namespaces instead
        seccomp = user_namespace_filter() if root else None
        argv = bwrap_command(
            limits,
            bwrap=bwrap,
            setpriv=setpriv if root else None,
            uid=sandbox_uid() if root else None,
            extra_ro_dirs=_extra_python_dirs(),
            seccomp_fd=3 if seccomp else None,
        )
        return LaunchSpec(argv=argv, fd3_data=seccomp)
    if not allow_unsandboxed:
        raise SandboxUnavailable(
            f"{problem}. Refusing to run code unsandboxed; pass allow_unsandboxed=True to run it "
            "as a plain subprocess with rlimits only (no filesystem, network or process isolation)."
        )
    # Explicitly allowed fallback: rlimits, an empty environment and a private working directory only.
    temp_dir = tempfile.mkdtemp(prefix="rz-sandbox-")
    env = {**SANDBOX_ENV, "HOME": temp_dir, "TMPDIR": temp_dir, "MPLCONFIGDIR": temp_dir}
    argv = [sys.executable, "-I", "-B", str(WORKER_PATH)]
    # no uid of its own: RLIMIT_NPROC would count every process of the host user
    argv.append(json.dumps(limits.for_worker(own_pid_namespace=False, workdir=temp_dir, nproc_rlimit=False)))
    return LaunchSpec(argv=argv, env=env, sandboxed=False, temp_dir=temp_dir)


class LocalWorker(Transport):
    """One started worker process and its pipes (the transport of the local backend)."""

    def __init__(self, spec: LaunchSpec, session_memory_bytes: int | None = None) -> None:
        self.spec = spec
        self.session_memory_bytes = session_memory_bytes
        # stderr is only written before the worker redirects it (startup errors, bwrap errors)
        in_read, in_write = os.pipe()
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        os.set_blocking(err_read, False)
        child_ends = [in_read, out_write, err_write]
        fd3 = None
        if spec.fd3_data is not None:
            fd3, fd3_write = os.pipe()
            os.write(fd3_write, spec.fd3_data)  # a few hundred bytes: fits the pipe buffer
            os.close(fd3_write)
            child_ends.append(fd3)
        try:
            # on the process's spawner thread: --die-with-parent (and the unsandboxed worker's
            # PR_SET_PDEATHSIG) follow the forking thread, which must live as long as the process
            self.proc = on_spawner(spawn, spec.argv, spec.env, in_read, out_write, err_write, fd3=fd3)
        except BaseException:
            for fd in (in_write, out_read, err_read):
                os.close(fd)
            raise
        finally:
            for fd in child_ends:
                os.close(fd)
        self._in, self._out, self._err = in_write, out_read, err_read
        self.sandboxed = spec.sandboxed
        self._closed_fds = False

    def send(self, data: bytes) -> None:
        """Write all of ``data`` to the worker."""
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._in, view) :]
        except (BrokenPipeError, OSError) as exc:
            raise WorkerGone(str(exc)) from exc

    def recv(self, n: int, deadline: float, watch: bool = True) -> bytes:
        """Read exactly ``n`` bytes before ``deadline`` (time.monotonic).

        While waiting, every ``CHECK_EVERY_S`` the session's total memory is checked (the per-process
        RLIMIT_AS does not bound the sum over many processes).
        """
        chunks, got = [], 0
        poller = select.poll()
        poller.register(self._out, select.POLLIN | select.POLLHUP | select.POLLERR)
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded()
            if not poller.poll(max(1, int((min(left, CHECK_EVERY_S) if watch else left) * 1000))):
                if watch:
                    self._check_memory()
                continue
            chunk = os.read(self._out, min(n - got, 1 << 20))
            if not chunk:
                raise WorkerGone("end of file")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _check_memory(self) -> None:
        if self.session_memory_bytes is None:
            return
        _, rss = tree_usage(self.proc.pid)
        if rss > self.session_memory_bytes:
            raise WorkerGone(
                f"its processes used {rss >> 20} MiB in total, over the session limit of "
                f"{self.session_memory_bytes >> 20} MiB, so it was killed"
            )

    def has_exited(self) -> bool:
        """Whether the worker process (bubblewrap, or the unsandboxed worker) has ended."""
        return self.proc.poll() is not None

    def exit_description(self) -> str:
        """How the worker ended, for error messages (e.g. 'killed by SIGKILL')."""
        try:
            code = self.proc.wait(timeout=1.0)  # its pipe closed: the exit is imminent
        except subprocess.TimeoutExpired:
            return "its pipe closed but the process is still running"
        # bubblewrap reports a child killed by signal N as exit status 128 + N
        sig = -code if code < 0 else code - 128 if code > 128 else None
        if sig:
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            hint = {"SIGKILL": " (memory, CPU or process limit, or killed)", "SIGXCPU": " (CPU time limit)"}
            return f"killed by {name}{hint.get(name, '')}"
        return f"exit status {code}"

    def stderr_tail(self, limit: int = 2000) -> str:
        """The last bytes the worker (or bubblewrap) wrote before redirecting its stderr."""
        chunks = []
        try:
            while chunk := os.read(self._err, 65536):
                chunks.append(chunk)
        except (BlockingIOError, OSError):
            pass
        return b"".join(chunks)[-limit:].decode(errors="replace").strip()

    def kill(self) -> None:
        """Kill the worker and everything it started, and wait for it."""
        if not self._closed_fds:
            self._closed_fds = True
            for fd in (self._in, self._out, self._err):
                try:
                    os.close(fd)
                except OSError:
                    pass
        if self.proc.poll() is None:
            try:
                # the process group holds setpriv/bwrap; the pid namespace takes every sandboxed
                # process down with bwrap
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if self.spec.temp_dir:
            shutil.rmtree(self.spec.temp_dir, ignore_errors=True)
