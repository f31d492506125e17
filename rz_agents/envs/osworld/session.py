"""The desktop session: the first program of an episode, run inside its sandbox (or bare when unsandboxed).

``python -m rz_agents.envs.osworld.session --screen 1920x1080 [--server-fd N --cdp-fd M --cdp-port P]``

1. starts Xvfb (it picks a free display itself through ``-displayfd``; in a sandbox, with its own
   ``/tmp`` and network namespace, that is ``:0`` as on OSWorld's VM) and writes ``~/.Xauthority``;
2. with ``--a11y``: starts a session D-Bus of its own, switches accessibility on (the AT-SPI bus,
   and the variables that make GTK 2/3, LibreOffice, Qt, Gecko and Chromium expose their widgets),
   so ``atspi_tree.py`` can read every application's tree; then starts the window manager;
3. serves the in-VM HTTP server (``server.py``): on the listening Unix socket inherited as fd
   ``--server-fd`` (sandboxed: the host created it in a folder the desktop cannot see, and relays
   it to a loopback port of its own), else on a free loopback TCP port; with ``--cdp-fd`` it also
   relays that inherited socket to Chromium's DevTools port ``--cdp-port``;
4. prints one JSON line ``{"display": ":0", "port": N | null}`` once the server listens, then
   serves until it is killed (its children go with it: the sandbox's PID namespace, or the process
   group the provider signals).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

from rz_agents.envs.osworld.terminal import openbox_config

START_TIMEOUT_S = 30.0


class SessionError(RuntimeError):
    """A part of the desktop did not start; the message names it."""


def read_line(fd: int, timeout_s: float, what: str) -> str:
    """One line from ``fd`` within ``timeout_s``; ``SessionError`` naming ``what`` otherwise."""
    buf = b""
    deadline = time.monotonic() + timeout_s
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise SessionError(f"{what} within {timeout_s:.0f}s")
        chunk = os.read(fd, 256)
        if not chunk:
            raise SessionError(f"{what} (process exited)")
        buf += chunk
    return buf.decode().strip()


def write_xauthority(path: str, display_number: str) -> None:
    """An ``.Xauthority`` entry for this display (python-xlib, hence pyautogui, warns on stdout without one).

    Xvfb runs without ``-auth`` so it accepts any cookie; the entry only keeps clients quiet.
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


