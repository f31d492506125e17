"""Test helpers: a learner's whole state in memory (gathered tensors), to compare two learners bit for bit and
to write the checkpoints of the format before folders (format 1 held exactly this dict in the file).

The library saves and loads only through ``Learner.save_state`` / ``load_state`` (folders); it still reads
a whole-tensor state with ``load_state(state, None)`` (deprecated, for old checkpoints), which
``restore_whole_state`` uses to put a learner back into a remembered state.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from rz_agents.trainer.learner import Learner


def whole_state(learner: Learner) -> dict[str, Any]:
    """Model, fp32 masters, AdamW state (whole tensors; with several ranks a collective) and the counters."""
    masters = learner.master_weights.state()  # whole fp32 tensors (sharded: the shards gathered)
    optimizer = learner.optimizer.state_dict()
    if learner.ranks.world > 1:  # (the per-parameter dicts are the optimizer's own: build new ones)
        optimizer["state"] = {
            index: {k: learner.ranks.full(v) if isinstance(v, torch.Tensor) else v for k, v in per.items()}
            for index, per in optimizer["state"].items()
        }
    return {
        "model": learner.weights() if learner.ranks.world > 1 else learner.model.state_dict(),
        "masters": masters,
        "optimizer": optimizer,
        **learner.counters(),
    }


def restore_whole_state(learner: Learner, state: dict[str, Any]) -> None:
    """``learner.load_state(state, None)`` without its deprecation warning (the state is not a user's old
    checkpoint but one ``whole_state`` took in the test)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        learner.load_state(state, None)
