"""The in-VM HTTP server (routes only; its commands, windows, observations and files live in
``vm_commands``, ``vm_windows``, ``vm_observe``, ``vm_files``): the contract OSWorld's controllers and
getters talk to, on loopback.

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
import shutil
import socket
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from rz_agents.envs.osworld.client import PYAUTOGUI_PRELUDE
from rz_agents.envs.osworld.vm_commands import (
    COMMAND_TIMEOUT_S,
    _runner,
    launch,
    map_path,
    run_command,
)
from rz_agents.envs.osworld.vm_files import directory_tree, parse_multipart
from rz_agents.envs.osworld.vm_observe import (
    A11Y_VIEWS,
    accessibility_xml,
    cursor_position,
    screen_size,
    screenshot_png,
    terminal_text,
    wallpaper_path,
)
from rz_agents.envs.osworld.vm_windows import find_window, list_windows, xdotool

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
            r = xdotool(verb, str(w["id"]))
            if verb == "windowclose" and r.returncode != 0:
                r = xdotool("windowkill", str(w["id"]))
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
    """Serve forever; stdout and stderr go to /dev/null first (the provider stops reading after the ready
    line)."""
    threading.Thread(target=_runner.start, daemon=True).start()  # preload while the desktop settles
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    server.serve_forever()
