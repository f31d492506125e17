"""Start a process without holding the GIL.

``subprocess.Popen`` (CPython 3.11) keeps the GIL while it forks and until the child has exec'd;
with dozens of sandboxes starting on a busy 2-core machine that stalls every other thread, the
rollout's event loop included, for seconds. glibc's ``posix_spawn`` called through ctypes (which
releases the GIL) does the same job: stdio onto three fds, every other fd closed, a new session,
default signal dispositions and an empty signal mask. Where that is unavailable we fall back to
``subprocess.Popen``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import subprocess
import time

_POSIX_SPAWN_SETSIGDEF = 0x04
_POSIX_SPAWN_SETSIGMASK = 0x08
_POSIX_SPAWN_SETSID = 0x80  # glibc >= 2.26


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.posix_spawn_file_actions_addclosefrom_np  # noqa: B018 - glibc >= 2.34
        return libc
    except (OSError, AttributeError):
        return None


def _cstrings(items: list[str]) -> ctypes.Array:
    arr = (ctypes.c_char_p * (len(items) + 1))()
    arr[:-1] = [s.encode() for s in items]
    arr[-1] = None
    return arr


class Child:
    """A spawned process: ``pid``, ``poll()``, ``wait(timeout)`` like ``subprocess.Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -9  # reaped elsewhere; treat as killed
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for exit; raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        """SIGKILL the process (if still running)."""
        if self.poll() is None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass


def spawn(
    argv: list[str], env: dict[str, str], stdin: int, stdout: int, stderr: int, fd3: int | None = None
) -> Child | subprocess.Popen:
    """Start ``argv`` (absolute path first) with the given stdio fds, in a new session.

    ``fd3``, if given, is passed to the child as its fd 3; every other fd is closed.
    """
    libc = _libc()
    if libc is None:

        def move_fd3() -> None:
            if fd3 is not None:
                os.dup2(fd3, 3)

        return subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=env,
            close_fds=True,
            pass_fds=(3,) if fd3 is not None else (),
            start_new_session=True,
            preexec_fn=move_fd3 if fd3 is not None else None,
        )
    actions = ctypes.create_string_buffer(256)  # posix_spawn_file_actions_t is 80 bytes on glibc
    attr = ctypes.create_string_buffer(1024)  # posix_spawnattr_t is 336 bytes on glibc
    sigset = ctypes.create_string_buffer(256)  # sigset_t is 128 bytes
    libc.posix_spawn_file_actions_init(actions)
    libc.posix_spawnattr_init(attr)
    try:
        for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            libc.posix_spawn_file_actions_adddup2(actions, fd, target)
        if fd3 is not None:
            libc.posix_spawn_file_actions_adddup2(actions, fd3, 3)
        libc.posix_spawn_file_actions_addclosefrom_np(actions, 3 if fd3 is None else 4)
        libc.posix_spawnattr_setflags(
            attr, ctypes.c_short(_POSIX_SPAWN_SETSID | _POSIX_SPAWN_SETSIGDEF | _POSIX_SPAWN_SETSIGMASK)
        )
        libc.sigfillset(sigset)
        libc.posix_spawnattr_setsigdefault(attr, sigset)
        libc.sigemptyset(sigset)
        libc.posix_spawnattr_setsigmask(attr, sigset)
        pid = ctypes.c_int()
        envp = _cstrings([f"{k}={v}" for k, v in env.items()])
        err = libc.posix_spawn(ctypes.byref(pid), argv[0].encode(), actions, attr, _cstrings(argv), envp)
        if err:
            raise OSError(err, f"posix_spawn {argv[0]}: {os.strerror(err)}")
        return Child(pid.value)
    finally:
        libc.posix_spawn_file_actions_destroy(actions)
        libc.posix_spawnattr_destroy(attr)
