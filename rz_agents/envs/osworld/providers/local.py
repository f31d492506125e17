"""The ``local`` provider: one desktop per episode on this machine.

Per episode: an Xvfb display (``-noreset``, number picked by Xvfb itself via ``-displayfd``),
openbox as window manager, a fresh home directory mounted at ``/home/user`` inside a bubblewrap
sandbox (own PID namespace, so killing the sandbox kills every program the episode started),
and the in-VM HTTP server on a free loopback port. ``google-chrome`` and ``python`` resolve to
per-episode wrappers (Chromium with this episode's CDP port and profile; this Python).

Every process carries ``RZ_OSWORLD_EPISODE=<id>`` in its environment, so ``stop`` can find and
end any straggler even without a PID namespace (bubblewrap unavailable: the server then runs
unsandboxed with ``$HOME`` at the episode directory and maps ``/home/user`` paths itself).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

from rz_agents.envs.osworld.chrome import chromium_binary, write_chrome_wrapper

MARKER = "RZ_OSWORLD_EPISODE"
VM_HOME = "/home/user"
HOME_DIRS = ("Desktop", "Documents", "Downloads", "Pictures", "Music", "Videos", ".config")


class ProviderError(RuntimeError):
    """The desktop could not be started; the message says which part failed."""


def free_port() -> int:
    """A free TCP port on loopback (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bwrap_works() -> bool:
    """True when bubblewrap can create a mount + PID namespace here."""
    if not shutil.which("bwrap"):
        return False
    try:
        r = subprocess.run(
            ["bwrap", "--dev-bind", "/", "/", "--unshare-pid", "--proc", "/proc", "true"],
            capture_output=True,
            timeout=10,
        )
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def episode_pids(episode_id: str) -> list[int]:
    """PIDs of live processes whose environment carries this episode's marker."""
    needle = f"{MARKER}={episode_id}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue  # gone, or not ours to read
    return pids


def write_xauthority(path: str, display_number: str) -> None:
    """An ``.Xauthority`` entry for this display (python-xlib, hence pyautogui, warns on stdout without one).

    Xvfb runs without ``-auth`` so it accepts the cookie; the entry only keeps clients quiet.
    """

    def field(b: bytes) -> bytes:
        return struct.pack(">H", len(b)) + b

    family_local = 256
    entry = (
        struct.pack(">H", family_local)
        + field(socket.gethostname().encode())
        + field(str(display_number).encode())
        + field(b"MIT-MAGIC-COOKIE-1")
        + field(os.urandom(16))
    )
    with open(path, "wb") as f:
        f.write(entry)


def _write_sudo_shim(path: str) -> None:
    """A ``sudo`` that drops its options and runs the command (for a desktop already running as root)."""
    with open(path, "w") as f:
        f.write(
            "#!/bin/sh\n"
            "# rz_agents.envs.osworld: the episode runs as root; sudo only strips its options.\n"
            'while [ $# -gt 0 ]; do case "$1" in -u|-g) shift 2;; -*) shift;; *) break;; esac; done\n'
            '[ $# -gt 0 ] && exec "$@"\n'
        )
    os.chmod(path, 0o755)


@dataclass
class Desktop:
    """A running desktop: where to reach it and what to clean up."""

    episode_id: str
    server_url: str
    cdp_port: int
    display: str
    root_dir: str
    home_dir: str
    sandboxed: bool


class LocalProvider:
    """Starts and stops per-episode desktops on this machine."""

    def __init__(
        self,
        screen_size: tuple[int, int] = (1920, 1080),
        sandbox: str = "auto",
        window_manager: str = "openbox",
        start_timeout_s: float = 30.0,
    ) -> None:
        if sandbox not in ("auto", "bwrap", "none"):
            raise ValueError(f"sandbox must be 'auto', 'bwrap' or 'none', got {sandbox!r}")
        for tool in ("Xvfb",):
            if not shutil.which(tool):
                raise ProviderError(f"{tool} is not installed (apt-get install xvfb)")
        self.screen_size = screen_size
        self.window_manager = window_manager if shutil.which(window_manager) else None
        self.start_timeout_s = start_timeout_s
        if sandbox == "auto":
            self.sandboxed = bwrap_works()
        elif sandbox == "bwrap":
            if not bwrap_works():
                raise ProviderError(
                    "bubblewrap cannot create namespaces here (install bubblewrap, run as root)"
                )
            self.sandboxed = True
        else:
            self.sandboxed = False
        self._procs: list[subprocess.Popen] = []
        self.desktop: Desktop | None = None

    # -- start -------------------------------------------------------------------------------------
    def start(self) -> Desktop:
        """Start a fresh desktop (stopping any previous one) and return where to reach it."""
        self.stop()
        episode_id = uuid.uuid4().hex[:12]
        root = tempfile.mkdtemp(prefix=f"rz-osworld-{episode_id}-")
        try:
            return self._start(episode_id, root)
        except BaseException:
            self.stop()
            shutil.rmtree(root, ignore_errors=True)
            raise

    def _start(self, episode_id: str, root: str) -> Desktop:
        home = os.path.join(root, "home")
        bin_dir = os.path.join(root, "bin")
        for d in (home, bin_dir, *(os.path.join(home, h) for h in HOME_DIRS)):
            os.makedirs(d, exist_ok=True)
        inner_home = VM_HOME if self.sandboxed else home
        cdp_port = free_port()
        os.symlink(sys.executable, os.path.join(bin_dir, "python"))
        os.symlink(sys.executable, os.path.join(bin_dir, "python3"))
        if not shutil.which("sudo"):
            # Tasks run "echo password | sudo -S cmd"; the desktop user is already root here.
            _write_sudo_shim(os.path.join(bin_dir, "sudo"))
        chromium = chromium_binary()
        if chromium:
            write_chrome_wrapper(
                bin_dir, chromium, cdp_port, os.path.join(inner_home, ".config", "google-chrome")
            )

        base_env = {
            k: v for k, v in os.environ.items() if k not in ("DISPLAY", "XAUTHORITY", "WAYLAND_DISPLAY")
        }
        base_env[MARKER] = episode_id
        self.desktop = Desktop(episode_id, "", cdp_port, "", root, home, self.sandboxed)

        # Xvfb picks a free display number and writes it to the pipe we give it.
        read_fd, write_fd = os.pipe()
        w, h = self.screen_size
        xvfb = subprocess.Popen(
            [
                "Xvfb",
                "-displayfd",
                str(write_fd),
                "-screen",
                "0",
                f"{w}x{h}x24",
                "-noreset",
                "-nolisten",
                "tcp",
            ],
            env=base_env,
            pass_fds=(write_fd,),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._procs.append(xvfb)
        os.close(write_fd)
        try:
            number = self._read_line(read_fd, "Xvfb did not report its display number")
        finally:
            os.close(read_fd)
        display = f":{number}"
        self.desktop.display = display
        write_xauthority(os.path.join(home, ".Xauthority"), number)

        env = dict(base_env, DISPLAY=display, PATH=f"{bin_dir}:{base_env.get('PATH', '/usr/bin:/bin')}")
        env["HOME"] = inner_home
        env["RZ_OSWORLD_CDP_PORT"] = str(cdp_port)
        env["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
        env["USER"] = "user"
        if self.window_manager:
            wm_env = dict(env, HOME=home)
            self._procs.append(
                subprocess.Popen(
                    [self.window_manager],
                    env=wm_env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )

        server_cmd = [sys.executable, "-m", "rz_agents.envs.osworld.server"]
        if self.sandboxed:
            # /home becomes an empty tmpfs with the episode home at /home/user; PID namespace dies
            # with bwrap, taking every program the episode started with it.
            server_cmd = [
                "bwrap", "--dev-bind", "/", "/", "--tmpfs", "/home", "--bind", home, VM_HOME,
                "--unshare-pid", "--proc", "/proc", "--die-with-parent", "--chdir", VM_HOME,
                *server_cmd,
            ]  # fmt: skip
        pkg_root = os.path.dirname(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        )
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        server = subprocess.Popen(
            server_cmd,
            env=env,
            cwd=home,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._procs.append(server)
        try:
            line = self._read_line(server.stdout.fileno(), "the desktop server did not start")
        finally:
            server.stdout.close()  # the server sends its later output to /dev/null
        if not line.startswith("PORT "):
            raise ProviderError(f"the desktop server printed {line!r} instead of its port")
        self.desktop.server_url = f"http://127.0.0.1:{int(line.split()[1])}"
        return self.desktop

    def _read_line(self, fd: int, what: str) -> str:
        """Read one line from ``fd`` within the start timeout."""
        import select

        buf = b""
        deadline = time.monotonic() + self.start_timeout_s
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise ProviderError(f"{what} within {self.start_timeout_s:.0f}s")
            chunk = os.read(fd, 64)
            if not chunk:
                raise ProviderError(f"{what} (process exited)")
            buf += chunk
        return buf.decode().strip()

    # -- stop --------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop every process of the current desktop and delete its files; safe to call twice."""
        desktop, self.desktop = self.desktop, None
        procs, self._procs = self._procs, []
        # Ask politely first (Chromium flushes its profile, Xvfb removes its lock), then insist.
        for p in reversed(procs):
            self._signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + 3
        for p in reversed(procs):
            try:
                p.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal_group(p, signal.SIGKILL)
                try:
                    p.wait(2)
                except subprocess.TimeoutExpired:
                    pass
        if desktop is None:
            return
        for _ in range(20):  # stragglers that left the process groups (daemonised helpers)
            pids = episode_pids(desktop.episode_id)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)
        if desktop.display:
            n = desktop.display.lstrip(":")
            for stale in (f"/tmp/.X{n}-lock", f"/tmp/.X11-unix/X{n}"):
                try:
                    os.unlink(stale)
                except OSError:
                    pass
        shutil.rmtree(desktop.root_dir, ignore_errors=True)

    @staticmethod
    def _signal_group(p: subprocess.Popen, sig: int) -> None:
        if p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
        except OSError:
            try:
                p.send_signal(sig)
            except OSError:
                pass

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:
            pass
