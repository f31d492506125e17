"""Atomic checkpoints: learner state, RNG states and the runtime's state (data position, queued trajectories).

A checkpoint is one file written to a temporary name in the same directory, fsynced, then renamed over the
final name (and the directory fsynced), so a crash leaves either the old checkpoint or the new one, never a
torn file. A temporary file left by a crash is removed by the next save.

The learner's tensors go into a folder beside the file (``<file>.learner-<tag>/``, written by
torch.distributed.checkpoint: each learner rank its own shards) when ``save_checkpoint`` is given a writer
instead of a state: the folder is written under a temporary name, fsynced and renamed first, and the file that
names it is written last, so a crash at any moment leaves the previous file and the folder it names intact
(a folder no file names is removed by the next save). ``load_checkpoint`` reads checkpoints of either kind,
and those written before the folder existed (format 1: the whole tensors in the file).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT_VERSION = 2  # 2: the learner's tensors may be in a folder beside the file
READABLE_VERSIONS = (1, 2)
LearnerWriter = Callable[[Path], dict[str, Any]]


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


def save_checkpoint(
    path: str | Path, learner_state: dict[str, Any] | LearnerWriter, runtime_state: dict[str, Any]
) -> Path:
    """Write a checkpoint atomically to ``path``; returns the path.

    ``learner_state``: the learner's state, kept in the file as it is, or a function that writes the learner's
    tensors into the empty folder it is given (``Learner.save_state``) and returns the rest, which the file
    keeps with the folder's name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a process killed while writing
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink(missing_ok=True)
    folder = None
    if callable(learner_state):
        folder = _write_learner_folder(path, learner_state)
        learner_state = folder[1]
    payload = {
        "format_version": FORMAT_VERSION,
        "learner": learner_state,
        "runtime": runtime_state,
        "rng": rng_states(),
    }
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
    if folder is not None:  # the previous checkpoints' folders: no file names them now
        for old in path.parent.glob(f"{path.name}.learner-*"):
            if old.is_dir() and old != folder[0]:
                shutil.rmtree(old, ignore_errors=True)
    return path


def _write_learner_folder(path: Path, write: LearnerWriter) -> tuple[Path, dict[str, Any]]:
    """``write`` into a temporary folder beside ``path``, every file and the folder fsynced, then renamed to
    its final name; returns (folder, the learner state naming it)."""
    tag = uuid.uuid4().hex[:12]
    staging = path.parent / f".{path.name}.learner-{tag}.tmp"  # (a stale one is removed like a file)
    final = path.parent / f"{path.name}.learner-{tag}"
    staging.mkdir()
    try:
        state = dict(write(staging))
        for file in staging.rglob("*"):  # the writer's files all on disk before the folder has its name
            if file.is_file():
                with open(file, "rb") as f:
                    os.fsync(f.fileno())
        _fsync_dir(staging)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _fsync_dir(path.parent)
    # The name beside the file first (a run directory moved as a whole), the absolute path second (a
    # checkpoint file copied elsewhere).
    state.update(tensors=final.name, tensors_path=str(final.resolve()))
    return final, state


def learner_folder(path: str | Path, learner_state: dict[str, Any]) -> Path | None:
    """The folder holding the learner's tensors of the checkpoint at ``path`` (None: they are in the file)."""
    name = learner_state.get("tensors")
    if name is None:
        return None
    for folder in (Path(path).parent / name, Path(learner_state.get("tensors_path", name))):
        if (folder / ".metadata").is_file():
            return folder
    raise FileNotFoundError(
        f"{path}: the learner's tensors are missing: no folder {name} with a .metadata file beside it"
    )


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
    """Read a checkpoint written by ``save_checkpoint``; by default also restores the RNG states.

    ``payload["learner_folder"]``: the folder of the learner's tensors (``learner_folder``), or None when the
    learner state in the file holds them itself."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    payload = torch.load(path, map_location="cpu", weights_only=False)
    if payload.get("format_version") not in READABLE_VERSIONS:
        raise ValueError(
            f"{path}: checkpoint format {payload.get('format_version')!r}, expected one of "
            f"{READABLE_VERSIONS}"
        )
    learner = payload.get("learner")
    payload["learner_folder"] = learner_folder(path, learner) if isinstance(learner, dict) else None
    if restore_rng:
        set_rng_states(payload["rng"])
    return payload
