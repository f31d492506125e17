"""Who may call an ``rz serve`` app and how much one request may ask: keys, hosts, origins, caps, timeouts.

The defaults are the safe ones for a server on 127.0.0.1 that an agent under training talks to: no RL
control routes, session token records not readable over HTTP, a browser's cross-site request refused, one
request's body and sequence count capped.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
API_KEY_ENV = "RZ_API_KEY"  # comma-separated keys
CONTROL_KEY_ENV = "RZ_CONTROL_KEY"


@dataclass(frozen=True)
class ServeOptions:
    """Access and limits of one app (``create_app``).

    Args:
        host: the address the server binds (its own name is an allowed Host).
        api_keys: Bearer keys accepted on every route but the control ones (empty: no key needed). Each key
            is its own owner: sessions a client names live in its key's namespace.
        control_key: the Bearer key of the RL control routes (they are mounted only with ``control``).
        allowed_hosts: Host header names served (besides ``host``); None: loopback names when ``host`` is
            loopback, any otherwise. "*" allows any.
        allowed_origins: browser Origins allowed (e.g. "http://localhost:3000"); a request with another
            Origin, unless it is the server's own, is refused (403).
        max_body_bytes: the largest request body (413 beyond).
        body_timeout_s: time to receive a whole body (408 after).
        header_timeout_s: time for a new connection to send its request head (closed after).
        idle_timeout_s: a keep-alive connection with no request is closed after this long.
        max_request_sequences: prompts x n of one request (400 beyond).
        session_records: ``GET /v1/sessions/ID`` (a session's tokens, for its owner) is mounted.
        strict_fields: unknown request fields are refused (400) instead of ignored with a warning.
    """

    host: str = "127.0.0.1"
    api_keys: tuple[str, ...] = ()
    control_key: str | None = None
    allowed_hosts: tuple[str, ...] | None = None
    allowed_origins: tuple[str, ...] = ()
    max_body_bytes: int = 8 << 20
    body_timeout_s: float = 30.0
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 5.0
    max_request_sequences: int = 64
    session_records: bool = False
    strict_fields: bool = False

    def __post_init__(self) -> None:
        if any(not k for k in self.api_keys):
            raise ValueError("an API key must not be empty")
        if self.control_key is not None and (not self.control_key or self.control_key in self.api_keys):
            raise ValueError("the control key must be non-empty and differ from every API key")
        for name in ("max_body_bytes", "max_request_sequences"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("body_timeout_s", "header_timeout_s", "idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    @property
    def hosts(self) -> frozenset[str] | None:
        """Host names served (lowercase, no port); None: any."""
        if self.allowed_hosts is not None:
            if "*" in self.allowed_hosts:
                return None
            return frozenset(h.lower().strip("[]") for h in (*self.allowed_hosts, self.host))
        if is_loopback(self.host):
            return frozenset(LOOPBACK_NAMES)
        return None

    def owner(self, key: str | None) -> str:
        """The namespace of the sessions a client with ``key`` names ("" without keys)."""
        if not self.api_keys or key is None:
            return ""
        return hashlib.sha256(key.encode()).hexdigest()[:16]


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def keys_from_env(value: str | None) -> tuple[str, ...]:
    """Keys from an environment variable's comma-separated value."""
    return tuple(k.strip() for k in (value or "").split(",") if k.strip())


def warn_if_exposed(options: ServeOptions) -> bool:
    """Log a warning when the server binds beyond loopback with no API key (True then)."""
    if is_loopback(options.host) or options.api_keys:
        return False
    log.warning(
        "rz serve binds %s without an API key: anyone who can reach this address can use the model "
        "(set --api-key or %s)",
        options.host,
        API_KEY_ENV,
    )
    return True
