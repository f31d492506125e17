"""The configs shipped in the package (``rz_agents/configs/*.yaml``): ``rz train demo`` names one.

A config argument is a YAML file's path, or the name of a packaged config (``demo``,
``smollm2-gsm8k``, ...; ``.yaml`` optional). A path that exists wins over a name.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path

import yaml

from rz_agents.config_io import ConfigError


def packaged_configs() -> dict[str, Path]:
    """Name -> path of every packaged config, sorted by name."""
    folder = Path(str(resources.files("rz_agents") / "configs"))
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def resolve_config(arg: str) -> Path:
    """The YAML file ``arg`` names: an existing path, else a packaged config; ConfigError otherwise."""
    path = Path(arg)
    if path.is_file():
        return path
    packaged = packaged_configs()
    name = path.name[: -len(".yaml")] if path.name.endswith(".yaml") else path.name
    if str(path.parent) == "." and name in packaged:
        return packaged[name]
    close = difflib.get_close_matches(name, list(packaged), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ConfigError(
        f"{arg}: no such config file or packaged config ({hint}packaged: {', '.join(packaged)}; "
        "rz train --list-configs describes them)"
    )


def describe_packaged_configs() -> str:
    """One line per packaged config: its name and its ``description:``."""
    rows = []
    for name, path in packaged_configs().items():
        try:
            description = (yaml.safe_load(path.read_text()) or {}).get("description", "")
        except yaml.YAMLError:
            description = "(not valid YAML)"
        rows.append((name, description))
    width = max((len(n) for n, _ in rows), default=0)
    return "\n".join(f"{n:<{width}}  {d}" for n, d in rows)
