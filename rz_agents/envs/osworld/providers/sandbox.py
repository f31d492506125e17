"""The desktop's bubblewrap sandbox: what an episode's programs see, and who they run as.

What the desktop sees (everything else of the host is absent):

- the system read-only: ``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/etc`` (with the episode's own
  ``passwd``, ``group`` and ``hosts``), a few read-only caches under ``/var``, the Python
  installation, and the ``rz_agents`` package at ``/opt/rz/rz_agents``;
- its own writable home at ``/home/user`` (OSWorld's VM user) and its own ``/tmp`` (both folders of
  the episode on the host's disk, deleted with it), a private ``/dev/shm``, ``/run`` and ``/var``;
  ``/run/user/1000`` (the VM user's runtime folder: its session bus) links into that ``/tmp``;
- nothing of ``/root`` (beyond the Python installation when it lives there), ``/work``, the
  host's ``/home``, ``/tmp``, ``/run`` (no host D-Bus or X server) or ``/var``;
- its own network namespace: loopback only. The host reaches the desktop through listening Unix
  sockets it creates in a folder the desktop cannot see and hands over as open file descriptors
  (``relay.py``), never by the network (and the desktop cannot swap those sockets for links);
- its own PID, IPC and UTS namespaces: it sees and can signal only its own processes, and every
  one dies with the sandbox;
- an empty environment apart from what the provider sets.

Who runs: when the host is root, a fresh random uid with no capabilities, ``no_new_privs``, and a
seccomp filter refusing nested user namespaces (privileged bubblewrap cannot ``--disable-userns``);
otherwise an unprivileged user namespace with nested ones disabled.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import sys
from dataclasses import dataclass

VM_HOME = "/home/user"
PACKAGE_DIR = "/opt/rz"
BIN_DIR = "/opt/rz/bin"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
VAR_READ_ONLY = ("/var/cache/fontconfig", "/var/lib/dbus", "/var/lib/libreoffice")
UNPRIVILEGED_UID = 1000
RUNTIME_DIR = "/run/user/1000"  # XDG_RUNTIME_DIR of OSWorld's VM user
RUNTIME_TARGET = "/tmp/.xdg-runtime"


@dataclass
class SandboxLayout:
    """Host folders of one episode and what they become inside the sandbox."""

    home: str  # -> /home/user (rw)
    tmp: str  # -> /tmp (rw)
    bin: str  # -> /opt/rz/bin (ro: python, sudo and google-chrome wrappers)
    etc: str  # passwd, group, hosts bound over /etc's (ro)


@functools.lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot build the desktop's sandbox here (None when it can); probed once.

    The probe is the Python tool's (the same namespaces); a root host also needs ``setpriv``.
    """
    from rz_agents.envs.python_tool.local import bwrap_problem as probe

    problem = probe()
    if problem is None and os.geteuid() == 0 and not shutil.which("setpriv"):
        return "running as root needs setpriv (util-linux) to drop to the desktop's own uid"
    return problem


def desktop_uid() -> int:
    """The uid a root host runs one desktop under: random, so desktops cannot touch each other."""
    return 2_000_000 + secrets.randbelow(2_000_000_000)


def python_dirs() -> list[str]:
    """The folders holding this interpreter and its packages (outermost first, deduplicated)."""
    out: list[str] = []
    for d in sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix)}, key=len):
        if not any(d == o or d.startswith(o + os.sep) for o in out):
            out.append(d)
    return out


def _under_system(path: str) -> bool:
    return any(path == d or path.startswith(d + os.sep) for d in SYSTEM_DIRS)


def _traversable(path: str) -> list[str]:
    """Create ``path``'s missing ancestors as 0755 (bwrap would make them 0700 root-owned)."""
    args: list[str] = []
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        args += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
    return args


def write_identity(etc_dir: str, uid: int) -> None:
    """``passwd``/``group`` naming the desktop user ``user`` (home /home/user) and a ``hosts`` file."""
    os.makedirs(etc_dir, exist_ok=True)
    files = {
        "passwd": f"root:x:0:0:root:/root:/bin/sh\nuser:x:{uid}:{uid}:user:{VM_HOME}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nuser:x:{uid}:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1\tlocalhost desktop\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    }
    for name, text in files.items():
        with open(os.path.join(etc_dir, name), "w") as f:
            f.write(text)


def bwrap_command(
    layout: SandboxLayout,
    command: list[str],
    env: dict[str, str],
    uid: int | None,
    package_dir: str,
    extra_ro_dirs: list[str] = (),
    seccomp_fd: int | None = None,
) -> list[str]:
    """The argv running ``command`` in the desktop sandbox.

    ``uid``: run as this uid through setpriv (host is root), or None for an unprivileged user
    namespace. ``package_dir``: the host folder of the ``rz_agents`` package. ``extra_ro_dirs``:
    more host folders visible read-only at the same path (e.g. a browser outside ``/usr``).
    """
    argv = [shutil.which("bwrap") or "bwrap"]
    if uid is not None:
        argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    else:
        argv += ["--unshare-all", "--unshare-user", "--disable-userns"]
        argv += ["--uid", str(UNPRIVILEGED_UID), "--gid", str(UNPRIVILEGED_UID)]
    argv += ["--die-with-parent", "--new-session", "--clearenv", "--hostname", "desktop"]
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    for name in ("passwd", "group", "hosts"):
        argv += ["--ro-bind", os.path.join(layout.etc, name), f"/etc/{name}"]
    for d in [*python_dirs(), *extra_ro_dirs]:
        if not _under_system(d):
            argv += [*_traversable(d), "--ro-bind", d, d]
    argv += [*_traversable(BIN_DIR), "--ro-bind", package_dir, f"{PACKAGE_DIR}/rz_agents"]
    argv += ["--ro-bind", layout.bin, BIN_DIR]
    argv += ["--perms", "0755", "--tmpfs", "/home", "--bind", layout.home, VM_HOME]
    argv += ["--bind", layout.tmp, "/tmp"]
    argv += ["--perms", "0755", "--tmpfs", "/run"]
    # OSWorld's VM user has XDG_RUNTIME_DIR /run/user/1000 (tasks name its bus): a link to a folder
    # of the desktop's own /tmp, which the session makes (so it is the desktop user's, mode 0700).
    argv += ["--perms", "0755", "--dir", "/run/user", "--symlink", RUNTIME_TARGET, RUNTIME_DIR]
    argv += ["--perms", "0755", "--tmpfs", "/var", "--symlink", "/tmp", "/var/tmp"]
    for d in VAR_READ_ONLY:
        if os.path.isdir(d):
            argv += [*_traversable(d), "--ro-bind", d, d]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += ["--chdir", VM_HOME]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if uid is not None:
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP", "--"]
        argv += [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        argv += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
    return [*argv, "--", *command]
