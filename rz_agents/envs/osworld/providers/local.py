"""The ``local`` provider: one desktop per episode on this machine.

Per episode, a session (``session.py``: Xvfb, openbox, the in-VM server) inside a bubblewrap
sandbox (``sandbox.py``: read-only system, its own home at ``/home/user`` and ``/tmp``, loopback-only
network, own PID namespace, a uid of its own, no host secrets). The host reaches the desktop's
server and Chromium's DevTools port through Unix sockets, relayed to loopback ports here
(``relay.py``). ``google-chrome``, ``python`` and ``sudo`` resolve to per-episode wrappers.

Without bubblewrap namespaces (``sandbox="none"``) the session runs as a plain process: same
programs, but no containment at all; ``$HOME`` is the episode folder and the server maps
``/home/user`` paths itself. Every process carries ``RZ_OSWORLD_EPISODE=<id>`` in its environment,
so ``stop`` can find and end stragglers in either mode.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import rz_agents
from rz_agents.envs.osworld.chrome import chromium_binary, write_chrome_wrapper
from rz_agents.envs.osworld.providers import sandbox, warm
from rz_agents.envs.osworld.providers.home_defaults import write_home_defaults
from rz_agents.envs.osworld.providers.wrappers import (
    write_apt_wrappers,
    write_pip_wrappers,
    write_sudo_shim,
    write_vlc_wrapper,
)
from rz_agents.envs.osworld.relay import Relay, connect_unix, tcp_listener, unix_listener
from rz_agents.envs.osworld.session import SessionError, atspi_problem, read_line
from rz_agents.envs.osworld.vscode import write_code_wrapper
from rz_agents.envs.python_tool.spawner import on_spawner

MARKER = "RZ_OSWORLD_EPISODE"
VM_HOME = sandbox.VM_HOME
PROFILE_REL = os.path.join(".config", "google-chrome")  # the episode's Chrome profile, in its home
# what a kept browser holds open in the home: its profile and its HTTP cache (XDG cache folder)
BROWSER_PATHS = (PROFILE_REL, os.path.join(".cache", "google-chrome"))
# what Chromium starts beside its own process tree: its crash handler (double-forked away), the
# settings and GVfs daemons it activates over D-Bus (a fresh Chromium starts them as well)
BROWSER_HELPERS = ("chrome_crashpad", "dconf-service", "gvfsd")
HOME_DIRS = ("Desktop", "Documents", "Downloads", "Pictures", "Music", "Videos", ".config")
MAX_PROCESSES = 4096  # threads count too: Chromium + LibreOffice use a few hundred
# The folder holding the ``rz_agents`` package (the session imports it from there).
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(rz_agents.__file__)))


class ProviderError(RuntimeError):
    """The desktop could not be started; the message says which part failed."""


def free_port() -> int:
    """A free TCP port on loopback (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sandbox_problem() -> str | None:
    """Why the desktop cannot be sandboxed here, or None when it can."""
    return sandbox.bwrap_problem()


def episode_pids(episode_id: str) -> list[int]:
    """PIDs of live processes whose environment carries this episode's marker.

    Chromium rewrites its environment block (its process titles), so its processes do not show
    here: :meth:`LocalProvider.pids` adds the desktop's uid and process tree.
    """
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


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, real uid) of every live (non-zombie) process."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            table[int(entry)] = (int(fields[1]), os.stat(f"/proc/{entry}").st_uid)
        except (OSError, IndexError, ValueError):
            continue
    return table


def process_tree(roots: list[int], uid: int | None = None) -> list[int]:
    """Live descendants of ``roots`` (roots included), plus every process of ``uid`` when given."""
    table = _proc_table()
    out = {p for p in roots if p in table}
    if uid is not None:
        out |= {p for p, (_, u) in table.items() if u == uid}
    frontier = set(out)
    while frontier:
        frontier = {p for p, (pp, _) in table.items() if pp in frontier} - out
        out |= frontier
    return sorted(out)


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
    relays: list[Relay] = field(default_factory=list)
    uid: int | None = None  # the desktop's own uid (sandboxed on a root host)


# The host's display and session: an unsandboxed desktop inherits the rest of the environment.
HOST_SESSION_ENV = ("DISPLAY", "XAUTHORITY", "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")


