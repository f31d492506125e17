"""``CommandEndpoint``: one episode's sandbox, reachable by the CLI agent's process over local HTTP.

A CLI agent (mini-swe-agent) runs in its own interpreter; its environment class
(shim/rz_sandbox_environment.py) posts each command here, and the command runs in the episode's Harbor
workspace through ``ShellTaskEnv.run_command``: the same bubblewrap sandbox, limits and time budget as the
built-in ``bash`` tool. The endpoint listens on 127.0.0.1 on a free port and answers only requests that
carry its random token (one episode's agent cannot reach another's sandbox); it lives as long as the
episode.

    POST /run  {"command": "ls", "timeout": 30}  ->  {"output": "...", "returncode": 0, "timed_out": false}

A command the sandbox refuses (empty, the task's time used up) answers ``returncode: -1`` and ``error``; a
malformed request gets a 400 with a one-line ``error``.
"""

from __future__ import annotations

import hmac
import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rz_agents.envs.harbor.env import CommandRefused, ShellTaskEnv

MAX_BODY_BYTES = 1 << 20


class CommandEndpoint:
    """Serves ``env.run_command`` to one agent process; ``close()`` stops it (the env stays the caller's)."""

    def __init__(self, env: ShellTaskEnv) -> None:
        self.env = env
        self.token = secrets.token_urlsafe(24)
        self.commands = 0  # commands run (refused ones included)
        self._lock = threading.Lock()  # one command at a time: the workspace is one terminal's
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                status, body = endpoint._handle(self)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:  # quiet: the run's own logs say what happened
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="rz-command-endpoint")
        self._thread.daemon = True
        self._thread.start()

    @property
    def url(self) -> str:
        """Where the agent posts its commands."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/run"

    def _handle(self, request: BaseHTTPRequestHandler) -> tuple[int, dict[str, Any]]:
        if request.path != "/run":
            return 404, {"error": f"no route {request.path!r}; POST /run"}
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return 401, {"error": "missing or wrong token"}
        length = int(request.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY_BYTES:
            return 400, {"error": f"a JSON body of 1 to {MAX_BODY_BYTES} bytes is required"}
        try:
            body = json.loads(request.rfile.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return 400, {"error": f"the body is not JSON: {exc}"}
        if not isinstance(body, dict):
            return 400, {"error": 'the body must be an object {"command": str, "timeout": seconds}'}
        timeout = body.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
            return 400, {"error": f"timeout must be a number of seconds, got {timeout!r:.40}"}
        with self._lock:
            self.commands += 1
            try:
                result = self.env.run_command(body.get("command"), wall_s=timeout)
            except CommandRefused as exc:
                return 200, {"output": "", "returncode": -1, "timed_out": False, "error": str(exc)}
        timed_out = result.timed_out
        error = f"the command timed out after {result.duration_s:.0f} s (killed)" if timed_out else None
        code = -1 if result.exit_code is None else result.exit_code
        return 200, {"output": result.output, "returncode": code, "timed_out": timed_out, "error": error}

    def close(self) -> None:
        """Stop serving (a command in flight finishes first)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)

    def __enter__(self) -> CommandEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
