"""The checks every request passes before a route sees it (an ASGI middleware over the app).

In order: the Host header is one the server answers to (a DNS-rebinding page names its own host); a
browser's Origin is the server's own or allowed; the Bearer key is an API key (the control key on the RL
control routes, which no API key opens); a body is ``application/json`` (a cross-site form or
``text/plain`` POST needs no preflight, so the type is the browser boundary), no larger than the cap, and
arrives in time. Each refusal is an OpenAI-style JSON error; the route then reads the buffered body.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from typing import Any
from urllib.parse import urlsplit

from rz_agents.serve.options import ServeOptions

CONTROL_PATHS = frozenset({"/pause", "/resume", "/is_paused", "/update_weights", "/weight_version"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
OWNER_KEY = "rz_owner"  # request.state.rz_owner: the session namespace of the caller's key


class RequestGuard:
    """ASGI middleware enforcing ``options`` on ``app``; ``control``: the control routes are mounted."""

    def __init__(self, app, options: ServeOptions, control: bool) -> None:
        self.app = app
        self.options = options
        self.control = control
        self.hosts = options.hosts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refused = self._refusal(scope, headers)
        if refused is not None:
            await _reply(send, *refused)
            return
        key = _bearer(headers)
        scope.setdefault("state", {})[OWNER_KEY] = self.options.owner(key)
        if scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        body = await self._body(headers, receive, send)
        if body is None:
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect a route may wait for

        await self.app(scope, replay, send)

    def _refusal(self, scope, headers: dict[str, str]) -> tuple[int, str, str] | None:
        host = _hostname(headers.get("host", ""))
        if self.hosts is not None and host not in self.hosts:
            return 403, f"Host {host!r} is not served here (allowed: --allow-host)", "host_not_allowed"
        origin = headers.get("origin")
        if origin is not None and origin not in self.options.allowed_origins:
            if origin == "null" or _hostname(urlsplit(origin).netloc) != host or not self._local(host):
                return (
                    403,
                    f"Origin {origin!r} is not allowed (allowed: --allow-origin)",
                    "origin_not_allowed",
                )
        key = _bearer(headers)
        if self.control and scope["path"] in CONTROL_PATHS:
            if key is None or not hmac.compare_digest(key.encode(), self.options.control_key.encode()):
                return (
                    401,
                    "the RL control routes need the control key (Authorization: Bearer ...)",
                    ("invalid_api_key"),
                )
        elif self.options.api_keys and not any(
            key is not None and hmac.compare_digest(key.encode(), k.encode()) for k in self.options.api_keys
        ):
            return 401, "Incorrect or missing API key (Authorization: Bearer ...)", "invalid_api_key"
        return None

    def _local(self, host: str) -> bool:
        """Same-origin browser requests are allowed only where the Host itself is checked."""
        return self.hosts is not None and host in self.hosts

    async def _body(self, headers: dict[str, str], receive, send) -> bytes | None:
        """The whole body, or None after replying with the error that refused it."""
        cap = self.options.max_body_bytes
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > cap):
            await _reply(send, 413, f"the request body is larger than {cap} bytes", "body_too_large")
            return None
        chunks, size = [], 0
        deadline = time.monotonic() + self.options.body_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                message = {"type": "timeout"}
            if message["type"] == "timeout":
                timeout = self.options.body_timeout_s
                await _reply(send, 408, f"the request body did not arrive within {timeout} s", "timeout")
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > cap:
                await _reply(send, 413, f"the request body is larger than {cap} bytes", "body_too_large")
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if (body or "content-type" in headers) and media != "application/json":
            shown = media or "none"
            await _reply(send, 415, f"Content-Type must be application/json, got {shown}", "bad_content_type")
            return None
        return body


def _bearer(headers: dict[str, str]) -> str | None:
    value = headers.get("authorization", "")
    scheme, _, key = value.partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


def _hostname(netloc: str) -> str:
    """``host[:port]`` or ``[v6]:port`` -> the lowercase host."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1 : netloc.find("]")] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


async def _reply(send, status: int, message: str, code: str) -> None:
    kind = "authentication_error" if status == 401 else "invalid_request_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if status in (408, 413):
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