class LocalProvider:
    """Starts and stops per-episode desktops on this machine."""

    def __init__(
        self,
        screen_size: tuple[int, int] = (1920, 1080),
        sandbox: str = "auto",
        window_manager: str = "openbox",
        start_timeout_s: float = 30.0,
        accessibility: str = "auto",
        warm_reset: bool = False,
        keep_browser: bool = False,
    ) -> None:
        # keep_browser: a reset in place may spare the episode's Chromium (``chrome_keep.py``);
        # it implies warm_reset, and Chromium starts with --keep-alive-for-test (no window needed)
        self.keep_browser = keep_browser
        self.warm_reset = warm_reset or keep_browser
        self.browser_keeps = 0  # resets in place that kept Chromium running
        self.browser_keep_failures: list[str] = []  # why a kept browser was replaced by a fresh one
        self.last_reset_kept_browser = False
        self.warm_resets = 0  # starts answered by resetting the running desktop in place
        self.warm_reset_failures: list[str] = []  # why a reset in place was refused (fresh start instead)
        self._baseline: warm.Baseline | None = None
        if sandbox not in ("auto", "bwrap", "none"):
            raise ValueError(f"sandbox must be 'auto', 'bwrap' or 'none', got {sandbox!r}")
        if accessibility not in ("auto", "atspi", "fallback"):
            raise ValueError(f"accessibility must be 'auto', 'atspi' or 'fallback', got {accessibility!r}")
        a11y_problem = atspi_problem() if accessibility != "fallback" else "switched off"
        if accessibility == "atspi" and a11y_problem:
            raise ProviderError(f"no AT-SPI accessibility tree: {a11y_problem}")
        self.atspi = a11y_problem is None
        if not shutil.which("Xvfb"):
            raise ProviderError("Xvfb is not installed (apt-get install xvfb)")
        self.screen_size = screen_size
        self.window_manager = window_manager
        self.start_timeout_s = start_timeout_s
        problem = sandbox_problem() if sandbox != "none" else None
        if sandbox == "bwrap" and problem:
            raise ProviderError(f"cannot sandbox the desktop: {problem}")
        if sandbox == "auto" and problem:
            warnings.warn(
                f"OSWorld desktops run UNSANDBOXED (full access to this machine): {problem}", stacklevel=2
            )
        self.sandboxed = sandbox != "none" and not problem
        self._procs: list[subprocess.Popen] = []
        self.desktop: Desktop | None = None

    # -- start -------------------------------------------------------------------------------------
    def start(self, browser_cleaner: Callable[[], str | None] | None = None) -> Desktop:
        """Start a fresh desktop (stopping any previous one) and return where to reach it.

        With ``warm_reset`` a running sandboxed desktop is reset in place instead (``warm.py``),
        when its clean state verifies; otherwise it is replaced by a fresh one. With
        ``keep_browser`` and a ``browser_cleaner`` (returns None when it made the running Chromium
        clean, else why not) the reset spares the episode's Chromium and its profile folder and
        calls the cleaner after the rest is reset; ``last_reset_kept_browser`` says if it did.
        """
        self.last_reset_kept_browser = False
        if self.warm_reset and self.desktop is not None and self._baseline is not None:
            try:
                problem = self._reset_in_place(browser_cleaner if self.keep_browser else None)
            except Exception as exc:  # noqa: BLE001 - any failure means a fresh desktop
                problem = f"{type(exc).__name__}: {exc}"
            if problem is None:
                self.warm_resets += 1
                return self.desktop
            self.warm_reset_failures.append(problem)
        self.stop()
        episode_id = uuid.uuid4().hex[:12]
        root = tempfile.mkdtemp(prefix=f"rz-osworld-{episode_id}-")
        self.desktop = Desktop(
            episode_id, "", free_port(), "", root, os.path.join(root, "home"), self.sandboxed
        )
        try:
            desktop = self._start(self.desktop)
            if self.warm_reset and desktop.sandboxed:
                self._baseline = self._take_baseline(desktop)
            return desktop
        except BaseException:
            self.stop()
            raise

    def _take_baseline(self, desktop: Desktop) -> warm.Baseline:
        """The desktop's state once every helper is up (the AT-SPI dump starts the last ones)."""
        from rz_agents.envs.osworld.client import VMClient

        client = VMClient(desktop.server_url)
        client.wait_ready()
        if self.atspi:
            client.accessibility_tree()
        self._center_pointer(client)
        layout_tmp = os.path.join(desktop.root_dir, "tmp")
        return warm.take_baseline(
            self.pids(), desktop.home_dir, layout_tmp, os.path.join(desktop.root_dir, "home.base")
        )

    def _center_pointer(self, client) -> None:
        w, h = self.screen_size
        client.run_python(f"pyautogui.moveTo({w // 2}, {h // 2})")

    def _reset_in_place(self, browser_cleaner: Callable[[], str | None] | None = None) -> str | None:
        """Reset the running desktop to its baseline; None when verified clean, else why not."""
        from rz_agents.envs.osworld.client import VMClient

        desktop, baseline = self.desktop, self._baseline
        current = self.pids()
        if not baseline.pids <= set(current):
            return f"desktop processes died: {sorted(baseline.pids - set(current))}"
        keep = browser_cleaner is not None and bool(self.browser_pids())
        warm.kill_extra_until_gone(self._pids_but_browser if keep else self.pids, baseline)
        skip = BROWSER_PATHS if keep else ()
        warm.restore_files(baseline, desktop.home_dir, desktop.uid, keep=skip)
        if keep:
            problem = browser_cleaner()
            if problem is not None or not self.browser_pids():
                # a fresh browser next: end this one and take its profile away (the baseline has none)
                self.browser_keep_failures.append(problem or "the browser died while being cleaned")
                keep, skip = False, ()
                warm.kill_extra_until_gone(self.pids, baseline)
                warm.restore_files(baseline, desktop.home_dir, desktop.uid)
        client = VMClient(desktop.server_url, timeout_s=20)
        self._center_pointer(client)
        current = self._pids_but_browser() if keep else self.pids()
        problem = warm.verify(current, baseline, desktop.home_dir, skip)
        if problem is None:
            # a killed app's windows leave the X server's list a moment after the app: give them 3 s
            deadline = time.monotonic() + 3.0
            while (windows := client.windows()) and time.monotonic() < deadline:
                time.sleep(0.05)
            if windows:
                problem = f"windows still open: {[w.get('title') for w in windows][:3]}"
        if problem is None and keep:
            self.browser_keeps += 1
            self.last_reset_kept_browser = True
        return problem

    def _pids_but_browser(self) -> list[int]:
        """The desktop's processes less the kept browser's (one listing of each: a listing reads
        every process's environment on the host)."""
        pids = self.pids()
        spared = self.browser_pids(pids=pids)
        return [p for p in pids if p not in spared]

    def browser_pids(self, helpers: bool = True, pids: list[int] | None = None) -> set[int]:
        """The episode's own Chromium (the ``google-chrome`` wrapper's profile) and its children;
        with ``helpers``, also what it runs beside it (``BROWSER_HELPERS``), which a kept browser
        keeps using: killed, they come back (D-Bus activation) while the reset is still checking."""
        desktop = self.desktop
        if desktop is None:
            return set()
        home = VM_HOME if desktop.sandboxed else desktop.home_dir
        flag = f"--user-data-dir={os.path.join(home, PROFILE_REL)}".encode()
        pids = self.pids() if pids is None else pids
        mains = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    # Chromium rewrites its argv as one space-joined title
                    argv = f.read().replace(b"\0", b" ").split()
            except OSError:
                continue
            if flag in argv and not any(a.startswith(b"--type=") for a in argv):
                mains.append(pid)
        if not mains:
            return set()
        tree = set(process_tree(mains))
        if helpers:
            tree |= {p for p in pids if warm.comm(p) in BROWSER_HELPERS}
        return tree

    def _start(self, desktop: Desktop) -> Desktop:
        uid = sandbox.desktop_uid() if self.sandboxed and os.geteuid() == 0 else None
        desktop.uid = uid
        layout = self._make_layout(desktop, uid)
        env = self._session_env(desktop, layout)
        if self.sandboxed:
            ready = self._launch_sandboxed(desktop, layout, env, uid)
        else:
            ready = self._launch(self._session_command(desktop), env, ())
            desktop.server_url = f"http://127.0.0.1:{int(ready['port'])}"
        desktop.display = ready["display"]
        return desktop

    def _launch_sandboxed(
        self, desktop: Desktop, layout: sandbox.SandboxLayout, env: dict[str, str], uid: int | None
    ) -> dict:
        """The session inside bubblewrap, reached through Unix sockets relayed to host loopback ports.

        The sockets are made here, in a folder the sandbox does not see, and handed to the session
        as open descriptors: the desktop can serve on them but cannot replace them with links to
        other sockets of the host.
        """
        sockets = os.path.join(desktop.root_dir, "run")
        os.makedirs(sockets, mode=0o700)
        paths = {name: os.path.join(sockets, f"{name}.sock") for name in ("server", "cdp")}
        listeners = {name: unix_listener(path) for name, path in paths.items()}
        seccomp_fd = _seccomp_pipe() if uid is not None else None
        try:
            fds = {name: sock.fileno() for name, sock in listeners.items()}
            argv = self._session_command(desktop, fds["server"], fds["cdp"])
            extra = [os.path.dirname(os.path.realpath(b)) for b in [chromium_binary()] if b]
            package = os.path.join(SOURCE_ROOT, "rz_agents")
            argv = sandbox.bwrap_command(layout, argv, env, uid, package, extra, seccomp_fd)
            pass_fds = (*fds.values(), *([] if seccomp_fd is None else [seccomp_fd]))
            ready = self._launch(argv, {}, pass_fds)  # the sandbox's environment is --setenv's alone
        finally:
            for sock in listeners.values():
                sock.close()
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        server = Relay(tcp_listener(), connect_unix(paths["server"]), "server").start()
        cdp = Relay(tcp_listener(desktop.cdp_port), connect_unix(paths["cdp"]), "cdp").start()
        desktop.relays = [server, cdp]
        desktop.server_url = f"http://127.0.0.1:{server.port}"
        return ready

    def _make_layout(self, desktop: Desktop, uid: int | None) -> sandbox.SandboxLayout:
        """The episode's folders, the wrappers in its ``bin`` and (sandboxed) its passwd/group/hosts."""
        root = desktop.root_dir
        layout = sandbox.SandboxLayout(*(os.path.join(root, d) for d in ("home", "tmp", "bin", "etc")))
        for d in (layout.home, layout.tmp, layout.bin, *(os.path.join(layout.home, h) for h in HOME_DIRS)):
            os.makedirs(d, exist_ok=True)
        os.chmod(layout.tmp, 0o1777)
        write_home_defaults(layout.home)
        for name in ("python", "python3"):
            os.symlink(sys.executable, os.path.join(layout.bin, name))
        if self.sandboxed or not shutil.which("sudo"):
            # Tasks run "echo password | sudo -S cmd"; there is no root to become.
            write_sudo_shim(layout.bin)
        write_vlc_wrapper(layout.bin)
        write_apt_wrappers(layout.bin)  # setups' package installs: what the host has (no network)
        write_pip_wrappers(layout.bin)  # likewise their pip installs: what the desktop's Python has
        chromium = chromium_binary()
        if chromium:
            write_code_wrapper(layout.bin, chromium)  # VS Code's `code` on code-server, when installed
        if chromium:
            home = VM_HOME if self.sandboxed else layout.home
            write_chrome_wrapper(
                layout.bin,
                chromium,
                desktop.cdp_port,
                os.path.join(home, PROFILE_REL),
                (["--force-renderer-accessibility"] if self.atspi else [])
                # a kept browser lives on with no window between episodes (chrome_keep.py)
                + (["--keep-alive-for-test"] if self.keep_browser else []),
            )
        if self.sandboxed:
            sandbox.write_identity(layout.etc, uid if uid is not None else sandbox.UNPRIVILEGED_UID)
        if uid is not None:
            for d in (layout.home, layout.tmp):
                _chown_tree(d, uid)
        return layout

    def _session_env(self, desktop: Desktop, layout: sandbox.SandboxLayout) -> dict[str, str]:
        """The session's whole environment (sandboxed: nothing of the host's leaks in)."""
        if self.sandboxed:
            bin_dir, home, pythonpath = sandbox.BIN_DIR, VM_HOME, sandbox.PACKAGE_DIR
            path = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
            env = {"TMPDIR": "/tmp", "LANG": "C.UTF-8", "XDG_RUNTIME_DIR": sandbox.RUNTIME_DIR}
        else:
            bin_dir, home, pythonpath = layout.bin, layout.home, SOURCE_ROOT
            path = f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
            env = {k: v for k, v in os.environ.items() if k not in HOST_SESSION_ENV}
            if env.get("PYTHONPATH"):
                pythonpath += os.pathsep + env["PYTHONPATH"]
            # the episode's own runtime folder (its session bus), never the host user's
            env["XDG_RUNTIME_DIR"] = os.path.join(layout.tmp, ".xdg-runtime")
        env.update(
            {
                MARKER: desktop.episode_id,
                "HOME": home,
                "USER": "user",
                "LOGNAME": "user",
                "PATH": path,
                "PYTHONPATH": pythonpath,
                "RZ_OSWORLD_CDP_PORT": str(desktop.cdp_port),
                "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1",
            }
        )
        return env

    def _session_command(
        self, desktop: Desktop, server_fd: int | None = None, cdp_fd: int | None = None
    ) -> list[str]:
        w, h = self.screen_size
        argv = [sys.executable, "-m", "rz_agents.envs.osworld.session", "--screen", f"{w}x{h}"]
        argv += ["--window-manager", self.window_manager or ""]
        if self.atspi:
            argv.append("--a11y")
        if server_fd is not None and cdp_fd is not None:
            argv += [
                "--server-fd",
                str(server_fd),
                "--cdp-fd",
                str(cdp_fd),
                "--cdp-port",
                str(desktop.cdp_port),
            ]
        if self.sandboxed and os.geteuid() == 0:
            argv += ["--max-processes", str(MAX_PROCESSES)]  # the desktop has a uid of its own
        return argv

    def _launch(self, argv: list[str], env: dict[str, str], pass_fds: tuple[int, ...]) -> dict:
        """Start the session and wait for its ready line (``{"display", "port"}``).

        The fork happens on the process's spawner thread: bubblewrap's ``--die-with-parent``
        follows the forking *thread*, so a desktop reset on a short-lived worker thread would die
        with it; the wait for the ready line stays on the caller's thread.
        """
        proc = on_spawner(
            subprocess.Popen,
            argv,
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=pass_fds,
            start_new_session=True,
        )
        self._procs.append(proc)
        try:
            line = read_line(proc.stdout.fileno(), self.start_timeout_s, "the desktop session did not start")
            return json.loads(line)
        except (SessionError, ValueError) as exc:
            err = _drain(proc)
            raise ProviderError(f"{exc}" + (f": {err}" if err else "")) from None
        finally:
            proc.stdout.close()  # the session sends its later output to /dev/null
            proc.stderr.close()

    def pids(self) -> list[int]:
        """Every live process of the current desktop: the session's tree, the desktop uid's
        processes and those carrying the episode marker (empty when no desktop runs)."""
        desktop = self.desktop
        if desktop is None:
            return []
        tree = process_tree([p.pid for p in self._procs if p.poll() is None], desktop.uid)
        return sorted(set(tree) | set(episode_pids(desktop.episode_id)))

    # -- stop --------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop every process of the current desktop and delete its files; safe to call twice."""
        desktop, self.desktop = self.desktop, None
        procs, self._procs = self._procs, []
        self._baseline = None
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
            if desktop.uid is not None:
                pids += process_tree([], desktop.uid)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)
        for relay in desktop.relays:
            relay.close()
        if desktop.display and not desktop.sandboxed:
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


def _seccomp_pipe() -> int | None:
    """A readable fd holding the seccomp filter that refuses nested user namespaces (x86-64 only)."""
    from rz_agents.envs.python_tool.seccomp import user_namespace_filter

    prog = user_namespace_filter()
    if prog is None:
        return None
    read_fd, write_fd = os.pipe()
    os.write(write_fd, prog)  # a few hundred bytes: fits the pipe buffer
    os.close(write_fd)
    return read_fd


def _chown_tree(path: str, uid: int) -> None:
    os.chown(path, uid, uid)
    for parent, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(parent, name), uid, uid)


def _drain(proc: subprocess.Popen) -> str:
    """The last lines a failed session wrote to stderr (bubblewrap's or Python's error)."""
    import select

    fd, data = proc.stderr.fileno(), b""
    for _ in range(64):
        if not select.select([fd], [], [], 0.5)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return " | ".join(data.decode(errors="replace").strip().splitlines()[-3:])
