"""A saved rollout state (``RolloutController.state_dict``): its consistent-cut check and its upgrade.

The invariant (every started group trained, queued, in flight or dropped, exactly once) is
``GroupLedger.check`` (group_ledger.py); ``check_consistent_cut`` applies it to a state as saved.
"""

from __future__ import annotations

import logging
from typing import Any

from rz_agents.rollout.group_ledger import STATE_FORMAT, GroupLedger, InconsistentCheckpoint

__all__ = ["STATE_FORMAT", "InconsistentCheckpoint", "check_consistent_cut", "upgrade_state"]

log = logging.getLogger(__name__)


def check_consistent_cut(
    state: dict[str, Any], steps: int, trained_groups: list[list[int]] | None = None, where: str = ""
) -> None:
    """Raise InconsistentCheckpoint (naming the counts) unless ``state`` is a consistent cut.

    ``state``: ``RolloutController.state_dict()`` (current format); ``steps``: learner steps in the
    checkpoint; ``trained_groups``: the group indices of each of those steps, when the history records them.
    """
    ledger = GroupLedger.from_state(state)
    ledger.check(steps, trained_groups, task_position=int(state["tasks"]["position"]), where=where)


def upgrade_state(state: dict[str, Any], steps: int, groups_per_batch: int) -> dict[str, Any]:
    """A controller state of format 1 in the current format (``steps``: learner steps in its history).

    Format 1 checkpoints were written after a learner step but before the controller counted it, so their
    ``steps_done`` is one less than the history (and, after resumes, less still: the admission window
    shrank by one batch per resume until nothing was admitted). Every format-1 step trained exactly
    ``groups_per_batch`` groups and no batch was ever taken ahead at checkpoint time.
    """
    if state.get("format", 1) >= STATE_FORMAT:
        return state
    state = dict(state, counters=dict(state["counters"]), format=STATE_FORMAT)
    if int(state["steps_done"]) != steps:
        log.warning(
            "checkpoint of format 1: steps_done %s corrected to %d (the learner steps in its history)",
            state["steps_done"],
            steps,
        )
    state["steps_done"] = steps
    state["counters"]["groups_trained"] = steps * groups_per_batch
    state["dropped_groups"] = None  # not recorded by format 1
    return state
