"""Where a desktop runs: ``local`` (Xvfb + openbox + bubblewrap here) or ``docker`` (OSWorld's VM image)."""

from __future__ import annotations

from typing import Any

PROVIDERS = ("local", "docker")


def make_provider(name: str, **kwargs: Any) -> Any:
    """Build the provider called ``name`` with its keyword options."""
    if name == "local":
        from rz_agents.envs.osworld.providers.local import LocalProvider

        return LocalProvider(**kwargs)
    if name == "docker":
        from rz_agents.envs.osworld.providers.docker import DockerProvider

        return DockerProvider(**kwargs)
    raise ValueError(f"unknown OSWorld provider {name!r}; expected one of {PROVIDERS}")
