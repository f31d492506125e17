"""What ``rz serve`` / ``rz eval`` were pointed at: a run directory, a run's ``final_model``, or neither.

A training run writes ``RUN/config.yaml`` (the config it ran with: its model shape and ``tokenizer:``) and
``RUN/final_model`` (the trained weights as an HF directory; a byte tokenizer writes no tokenizer.json).
Serving or evaluating the weights needs both, so either path finds the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMS = (
    "a run directory (RUN: config.yaml + final_model/), a run's RUN/final_model, a training config YAML, "
    "an HF checkpoint directory (config.json + tokenizer.json) or a packaged name"
)


@dataclass(frozen=True)
class RunTarget:
    """A run's config and the checkpoint to load into it (None: the run has no final_model yet)."""

    config: Path
    checkpoint: Path | None


class NotARun(ValueError):
    """A directory that is neither a run, a run's checkpoint, nor a checkpoint with its own tokenizer."""


def resolve_run_target(target: str) -> RunTarget | None:
    """The run ``target`` names (a run directory, or a checkpoint directory inside one), or None when
    ``target`` is something else the caller handles (a YAML file, a packaged name, an HF checkpoint
    directory with its own tokenizer.json). Raises NotARun, one line naming the forms that work, for a
    directory that is none of these."""
    path = Path(target)
    if not path.is_dir():
        return None
    if (path / "config.yaml").is_file():
        final = path / "final_model"
        return RunTarget(path / "config.yaml", final if (final / "config.json").is_file() else None)
    if (path / "config.json").is_file():
        if (path.parent / "config.yaml").is_file():  # a run's final_model (or a checkpoint beside it)
            return RunTarget(path.parent / "config.yaml", path)
        if (path / "tokenizer.json").is_file():
            return None  # a checkpoint that brings its own tokenizer
        raise NotARun(
            f"{target}: an HF checkpoint without tokenizer.json and no config.yaml beside it to say which "
            f"tokenizer it was trained with; pass its training config (CONFIG model.checkpoint={target}). "
            f"Works: {FORMS}"
        )
    raise NotARun(f"{target}: no config.yaml or config.json in this directory. Works: {FORMS}")


def default_checkpoint(config: str) -> Path | None:
    """The ``final_model`` beside a run's ``config.yaml`` (what ``rz eval RUN/config.yaml`` evaluates)."""
    path = Path(config)
    final = path.parent / "final_model"
    if path.name == "config.yaml" and (final / "config.json").is_file():
        return final
    return None


PATH_SUFFIXES = (".jsonl", ".json", ".parquet", ".yaml", ".yml", ".csv", ".txt", ".safetensors")


def anchor_paths(value: Any, base: Path) -> Any:
    """``value`` (a config as plain data) with every relative path to an existing file or directory under
    ``base`` made absolute, so that a run's config.yaml works from any directory (``rz eval RUN/config.yaml``
    from elsewhere). A path is a string with a ``/`` or a data-file suffix; a packaged name (``local``,
    ``math_numeric_3k``) has neither and stays as written."""
    if isinstance(value, dict):
        return {k: anchor_paths(v, base) for k, v in value.items()}
    if isinstance(value, list):
        return [anchor_paths(v, base) for v in value]
    if isinstance(value, str) and value and not Path(value).is_absolute() and "://" not in value:
        if ("/" in value or value.endswith(PATH_SUFFIXES)) and (base / value).exists():
            return str((base / value).resolve())
    return value
