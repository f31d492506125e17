"""A checkpoint directory's safetensors files, read by tensor name: the bottom of checkpoint reading.

Family modules (qwen3_5, deepseek_v4) read their tensors through this module, not through hf_files
(which dispatches to them by config), so the import graph keeps one direction.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded (missing file, missing/unexpected tensors)."""


def _weight_files(ckpt: Path) -> list[Path]:
    if (ckpt / INDEX_NAME).is_file():
        weight_map = json.loads((ckpt / INDEX_NAME).read_text())["weight_map"]
        return [ckpt / f for f in sorted(set(weight_map.values()))]
    if (ckpt / SINGLE_NAME).is_file():
        return [ckpt / SINGLE_NAME]
    raise CheckpointError(f"{ckpt}: no {SINGLE_NAME} or {INDEX_NAME}")


def load_state(ckpt_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory by name."""
    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    for f in _weight_files(Path(ckpt_dir)):
        with safe_open(str(f), framework="pt") as fh:
            for k in fh.keys():
                state[k] = fh.get_tensor(k)
    return state


class LazyState(Mapping):
    """A checkpoint directory's tensors by name, each read from its file when it is looked up (and cast to
    ``dtype``, as ``load_hf_checkpoint`` casts it): a consumer that takes one tensor at a time (a sharded
    learner cutting its shard of each) never holds the whole state."""

    def __init__(self, ckpt_dir: str | os.PathLike, dtype: torch.dtype | None = None) -> None:
        from safetensors import safe_open

        self.ckpt_dir, self.dtype = Path(ckpt_dir), dtype
        self._file_of: dict[str, Path] = {}
        for f in _weight_files(self.ckpt_dir):
            with safe_open(str(f), framework="pt") as fh:
                self._file_of.update({k: f for k in fh.keys()})

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._file_of:
            raise CheckpointError(f"{self.ckpt_dir}: no tensor {name}")
        from safetensors import safe_open

        with safe_open(str(self._file_of[name]), framework="pt") as fh:
            tensor = fh.get_tensor(name)
        return tensor if self.dtype is None else tensor.to(self.dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self._file_of)

    def __len__(self) -> int:
        return len(self._file_of)


def copy_by_name(
    params: dict[str, torch.Tensor],
    state: Mapping[str, torch.Tensor],
    expected: set[str],
    ckpt_dir: str | os.PathLike,
    model_type: str,
) -> None:
    """Copy each checkpoint tensor of ``state`` into the model tensor of the same name in ``params`` (cast to
    its dtype); the names must be exactly ``expected`` and every shape must match, else CheckpointError
    naming the first missing / unexpected tensors or the mismatched shape."""
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise CheckpointError(
            f"{ckpt_dir}: tensors do not match a {model_type} model: "
            f"missing {sorted(missing)[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {sorted(unexpected)[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    with torch.no_grad():
        for name, t in state.items():
            if params[name].shape != t.shape:
                raise CheckpointError(
                    f"{ckpt_dir}: {name} has shape {tuple(t.shape)}, expected {tuple(params[name].shape)}"
                )
            params[name].copy_(t.to(params[name].dtype))
