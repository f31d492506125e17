"""Atomic checkpoints: learner state, RNG states and the runtime's state (data position, queued trajectories).

A checkpoint is one file written to a temporary name in the same directory, fsynced, then renamed over the
final name (and the directory fsynced), so a crash leaves either the old checkpoint or the new one, never a
torn file. A temporary file left by a crash is removed by the next save.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT_VERSION = 1


def rng_states() -> dict[str, Any]:
    """The state of every random generator a run uses (Python, NumPy, torch CPU and CUDA)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_states(state: dict[str, Any]) -> None:
    """Restore what ``rng_states`` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str | Path, learner_state: dict[str, Any], runtime_state: dict[str, Any]) -> Path:
    """Write a checkpoint atomically to ``path``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format_version": FORMAT_VERSION,
        "learner": learner_state,
        "runtime": runtime_state,
        "rng": rng_states(),
    }
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a process killed while writing
        stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)  # the rename itself survives a power loss
    return path


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some filesystems do not open directories; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(path: str | Path, restore_rng: bool = True) -> dict[str, Any]:
    """Read a checkpoint written by ``save_checkpoint``; by default also restores the RNG states."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    payload = torch.load(path, map_location="cpu", weights_only=False)
    if payload.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: checkpoint format {payload.get('format_version')!r}, expected {FORMAT_VERSION}"
        )
    if restore_rng:
        set_rng_states(payload["rng"])
    return payload
