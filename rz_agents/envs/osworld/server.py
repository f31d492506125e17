"""The in-VM HTTP server: the contract OSWorld's controllers and getters talk to, on loopback.

Served by the episode's session (``session.py``) inside its sandbox, on a Unix socket the host
reaches through a relay (or, unsandboxed, on a free loopback port). Endpoints (JSON bodies):

* ``GET /platform``, ``/screen_size``, ``/cursor_position``, ``/screenshot`` (PNG),
  ``/accessibility`` (``{"AT": xml}``; ``?view=agent``: only the nodes OSWorld's text agent keeps,
  ``&collect=0``: found by a walk, not a search), ``/terminal`` (``{"output": text | null}``: the focused
  GNOME Terminal's text, read over AT-SPI; ``terminal.py``)
* ``POST /execute`` and ``/setup/execute`` ``{"command": list|str, "shell": bool}`` ->
  ``{"status", "output", "error", "returncode"}``; ``/run_python`` ``{"code"}``
* ``POST /setup/launch`` ``{"command", "shell"}`` (detached); ``/setup/open_file`` ``{"path"}``;
  ``/setup/activate_window`` and ``/setup/close_window`` ``{"window_name", "strict", "by_class"}``
* ``POST /file`` ``file_path`` (form or JSON) -> the bytes; ``/setup/upload`` multipart
  ``file_path`` + ``file_data`` (or JSON ``data_b64``);
  ``/list_directory`` ``{"path"}`` -> a tree; ``/wallpaper`` -> the desktop background's file
  (GNOME's ``picture-uri`` setting, through gsettings)

Paths under ``/home/user`` (OSWorld's VM user) map to ``$HOME``: inside the bubblewrap sandbox
they are the same directory; without it the server rewrites them.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import socket
import socketserver
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import quoteattr

from rz_agents.envs.osworld.client import PYAUTOGUI_PRELUDE
from rz_agents.envs.osworld.terminal import terminal_output

VM_HOME = "/home/user"
COMMAND_TIMEOUT_S = 120


def map_path(path: str) -> str:
    """Map an OSWorld VM path (``/home/user/...``, ``~``) to this desktop's home."""
    home = os.environ.get("HOME", VM_HOME)
    path = os.path.expanduser(path)
    if home != VM_HOME and (path == VM_HOME or path.startswith(VM_HOME + "/")):
        path = home + path[len(VM_HOME) :]
    return path


def map_command(command: list[str] | str) -> list[str] | str:
    """Rewrite ``/home/user`` in a command when the home lives elsewhere; ``python`` -> this Python."""
    home = os.environ.get("HOME", VM_HOME)
    if isinstance(command, str):
        return command.replace(VM_HOME, home) if home != VM_HOME else command
    out = [c.replace(VM_HOME, home) if home != VM_HOME else c for c in command]
    if out and out[0] in ("python", "python3"):
        out[0] = sys.executable
    return out


