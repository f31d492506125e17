"""The frozen base of a LoRA learner in a checkpoint: written once per run into the run directory, named by
its content hash, and referenced by each checkpoint (not copied into every checkpoint's folder).

A LoRA checkpoint must hold the base (a warm start may have changed it from what the config builds, and no
master rebuilds it), but the base does not change from step to step: writing it into each checkpoint's
folder made every checkpoint as large as the model (~7.5 GiB for Qwen3-4B) where the trained state is the
adapters and their AdamW state. Here a checkpoint's learner state names ``frozen_base/<hash>`` beside the
checkpoint file (the run directory) and the base's SHA-256. The folder is written
(torch.distributed.checkpoint, every rank its own shards) at the first checkpoint of each distinct base (the
run's first, and the first after a warm start changed it) and never again; later checkpoints reference it.
On resume the base is read from it and hashed again: a folder whose content changed is refused with one line
(a resumed run would not be the interrupted one).

The hash is over every frozen tensor's name, dtype, shape and bytes, whole (sharded ranks gather one tensor at
a time), so one base hashes alike for any number of ranks. It is computed once per distinct base: a learner
remembers it with the frozen tensors' version counters (any in-place change, a warm start's included, bumps
them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rz_agents.model.held_weights import digest

if TYPE_CHECKING:
    from rz_agents.trainer.learner import Learner

STORE = "frozen_base"  # the folder in the run directory (beside the checkpoint files)


def frozen_params(learner: Learner, remove_duplicate: bool = True) -> list[tuple[str, torch.Tensor]]:
    """(name, parameter) of each model parameter the learner does not train (LoRA's base, a frozen vision
    tower); ``remove_duplicate=False``: a tied one under each of its names."""
    trained = {id(p) for p in learner.params}
    named = learner.model.named_parameters(remove_duplicate=remove_duplicate)
    return [(n, p) for n, p in named if id(p) not in trained]


def frozen_names(learner: Learner) -> set[str]:
    """The state-dict names of the frozen parameters (both names of a tied one)."""
    return {n for n, _ in frozen_params(learner, remove_duplicate=False)}


def _versions(learner: Learner) -> tuple[int, ...]:
    return tuple(p._version for _, p in frozen_params(learner))


def base_hash(learner: Learner) -> str:
    """SHA-256 of the frozen tensors (names, dtypes, shapes, bytes of the whole tensors); with sharded ranks a
    collective (each tensor gathered in turn; every rank returns the same hash)."""
    return digest((name, learner.ranks.full(p.detach())) for name, p in frozen_params(learner))


def held_digest(learner: Learner, published: list[str]) -> str:
    """The SHA-256 (``model.held_weights.digest``) of the weights a partial publication of ``published``
    leaves out, as the engines hold them (the model's dtype, state-dict order): the claim an engine checks
    before it applies the publication. Computed once per distinct frozen base (kept with the frozen tensors'
    version counters, like the checkpoint's hash); with sharded ranks a collective when it is computed, and
    every rank takes the same path."""
    cached = getattr(learner, "_held_digest", None)
    versions = _versions(learner)
    fresh = cached is not None and cached[0] == versions
    if learner.ranks.world > 1:  # all cached or none (computing it gathers every held tensor)
        stale = learner.ranks.reduce_sum(torch.tensor([0.0 if fresh else 1.0]))
        fresh = fresh and float(stale[0]) == 0.0
    if fresh:
        return cached[1]
    sent = set(published)
    held = [n for n in learner.model.state_dict() if n not in sent]
    value = digest(learner.iter_weights(held))
    learner._held_digest = (versions, value)
    return value


def _cached(learner: Learner) -> dict[str, str] | None:
    cached = getattr(learner, "_frozen_base", None)
    if cached is not None and cached[0] == _versions(learner):
        return cached[1]
    return None


def _remember(learner: Learner, entry: dict[str, str]) -> None:
    learner._frozen_base = (_versions(learner), entry)


def save_frozen_base(learner: Learner, run_dir: str | Path, distributed: bool) -> dict[str, str] | None:
    """Make sure ``run_dir/frozen_base/<hash>`` holds the learner's frozen base (written now only if no
    checkpoint of this run wrote the same base before); returns the entry a checkpoint keeps (``dir``
    relative to ``run_dir``, ``path`` absolute, ``sha256``), None without frozen parameters."""
    import torch.distributed.checkpoint as dcp

    frozen = frozen_params(learner)
    if not frozen:
        return None
    entry = _cached(learner)
    if learner.ranks.world > 1:  # every rank takes one path (hashing is a collective): all cached or none
        stale = learner.ranks.reduce_sum(torch.tensor([0.0 if entry is not None else 1.0]))
        entry = entry if float(stale[0]) == 0.0 else None
    digest = entry["sha256"] if entry is not None else base_hash(learner)
    name = f"{STORE}/{digest[:16]}"
    folder = Path(run_dir) / name
    # (every rank checks before the collective write below: a rank cannot rename it before all have joined)
    if not (folder / ".metadata").is_file():
        staging = Path(run_dir) / STORE / f".{digest[:16]}.tmp"
        dcp.save(
            {f"frozen/{n}": p.detach() for n, p in frozen},
            storage_writer=dcp.FileSystemWriter(str(staging), sync_files=True),
            no_dist=not distributed,
        )
        if learner.ranks.rank == 0:
            os.replace(staging, folder)
    entry = {"dir": name, "path": str(folder.resolve()), "sha256": digest}
    _remember(learner, entry)
    return entry


@torch.no_grad()
def load_frozen_base(learner: Learner, run_dir: str | Path, entry: dict[str, str], distributed: bool) -> None:
    """Read the frozen base a checkpoint names (``entry``, from ``save_frozen_base``) into the learner's
    frozen parameters (every rank its shards) and check its hash: raise ValueError in one line if the folder
    is missing or its content is not the base the checkpoint was saved with."""
    import torch.distributed.checkpoint as dcp

    folder = next(
        (f for f in (Path(run_dir) / entry["dir"], Path(entry["path"])) if (f / ".metadata").is_file()), None
    )
    if folder is None:
        raise ValueError(
            f"the checkpoint's frozen base is missing: no {entry['dir']} in {run_dir} (nor {entry['path']})"
        )
    targets = {f"frozen/{n}": p.detach() for n, p in frozen_params(learner)}
    dcp.load(targets, storage_reader=dcp.FileSystemReader(str(folder)), no_dist=not distributed)
    got = base_hash(learner)
    if got != entry["sha256"]:
        raise ValueError(
            f"{folder}: the frozen base changed since the checkpoint was saved (sha256 {got[:16]}..., the "
            f"checkpoint recorded {entry['sha256'][:16]}...): restore that base or start a new run"
        )
    _remember(learner, entry)
