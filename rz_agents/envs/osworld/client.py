"""HTTP client for the in-VM server (``server.py``): what setup steps, getters and the env call."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any

PYAUTOGUI_PRELUDE = "import pyautogui, time\npyautogui.FAILSAFE = False\n"


class ServerError(RuntimeError):
    """The in-VM server answered with an error or could not be reached."""


class VMClient:
    """Talks to one desktop's server at ``base_url`` (``http://127.0.0.1:<port>``)."""

    def __init__(self, base_url: str, timeout_s: float = 150.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        timeout: float | None = None,
        raw: tuple[bytes, str] | None = None,
    ) -> bytes:
        """Send JSON ``body`` (or ``raw`` = (bytes, content type)); the response bytes."""
        if raw is not None:
            data, ctype = raw
        else:
            data, ctype = (json.dumps(body).encode() if body is not None else None), "application/json"
        req = urllib.request.Request(
            self.base_url + path, data=data, method=method, headers={"Content-Type": ctype}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("message", detail)
            except (json.JSONDecodeError, AttributeError):
                pass
            raise ServerError(f"{method} {path}: HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ServerError(f"{method} {path}: server unreachable at {self.base_url}: {exc}") from exc

    def _json(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        return json.loads(self._request(method, path, body, timeout))

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Block until the server answers ``/platform``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._request("GET", "/platform", timeout=2)
                return
            except ServerError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def execute(self, command: list[str] | str, shell: bool = False, timeout: float = 120) -> dict[str, Any]:
        """Run a command to completion in the desktop: ``{"status", "output", "error", "returncode"}``."""
        return self._json(
            "POST", "/execute", {"command": command, "shell": shell, "timeout": timeout}, timeout + 10
        )

    def run_python(self, code: str) -> dict[str, Any]:
        """Run Python code in a fresh interpreter in the desktop, ``pyautogui`` and ``time`` imported.

        Sent as ``/execute`` of ``python -c``, as OSWorld's controller does, so it works against
        OSWorld's own in-VM server too.
        """
        return self.execute(["python", "-c", PYAUTOGUI_PRELUDE + code])

    def launch(self, command: list[str] | str, shell: bool = False) -> dict[str, Any]:
        """Start a program detached."""
        return self._json("POST", "/setup/launch", {"command": command, "shell": shell})

    def open_file(self, path: str) -> dict[str, Any]:
        """Open a file with its default application."""
        return self._json("POST", "/setup/open_file", {"path": path})

    def activate_window(
        self, window_name: str, strict: bool = False, by_class: bool = False
    ) -> dict[str, Any]:
        """Raise and focus the first window matching ``window_name``."""
        return self._json(
            "POST",
            "/setup/activate_window",
            {"window_name": window_name, "strict": strict, "by_class": by_class},
        )

    def close_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> dict[str, Any]:
        """Close the first window matching ``window_name``."""
        return self._json(
            "POST",
            "/setup/close_window",
            {"window_name": window_name, "strict": strict, "by_class": by_class},
        )

    def get_file(self, path: str) -> bytes | None:
        """The bytes of a file in the desktop, or None when it does not exist."""
        # Form-encoded, as OSWorld's own server reads it (``request.form["file_path"]``).
        form = urllib.parse.urlencode({"file_path": path}).encode()
        try:
            return self._request("POST", "/file", raw=(form, "application/x-www-form-urlencoded"))
        except ServerError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise

    def upload(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` in the desktop (parents created); multipart, as OSWorld sends it."""
        boundary = uuid.uuid4().hex
        body = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="file_path"\r\n\r\n{path}\r\n'
                f'--{boundary}\r\nContent-Disposition: form-data; name="file_data"; filename="upload"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n"
            ).encode()
            + data
            + f"\r\n--{boundary}--\r\n".encode()
        )
        self._request("POST", "/setup/upload", raw=(body, f"multipart/form-data; boundary={boundary}"))

    def list_directory(self, path: str) -> dict[str, Any] | None:
        """The directory tree at ``path``, or None when it does not exist."""
        try:
            return self._json("POST", "/list_directory", {"path": path})["directory_tree"]
        except ServerError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise

    def screenshot(self) -> bytes:
        """A PNG of the screen."""
        return self._request("GET", "/screenshot")

    def accessibility_tree(self, view: str = "full", collect: bool = True) -> str:
        """The accessibility tree as XML. ``view="agent"``: only the nodes OSWorld's text agent keeps
        (``linearize`` gives the same table; OSWorld's own server ignores the option and sends all);
        ``collect=False`` finds them by a walk instead of a search (the reference, for tests)."""
        query = [f"view={view}"] if view != "full" else []
        query += [] if collect else ["collect=0"]
        return self._json("GET", "/accessibility" + ("?" + "&".join(query) if query else ""))["AT"]

    def terminal_output(self) -> str | None:
        """The focused GNOME Terminal's text (None: no such terminal open and active)."""
        return self._json("GET", "/terminal")["output"]

    def wallpaper(self) -> bytes | None:
        """The bytes of the desktop background's file (GNOME's setting), or None when it has none."""
        try:
            return self._request("POST", "/wallpaper")
        except ServerError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise

    def windows(self) -> list[dict[str, Any]]:
        """The top-level windows (title, class, geometry, active)."""
        return self._json("GET", "/windows")

    def screen_size(self) -> tuple[int, int]:
        """The display's width and height."""
        d = self._json("GET", "/screen_size")
        return d["width"], d["height"]