class ActionRunner:
    """The server's handle on ``action_runner``: ``python -c CODE`` answered by a pre-started fork server."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the runner (it preloads in the background; the first request waits for it)."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "rz_agents.envs.osworld.action_runner"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            self._proc.stdout.readline()  # {"ready": true}
        return self._proc

    def run(self, code: str, timeout: float) -> dict[str, Any] | None:
        """The result of running ``code``, or None when the runner is unusable (caller falls back)."""
        with self._lock:
            try:
                proc = self._ensure()
                proc.stdin.write(json.dumps({"code": code, "timeout": timeout}) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
                if not line:
                    raise OSError("action runner exited")
                return {"status": "success", **json.loads(line)}
            except (OSError, ValueError):
                if self._proc is not None:
                    self._proc.kill()
                self._proc = None
                return None


_runner = ActionRunner()


def _python_c_code(command: list[str] | str, shell: bool) -> str | None:
    """The code of a ``python -c CODE`` argv for this desktop's Python (the form OSWorld uses for
    actions; ``map_command`` already turned a bare ``python``/``python3`` into it), else None.

    An explicit other interpreter (``/usr/bin/python3``) runs as asked.
    """
    if shell or not isinstance(command, list) or len(command) != 3 or command[1] != "-c":
        return None
    return command[2] if command[0] == sys.executable else None


def run_command(command: list[str] | str, shell: bool, timeout: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
    """Run a command to completion; never raises, the result says what happened."""
    command = map_command(command)
    code = _python_c_code(command, shell)
    if code is not None:
        result = _runner.run(code, timeout)
        if result is not None:
            return result
    if shell and isinstance(command, list):
        command = " ".join(shlex.quote(c) for c in command)
    if not shell and isinstance(command, str):
        command = shlex.split(command)
    try:
        proc = subprocess.run(
            command, shell=shell, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        return {
            "status": "success",
            "output": proc.stdout,
            "error": proc.stderr,
            "returncode": proc.returncode,
        }
    except subprocess.TimeoutExpired as exc:
        return {
            "status": "error",
            "output": exc.stdout or "",
            "error": f"timed out after {timeout}s",
            "returncode": -1,
        }
    except (OSError, ValueError) as exc:
        return {"status": "error", "output": "", "error": str(exc), "returncode": -1}


def launch(command: list[str] | str, shell: bool) -> dict[str, Any]:
    """Start a program detached (it outlives the request, not the episode)."""
    command = map_command(command)
    if (
        isinstance(command, list)
        and command
        and os.path.basename(command[0]) == "socat"
        and not shutil.which("socat")
    ):
        # OSWorld forwards the CDP port with socat; here Chrome already listens on the episode's port.
        return {"status": "success", "message": "socat skipped: CDP is exposed directly"}
    if not shell and isinstance(command, str):
        command = shlex.split(command)
    try:
        subprocess.Popen(
            command,
            shell=shell,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return {"status": "success", "message": "launched"}
    except (OSError, ValueError) as exc:
        return {"status": "error", "message": str(exc)}


# --- X11 windows -------------------------------------------------------------------------------


def list_windows() -> list[dict[str, Any]]:
    """Top-level client windows (EWMH ``_NET_CLIENT_LIST``): id, title, class, geometry, active."""
    from Xlib import X, display

    d = display.Display()
    try:
        root = d.screen().root
        atom = d.intern_atom
        clients = root.get_full_property(atom("_NET_CLIENT_LIST"), X.AnyPropertyType)
        active = root.get_full_property(atom("_NET_ACTIVE_WINDOW"), X.AnyPropertyType)
        active_id = int(active.value[0]) if active and len(active.value) else 0
        out = []
        for wid in clients.value if clients else []:
            win = d.create_resource_object("window", int(wid))
            try:
                name_prop = win.get_full_property(atom("_NET_WM_NAME"), atom("UTF8_STRING"))
                name = name_prop.value if name_prop else (win.get_wm_name() or "")
                if isinstance(name, bytes):
                    name = name.decode("utf-8", "replace")
                cls = win.get_wm_class() or ("", "")
                geo = win.get_geometry()
                pos = win.translate_coords(root, 0, 0)
                out.append(
                    {
                        "id": int(wid),
                        "name": name,
                        "class": cls[1] if len(cls) > 1 else cls[0],
                        "x": -pos.x,
                        "y": -pos.y,
                        "w": geo.width,
                        "h": geo.height,
                        "active": int(wid) == active_id,
                    }
                )
            except Exception:
                continue  # the window closed while we looked
        return out
    finally:
        d.close()


def _xdotool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["xdotool", *args], capture_output=True, text=True, timeout=10)


def find_window(name: str, strict: bool = False, by_class: bool = False) -> dict[str, Any] | None:
    """The first window whose title (or class) equals (strict) or contains ``name``, case-insensitive."""
    key = "class" if by_class else "name"
    for w in list_windows():
        value = str(w[key]).lower()
        if (strict and value == name.lower()) or (not strict and name.lower() in value):
            return w
    return None


# --- accessibility tree --------------------------------------------------------------------------

SYSTEM_PYTHON = os.environ.get("RZ_OSWORLD_SYSTEM_PYTHON", "/usr/bin/python3")
ATSPI_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "atspi_tree.py")


class AtspiTree:
    """The server's handle on ``atspi_tree.py``, kept running under the system Python.

    Used when the session switched AT-SPI on (``RZ_OSWORLD_ATSPI=1``). A dump that fails or
    overruns its time kills the helper (the next request starts a fresh one) and returns None, so
    the caller falls back to the X11/Chromium tree.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.last_error = ""

    @staticmethod
    def enabled() -> bool:
        """True when this desktop has AT-SPI switched on."""
        return os.environ.get("RZ_OSWORLD_ATSPI") == "1"

    def _start(self) -> subprocess.Popen | None:
        proc = subprocess.Popen(
            [SYSTEM_PYTHON, ATSPI_SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        ready = self._readline(proc, 30.0)
        if not ready or not json.loads(ready).get("ready"):
            proc.kill()
            self.last_error = "the AT-SPI helper could not import pyatspi"
            return None
        return proc

    @staticmethod
    def _readline(proc: subprocess.Popen, timeout: float) -> str | None:
        import select

        if not select.select([proc.stdout], [], [], timeout)[0]:
            return None
        return proc.stdout.readline() or None

    def dump(self, time_s: float = 20.0, view: str = "full", collect: bool = True) -> str | None:
        """The AT-SPI tree as XML (``view``: ``full`` or ``agent``, see ``atspi_tree.py``), or None
        (``last_error`` says why). ``collect=False``: the agent view by a walk (the reference)."""
        with self._lock:
            try:
                if self._proc is None or self._proc.poll() is not None:
                    self._proc = self._start()
                if self._proc is None:
                    return None
                request = {"time_s": time_s, "view": view, "collect": collect}
                self._proc.stdin.write(json.dumps(request) + "\n")
                self._proc.stdin.flush()
                line = self._readline(self._proc, time_s + 15)
                if line is None:
                    raise OSError(f"no answer within {time_s + 15:.0f}s")
                answer = json.loads(line)
            except (OSError, ValueError) as exc:
                self.last_error = f"AT-SPI helper: {exc}"
                if self._proc is not None:
                    self._proc.kill()
                self._proc = None
                return None
            if "xml" not in answer:
                self.last_error = answer.get("error", "no tree")
                return None
            return answer["xml"]


_atspi = AtspiTree()

_chrome_link = None
_chrome_lock = threading.Lock()


def _chrome_nodes() -> list[dict[str, Any]]:
    """The active Chrome tab's AX nodes, or [] when no browser listens on the episode's CDP port."""
    global _chrome_link
    port = os.environ.get("RZ_OSWORLD_CDP_PORT")
    if not port:
        return []
    with socket.socket() as s:
        s.settimeout(0.2)
        if s.connect_ex(("127.0.0.1", int(port))) != 0:
            return []
    from rz_agents.envs.osworld.chrome import ChromeLink, active_page, page_ax_nodes

    with _chrome_lock:
        if _chrome_link is None:
            _chrome_link = ChromeLink(int(port))
        link = _chrome_link

    def grab(browser: Any) -> list[dict[str, Any]]:
        page = active_page(browser)
        return page_ax_nodes(page) if page is not None else []

    return link.call(grab, timeout_s=20)


A11Y_VIEWS = ("full", "agent")


def accessibility_xml(view: str = "full", collect: bool = True) -> str:
    """The desktop's accessibility tree: AT-SPI's (every app's widgets) when the session has it,
    else the fallback: X11 windows, with Chromium's page tree (over CDP) inside its window.

    ``view="agent"``: only the nodes OSWorld's text agent keeps (same table, far fewer calls)."""
    if view not in A11Y_VIEWS:
        raise ValueError(f"view must be one of {A11Y_VIEWS}, got {view!r}")
    if AtspiTree.enabled():
        xml = _atspi.dump(view=view, collect=collect)
        if xml is not None:
            return xml
    return fallback_xml()


def terminal_text() -> str | None:
    """OSWorld's ``/terminal``: the focused GNOME Terminal's text, or None (no AT-SPI, no such terminal)."""
    if not AtspiTree.enabled():
        return None
    xml = _atspi.dump()
    return None if xml is None else terminal_output(xml)


def wallpaper_path() -> str | None:
    """The file of GNOME's desktop background (``org.gnome.desktop.background picture-uri``), or None.

    As OSWorld's server reads it: the setting's text without ``file://`` and quotes.
    """
    try:
        r = subprocess.run(
            ["gsettings", "get", "org.gnome.desktop.background", "picture-uri"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return map_path(r.stdout.strip().replace("file://", "").replace("'", ""))


def fallback_xml() -> str:
    """X11 windows, with Chrome's own AX tree inside its window (no AT-SPI needed)."""

    def attrs(d: dict[str, Any]) -> str:
        return (
            f" name={quoteattr(str(d.get('name', '')))} "
            f'screencoord="({d.get("x", -1)}, {d.get("y", -1)})" size="({d.get("w", 0)}, {d.get("h", 0)})"'
        )

    lines = ['<desktop-frame name="main">']
    try:
        windows = list_windows()
    except Exception as exc:
        windows = []
        lines.append(f"<!-- windows unavailable: {exc} -->")
    for w in windows:
        app = str(w["class"] or "application")
        lines.append(f"<application name={quoteattr(app)}>")
        lines.append(f"<frame{attrs(w)} active={quoteattr(str(w['active']).lower())}>")
        if "chrom" in app.lower():
            try:
                for n in _chrome_nodes():
                    tag = "".join(ch for ch in n["role"] if ch.isalnum()) or "node"
                    text = n.get("value") or ""
                    lines.append(f"<{tag}{attrs(n)} text={quoteattr(text)}/>")
            except Exception as exc:
                lines.append(f"<!-- chrome tree unavailable: {type(exc).__name__} -->")
        lines.append("</frame>")
        lines.append("</application>")
    lines.append("</desktop-frame>")
    return "\n".join(lines)


# --- screenshots -------------------------------------------------------------------------------


# zlib level of the screenshot PNG: 1 encodes a 1920x1080 desktop in ~18 ms of CPU instead of ~38 ms
# at mss's default 6, for ~2x the bytes (~45 KB, over loopback); PNG is lossless, the pixels are the same.
SCREENSHOT_PNG_LEVEL = 1


def screenshot_png(level: int = SCREENSHOT_PNG_LEVEL) -> bytes:
    """A PNG of the whole display (mss grabs X11 directly, no temporary file)."""
    import mss
    import mss.tools

    factory = getattr(mss, "MSS", None) or mss.mss
    with factory(display=os.environ.get("DISPLAY")) as grabber:
        img = grabber.grab(grabber.monitors[0])
        return mss.tools.to_png(img.rgb, img.size, level=level)


def screen_size() -> tuple[int, int]:
    """Width and height of the display."""
    from Xlib import display

    d = display.Display()
    try:
        s = d.screen()
        return s.width_in_pixels, s.height_in_pixels
    finally:
        d.close()


def cursor_position() -> tuple[int, int]:
    """The pointer's position on the display."""
    from Xlib import display

    d = display.Display()
    try:
        p = d.screen().root.query_pointer()
        return p.root_x, p.root_y
    finally:
        d.close()


def directory_tree(path: str) -> dict[str, Any]:
    """``{"type": "directory", "name", "children": [...]}`` for ``path`` (files as ``{"type": "file"}``)."""
    node: dict[str, Any] = {
        "name": os.path.basename(path.rstrip("/")) or path,
        "type": "directory",
        "children": [],
    }
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False):
            node["children"].append(directory_tree(entry.path))
        else:
            node["children"].append({"name": entry.name, "type": "file"})
    return node


def parse_multipart(ctype: str, raw: bytes) -> dict[str, Any]:
    """Fields of a ``multipart/form-data`` body: text fields as str, file fields as bytes."""
    from email import message_from_bytes
    from email.policy import HTTP

    msg = message_from_bytes(f"Content-Type: {ctype}\r\n\r\n".encode() + raw, policy=HTTP)
    out: dict[str, Any] = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        out[name] = payload if part.get_filename() else payload.decode()
    return out


# --- HTTP --------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    """One request; every endpoint answers JSON (or raw bytes for files and screenshots)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: the episode log is the caller's
        return

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, obj: Any, code: int = 200) -> None:
        self._send(code, json.dumps(obj).encode(), "application/json")

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return {}
        ctype = self.headers.get("Content-Type") or ""
        if "application/x-www-form-urlencoded" in ctype:
            return {k: v[0] for k, v in parse_qs(raw.decode()).items()}
        if ctype.startswith("multipart/form-data"):
            return parse_multipart(ctype, raw)
        return json.loads(raw)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        path, query = url.path, parse_qs(url.query)
        try:
            if path == "/platform":
                self._send(200, b"Linux", "text/plain")
            elif path == "/screenshot":
                self._send(200, screenshot_png(), "image/png")
            elif path == "/accessibility":
                view, collect = query.get("view", ["full"])[0], query.get("collect", ["1"])[0] != "0"
                if view not in A11Y_VIEWS:
                    self._json({"status": "error", "message": f"view must be one of {A11Y_VIEWS}"}, 400)
                else:
                    self._json({"AT": accessibility_xml(view, collect)})
            elif path == "/terminal":
                self._json({"output": terminal_text()})
            elif path == "/screen_size":
                w, h = screen_size()
                self._json({"width": w, "height": h})
            elif path == "/cursor_position":
                self._json(list(cursor_position()))
            elif path == "/windows":
                self._json(list_windows())
            else:
                self._json({"status": "error", "message": f"unknown endpoint {self.path}"}, 404)
        except Exception as exc:
            self._json({"status": "error", "message": f"{type(exc).__name__}: {exc}"}, 500)

    def do_POST(self) -> None:
        try:
            body = self._body()
        except (ValueError, json.JSONDecodeError) as exc:
            self._json({"status": "error", "message": f"bad request body: {exc}"}, 400)
            return
        try:
            self._post(self.path, body)
        except (KeyError, TypeError) as exc:
            self._json({"status": "error", "message": f"missing or bad field: {exc}"}, 400)
        except Exception as exc:
            self._json({"status": "error", "message": f"{type(exc).__name__}: {exc}"}, 500)

    def _post(self, path: str, body: dict[str, Any]) -> None:
        if path in ("/execute", "/setup/execute"):
            self._json(
                run_command(
                    body["command"], bool(body.get("shell", False)), body.get("timeout", COMMAND_TIMEOUT_S)
                )
            )
        elif path == "/run_python":
            self._json(run_command([sys.executable, "-c", PYAUTOGUI_PRELUDE + body["code"]], False))
        elif path == "/setup/launch":
            self._json(launch(body["command"], bool(body.get("shell", False))))
        elif path == "/setup/open_file":
            target = map_path(body["path"])
            if not os.path.exists(target):
                self._json({"status": "error", "message": f"no such file: {body['path']}"}, 404)
                return
            self._json(
                launch(["xdg-open", target], False)
                if shutil.which("xdg-open")
                else {"status": "error", "message": "xdg-open is not installed"}
            )
        elif path in ("/setup/activate_window", "/setup/close_window"):
            w = find_window(body["window_name"], bool(body.get("strict")), bool(body.get("by_class")))
            if w is None:
                self._json({"status": "error", "message": f"no window matching {body['window_name']!r}"}, 404)
                return
            verb = "windowactivate" if path.endswith("activate_window") else "windowclose"
            r = _xdotool(verb, str(w["id"]))
            if verb == "windowclose" and r.returncode != 0:
                r = _xdotool("windowkill", str(w["id"]))
            self._json({"status": "success" if r.returncode == 0 else "error", "message": r.stderr.strip()})
        elif path == "/file":
            target = map_path(body["file_path"])
            if not os.path.isfile(target):
                self._json({"status": "error", "message": f"no such file: {body['file_path']}"}, 404)
                return
            with open(target, "rb") as f:
                self._send(200, f.read(), "application/octet-stream")
        elif path == "/setup/upload":
            target = map_path(body["file_path"])
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            data = body["file_data"] if "file_data" in body else base64.b64decode(body["data_b64"])
            with open(target, "wb") as f:
                f.write(data)
            self._json({"status": "success"})
        elif path == "/list_directory":
            target = map_path(body["path"])
            if not os.path.isdir(target):
                self._json({"status": "error", "message": f"no such directory: {body['path']}"}, 404)
                return
            self._json({"status": "success", "directory_tree": directory_tree(target)})
        elif path == "/wallpaper":
            target = wallpaper_path()
            if target is None or not os.path.isfile(target):
                self._json({"status": "error", "message": f"wallpaper file not found: {target}"}, 404)
                return
            with open(target, "rb") as f:
                self._send(200, f.read(), "image/png")
        elif path in READ_ONLY_POST:
            self.do_GET()  # OSWorld's server takes these as POST too
        else:
            self._json({"status": "error", "message": f"unknown endpoint {path}"}, 404)


READ_ONLY_POST = (
    "/screen_size",
    "/cursor_position",
    "/accessibility",
    "/terminal",
    "/platform",
    "/screenshot",
)


class UnixHTTPServer(socketserver.ThreadingUnixStreamServer):
    """The HTTP server on an inherited listening Unix socket (the sandboxed desktop's only door)."""

    daemon_threads = True

    def __init__(self, fd: int) -> None:
        super().__init__("", Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = socket.socket(fileno=fd)

    def get_request(self) -> tuple[socket.socket, tuple[str, int]]:
        conn, _ = super().get_request()
        return conn, ("unix", 0)  # BaseHTTPRequestHandler expects a (host, port) address


def make_server(listen_fd: int | None) -> socketserver.BaseServer:
    """The in-VM server on the listening socket ``listen_fd``, or on a free loopback TCP port when None."""
    if listen_fd is not None:
        return UnixHTTPServer(listen_fd)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


def serve(server: socketserver.BaseServer) -> None:
    """Serve forever; stdout and stderr go to /dev/null first (the provider stops reading after the ready line)."""
    threading.Thread(target=_runner.start, daemon=True).start()  # preload while the desktop settles
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    server.serve_forever()