def start_reporting(argv: list[str], timeout_s: float, what: str) -> tuple[subprocess.Popen, str]:
    """Start a daemon that writes one line (its display, its address) to the fd ``{fd}`` in ``argv`` names."""
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            [a.replace("{fd}", str(write_fd)) for a in argv],
            pass_fds=(write_fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    finally:
        os.close(write_fd)
    try:
        line = read_line(read_fd, timeout_s, f"{argv[0]} did not report its {what}")
    finally:
        os.close(read_fd)
    return proc, line


def start_xvfb(screen: str, timeout_s: float) -> tuple[subprocess.Popen, str]:
    """Start Xvfb on a display it picks; returns the process and ``:N``."""
    argv = ["Xvfb", "-displayfd", "{fd}", "-screen", "0", f"{screen}x24", "-noreset", "-nolisten", "tcp"]
    xvfb, number = start_reporting(argv, timeout_s, "display number")
    return xvfb, f":{number}"


def start_window_manager(name: str, config_dir: str) -> subprocess.Popen | None:
    """Start the window manager (None when it is not installed).

    openbox gets its system configuration plus OSWorld's (Ubuntu's) Ctrl+Alt+T terminal key,
    written to ``config_dir`` (see ``openbox_config``).
    """
    if not name or not shutil.which(name):
        return None
    argv = [name]
    if name == "openbox":
        config = openbox_config(config_dir)
        if config:
            argv += ["--config-file", config]
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


# What makes each toolkit expose its widgets over AT-SPI without a GNOME session.
A11Y_ENV = {
    "GTK_MODULES": "gail:atk-bridge",  # GTK 2 (GIMP); GTK 3 loads the bridge itself
    "GNOME_ACCESSIBILITY": "1",  # Gecko (Thunderbird), LibreOffice
    "SAL_USE_VCLPLUGIN": "gtk3",  # LibreOffice's GTK 3 front end carries its accessibility
    "QT_ACCESSIBILITY": "1",  # Qt (VLC)
    "QT_LINUX_ACCESSIBILITY_ALWAYS_ON": "1",
    "ACCESSIBILITY_ENABLED": "1",  # Chromium (with --force-renderer-accessibility)
}


@functools.lru_cache(maxsize=1)
def atspi_problem(system_python: str = "/usr/bin/python3") -> str | None:
    """Why desktops cannot have AT-SPI trees here (None when they can); probed once per process."""
    for tool in ("dbus-daemon", "dbus-send"):
        if not shutil.which(tool):
            return f"{tool} is not installed (apt-get install dbus dbus-bin)"
    if not any(
        os.path.exists(p)
        for p in ("/usr/libexec/at-spi-bus-launcher", "/usr/lib/at-spi2-core/at-spi-bus-launcher")
    ):
        return "at-spi2-core is not installed"
    try:
        ok = (
            subprocess.run(
                [system_python, "-c", "import pyatspi"], capture_output=True, timeout=30
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return (
        None
        if ok
        else f"{system_python} cannot import pyatspi (apt-get install python3-pyatspi gir1.2-atspi-2.0)"
    )


def start_session_bus(timeout_s: float, runtime_dir: str) -> tuple[subprocess.Popen, str]:
    """A session D-Bus daemon of this desktop, listening at ``<runtime_dir>/bus``; returns it and its address.

    In the sandbox ``runtime_dir`` is ``/run/user/1000`` as on OSWorld's VM, whose tasks export
    ``DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus`` before ``gsettings set``.
    """
    argv = ["dbus-daemon", "--session", "--nofork", "--nopidfile", "--print-address={fd}",
            f"--address=unix:path={os.path.join(runtime_dir, 'bus')}"]  # fmt: skip
    return start_reporting(argv, timeout_s, "address")


def runtime_dir() -> str:
    """The desktop's ``XDG_RUNTIME_DIR``, made (mode 0700) if missing.

    The provider names it (sandboxed: ``/run/user/1000``, a link into the episode's ``/tmp``);
    otherwise a folder of the session's ``TMPDIR``.
    """
    path = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(
        os.environ.get("TMPDIR", "/tmp"), f"xdg-runtime-{os.getuid()}"
    )
    os.makedirs(os.path.realpath(path), mode=0o700, exist_ok=True)
    os.environ["XDG_RUNTIME_DIR"] = path
    return path


def enable_accessibility(timeout_s: float) -> bool:
    """Set ``org.a11y.Status.IsEnabled`` (D-Bus activates the AT-SPI bus launcher); True when it took."""
    cmd = ["dbus-send", "--session", "--print-reply", "--dest=org.a11y.Bus", "/org/a11y/bus",
           "org.freedesktop.DBus.Properties.Set", "string:org.a11y.Status", "string:IsEnabled",
           "variant:boolean:true"]  # fmt: skip
    try:
        return subprocess.run(cmd, capture_output=True, timeout=timeout_s).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def limit_processes(n: int) -> None:
    """Cap the processes (threads included) of this desktop's user: a fork bomb stays in the sandbox.

    Counted per real uid, so it bounds the episode only when the sandbox runs under a uid of its own.
    """
    resource.setrlimit(resource.RLIMIT_NPROC, (n, n))


def main(argv: list[str] | None = None) -> None:
    """Start the display, the window manager and the server; print the ready line; serve."""
    p = argparse.ArgumentParser(prog="rz_agents.envs.osworld.session")
    p.add_argument("--screen", default="1920x1080", help="WIDTHxHEIGHT")
    p.add_argument("--server-fd", type=int, help="serve on this inherited listening socket instead of TCP")
    p.add_argument("--cdp-fd", type=int, help="relay this inherited listening socket to --cdp-port")
    p.add_argument("--cdp-port", type=int, default=0, help="Chromium's DevTools port inside the desktop")
    p.add_argument("--window-manager", default="openbox")
    p.add_argument("--max-processes", type=int, default=0, help="RLIMIT_NPROC for the desktop user (0: keep)")
    p.add_argument("--a11y", action="store_true", help="a session bus and AT-SPI accessibility for the apps")
    args = p.parse_args(argv)

    # The provider ends the session by signal; exiting through Python lets children see it too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.max_processes:
        limit_processes(args.max_processes)
    children: list[subprocess.Popen] = []
    try:
        xvfb, display = start_xvfb(args.screen, START_TIMEOUT_S)
        children.append(xvfb)
        os.environ["DISPLAY"] = display
        write_xauthority(os.path.join(os.environ.get("HOME", "/tmp"), ".Xauthority"), display[1:])
        a11y = False
        runtime = runtime_dir()
        if args.a11y:
            os.environ.update(A11Y_ENV)  # before the bus: the apps it activates inherit them
        if shutil.which("dbus-daemon"):
            # a session bus even without AT-SPI: gsettings (dconf) and gnome-terminal need one
            bus, address = start_session_bus(START_TIMEOUT_S, runtime)
            children.append(bus)
            os.environ["DBUS_SESSION_BUS_ADDRESS"] = address
        if args.a11y:
            a11y = enable_accessibility(START_TIMEOUT_S)
            os.environ["RZ_OSWORLD_ATSPI"] = "1" if a11y else "0"
        wm = start_window_manager(args.window_manager, runtime)
        if wm is not None:
            children.append(wm)

        from rz_agents.envs.osworld.server import make_server, serve

        server = make_server(args.server_fd)
        port = None if args.server_fd is not None else server.server_address[1]
        if args.cdp_fd is not None:
            from rz_agents.envs.osworld.relay import Relay, connect_tcp

            Relay(socket.socket(fileno=args.cdp_fd), connect_tcp(args.cdp_port), "cdp").start()
        print(json.dumps({"display": display, "port": port, "a11y": a11y}), flush=True)
        serve(server)
    finally:
        for child in reversed(children):
            if child.poll() is None:
                child.terminate()


if __name__ == "__main__":
    main()
