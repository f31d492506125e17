"""One way to say that something still works but is deprecated: a one-line warning in the log (what a user
of ``rz`` sees, once per message and process) and a ``DeprecationWarning`` (what code and tests can catch or
turn into errors)."""

from __future__ import annotations

import logging
import warnings

log = logging.getLogger("rz_agents")

_said: set[str] = set()


def warn_deprecated(message: str, stacklevel: int = 3) -> None:
    """Warn that ``message`` describes a deprecated use (one line; each message once per process)."""
    message = " ".join(message.split())  # one line, whatever the caller wrapped
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel)
    if message not in _said:
        _said.add(message)
        log.warning("deprecated: %s", message)
