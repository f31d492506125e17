"""``ShellSandbox``: shell commands in one episode's bubblewrap sandbox, its files kept between commands.

Each command is a fresh ``bash -c`` in its own bubblewrap instance over the episode's workspace, so
nothing the command starts outlives it: bubblewrap's pid namespace takes every process down when the
command returns or is killed, and a closed sandbox leaves no process behind by construction. What
persists between commands is the filesystem the task gives the agent (its workspace, e.g. ``/app``),
as in a terminal where every command is run to completion.

Isolation is the Python tool's (``envs/python_tool/local.py``): no network, private pid / ipc / uts
namespaces, read-only system directories and interpreter, a size-capped private ``/tmp``, an empty
environment, and (host running as root) a random uid of its own with no capabilities, ``no_new_privs`` and
the seccomp filter that refuses user namespaces. Limits per command: wall time (the process group is
killed), processes, file size, address space, open files; output beyond ``output_bytes`` keeps its head
and tail.
"""

from __future__ import annotations

import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rz_agents.envs.python_tool.local import (
    bwrap_problem,
    drop_privileges_args,
    namespace_args,
    python_dirs,
    system_binds,
)
from rz_agents.envs.python_tool.seccomp import user_namespace_filter

MiB = 1 << 20


@dataclass(frozen=True)
class ShellLimits:
    """What one command may use."""

    wall_s: float = 30.0
    processes: int = 128
    file_bytes: int = 64 * MiB
    memory_bytes: int = 2 << 30  # address space per process
    open_files: int = 512
    tmp_bytes: int = 256 * MiB
    output_bytes: int = 16 * 1024

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"ShellLimits.{name} must be a positive number, got {value!r}")


@dataclass
class ShellResult:
    """The outcome of one command."""

    exit_code: int | None  # None when the command was killed at its wall time
    output: str  # stdout and stderr interleaved, as a terminal shows them (head and tail past the cap)
    timed_out: bool = False
    duration_s: float = 0.0
    output_cut: int = 0  # bytes left out of ``output``


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot run here."""


def _sandbox_path() -> str:
    # the project's interpreter first (python3, pip, pytest as installed here), then the system's
    return ":".join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])


@dataclass
class ShellSandbox:
    """One episode's shell: ``workspace`` (a host directory) is the task's writable ``root`` inside.

    ``binds``: extra ``(host_path, sandbox_path, writable)`` mounts (the verifier's ``/tests`` and
    ``/logs/verifier``, an oracle's ``/solution``). ``env``: variables the task's Dockerfile set.
    """

    workspace: Path
    root: str = "/app"
    workdir: str = "/app"
    env: dict[str, str] = field(default_factory=dict)
    limits: ShellLimits = field(default_factory=ShellLimits)
    binds: list[tuple[Path, str, bool]] = field(default_factory=list)
    uid: int | None = None

    def __post_init__(self) -> None:
        problem = bwrap_problem()
        if problem is not None:
            raise SandboxUnavailable(problem)
        self.workspace = Path(self.workspace)
        self._root_host = os.geteuid() == 0
        if self._root_host and self.uid is None:
            self.uid = 2_000_000 + secrets.randbelow(2_000_000_000)
        if self._root_host:
            give_to(self.workspace, self.uid)

    def argv(self, command: str) -> list[str]:
        """The bubblewrap command line that runs ``command`` with bash in this sandbox."""
        argv = ["bwrap", *namespace_args(privileged=self._root_host)]
        argv += system_binds()
        for d in python_dirs():
            if not d.startswith(("/usr/", "/bin", "/lib")):
                argv += ["--perms", "0755", "--dir", os.path.dirname(d), "--ro-bind", d, d]
        argv += ["--perms", "1777", "--size", str(self.limits.tmp_bytes), "--tmpfs", "/tmp"]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--perms", "1777", "--size", str(MiB), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
        argv += ["--perms", "0755", "--dir", os.path.dirname(self.root) or "/"]
        argv += ["--bind", str(self.workspace), self.root]
        for host, inside, writable in self.binds:
            argv += ["--perms", "0755", "--dir", os.path.dirname(inside)]
            argv += ["--bind" if writable else "--ro-bind", str(host), inside]
        env = {"PATH": _sandbox_path(), "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb"}
        for key, value in {**env, **self.env}.items():
            argv += ["--setenv", key, value]
        argv += ["--chdir", self.workdir]
        if self._root_host:
            argv += drop_privileges_args("setpriv", self.uid)
        lim = self.limits
        argv += ["--", "prlimit", f"--nproc={lim.processes}", f"--fsize={lim.file_bytes}"]
        argv += [f"--as={lim.memory_bytes}", f"--nofile={lim.open_files}", "--core=0"]
        argv += ["--", "bash", "-c", command]
        return argv

    def run(self, command: str, wall_s: float | None = None) -> ShellResult:
        """Run ``command`` to completion (or its wall time); never raises for what the command does."""
        wall = float(wall_s if wall_s is not None else self.limits.wall_s)
        argv = self.argv(command)
        seccomp_r = None
        if self._root_host:
            data = user_namespace_filter()
            if data is not None:
                seccomp_r, w = os.pipe()
                os.write(w, data)
                os.close(w)
                argv.insert(1, str(seccomp_r))
                argv.insert(1, "--seccomp")
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(seccomp_r,) if seccomp_r is not None else (),
                env={},
            )
        finally:
            if seccomp_r is not None:
                os.close(seccomp_r)
        output, cut, timed_out = _collect(proc, start + wall, self.limits.output_bytes)
        code = None if timed_out else proc.returncode
        if self._root_host and self.uid is not None:
            _reap(self.uid)
        return ShellResult(code, output, timed_out, time.monotonic() - start, cut)


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[str, int, bool]:
    """Read the command's output until it exits or ``deadline``; keep the head and tail within ``cap``."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    head, tail, total, timed_out = bytearray(), bytearray(), 0, False
    half = cap // 2
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if not ready:
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        total += len(chunk)
        if len(head) < half:
            take = half - len(head)
            head += chunk[:take]
            chunk = chunk[take:]
        tail += chunk
        if len(tail) > half:
            del tail[: len(tail) - half]
    if timed_out or proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap's pid namespace takes the rest with it
        except ProcessLookupError:
            pass
    proc.wait()
    proc.stdout.close()
    cut = total - len(head) - len(tail)
    text = head.decode(errors="replace")
    if cut > 0:
        text += f"\n... [{cut} bytes of output cut] ...\n"
    text += tail.decode(errors="replace")
    return text, max(cut, 0), timed_out


def _pids_of(uid: int) -> list[int]:
    """The host pids whose real uid is ``uid`` (the sandbox's own uid: nothing else runs as it)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(entry))
                        break
        except (OSError, ValueError):
            continue  # exited while we looked
    return pids


def _reap(uid: int, timeout_s: float = 5.0) -> None:
    """Return only when no process of the sandbox's uid is left.

    The kernel tears a pid namespace down after its init exits, but not synchronously: under load a
    fork bomb's children can still be listed for a moment after ``proc.wait()``. Killing what remains
    and waiting for it makes "nothing outlives its command" hold when ``run`` returns, not shortly after.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        pids = _pids_of(uid)
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)


def give_to(path: Path, uid: int | None) -> None:
    """Hand ``path`` (recursively) to the sandbox user, so its commands can write there."""
    if uid is None:
        return
    os.chown(path, uid, uid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            os.lchown(p, uid, uid)


def remove_tree(path: Path) -> None:
    """Delete a workspace (files of the sandbox user included)."""
    shutil.rmtree(path, ignore_errors=True)
