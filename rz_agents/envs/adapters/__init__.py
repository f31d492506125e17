"""Adapters that run envs of other ecosystems as rz_agents multi-turn envs.

``env.id: verifiers:NAME`` runs a verifiers taskset (``rz_agents.envs.adapters.verifiers_env``);
``env.id: openenv:URL`` plays an OpenEnv environment server (``rz_agents.envs.adapters.openenv_env``).
``resolve_adapter`` is what ``rz_agents.envs.resolve.resolve_env`` asks first; each adapter checks at
config load what it can (package installed, name known, server up) and fails with one line.
"""

from __future__ import annotations

import importlib
from typing import Any

# scheme -> module whose ``resolve(env_id, rest)`` returns an EnvTarget
SCHEMES: dict[str, str] = {
    "verifiers": "rz_agents.envs.adapters.verifiers_env",
    "openenv": "rz_agents.envs.adapters.openenv_env",
}


def resolve_adapter(env_id: str) -> Any:
    """The EnvTarget of an adapter id (``verifiers:NAME``, ``openenv:URL``), or None for any other id."""
    scheme, sep, rest = env_id.partition(":")
    if not sep or scheme not in SCHEMES:
        return None
    if not rest.strip():
        what = "a taskset name" if scheme == "verifiers" else "the server's URL"
        raise ValueError(f"env.id {env_id!r}: {scheme}: needs {what} after the colon")
    return importlib.import_module(SCHEMES[scheme]).resolve(env_id, rest.strip())
