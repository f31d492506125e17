"""The invariant of a rollout checkpoint: it is a consistent cut, every started group in exactly one place.

Each group index in ``range(groups_started)`` is, in a checkpoint, exactly one of

- trained: its batch's learner step is in the checkpoint (``groups_trained`` of them);
- queued: finished, its trajectories saved (``queued``; a batch the learner took but has not trained
  yet is saved here too, at the front);
- in flight: relaunched on resume with the same index, task and seeds (``in_flight``);
- dropped: every episode failed, a token went past the lag bound, or its rewards were all equal and
  another group replaced it (``groups_dropped_failed`` + ``groups_dropped_stale`` +
  ``groups_dropped_uniform``, indices in ``dropped_groups``).

A resume from a state that breaks this would wait for groups that can never come (admission counts them
as live) or train a group twice, so the state is checked when it is saved and when it is loaded.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

STATE_FORMAT = 2  # 1: before groups_trained / dropped_groups (steps_done could lag the history)


class InconsistentCheckpoint(ValueError):
    """A checkpoint's counters and its queued / in-flight / trained groups disagree."""


def check_consistent_cut(
    state: dict[str, Any], steps: int, trained_groups: list[list[int]] | None = None, where: str = ""
) -> None:
    """Raise InconsistentCheckpoint (naming the counts) unless ``state`` is a consistent cut.

    ``state``: ``RolloutController.state_dict()``; ``steps``: learner steps in the checkpoint;
    ``trained_groups``: the group indices of each of those steps, when the history records them.
    """
    c = state["counters"]
    started, trained = int(c["groups_started"]), int(c["groups_trained"])
    failed, stale = int(c["groups_dropped_failed"]), int(c["groups_dropped_stale"])
    uniform = int(c.get("groups_dropped_uniform", 0))  # replaced uniform-reward groups (rollout.oversample)
    queued = [int(g["index"]) for g in state["queued"]]
    in_flight = [int(i) for i, _ in state["in_flight"]]
    problems = []
    if int(state["steps_done"]) != steps:
        problems.append(f"steps_done {state['steps_done']} != {steps} learner steps in the history")
    total = trained + len(queued) + len(in_flight) + failed + stale + uniform
    if total != started:
        problems.append(
            f"groups_started {started} != trained {trained} + queued {len(queued)} + in flight "
            f"{len(in_flight)} + dropped {failed} failed + {stale} stale"
            + (f" + {uniform} uniform" if uniform else "")
            + f" (= {total})"
        )
    position = int(state["tasks"]["position"])
    if position != started:
        problems.append(f"task position {position} != groups_started {started}")
    places = {"queued": queued, "in flight": in_flight}
    dropped = state.get("dropped_groups")
    if dropped is not None:
        if len(dropped) != failed + stale + uniform:
            problems.append(
                f"{len(dropped)} dropped group indices != dropped {failed} + {stale}"
                + (f" + {uniform} uniform" if uniform else "")
            )
        places["dropped"] = [int(i) for i in dropped]
    if trained_groups is not None:
        flat = [int(i) for batch in trained_groups for i in batch]
        if len(trained_groups) != steps:
            problems.append(f"{len(trained_groups)} trained batches recorded != {steps} steps")
        if len(flat) != trained:
            problems.append(f"{len(flat)} trained group indices recorded != groups_trained {trained}")
        places["trained"] = flat
    where_of: dict[int, list[str]] = {}
    for place, indices in places.items():
        for i in indices:
            where_of.setdefault(i, []).append(place)
    repeated = {i: p for i, p in where_of.items() if len(p) > 1}
    if repeated:
        shown = ", ".join(f"{i} ({' + '.join(p)})" for i, p in sorted(repeated.items())[:8])
        problems.append(f"{len(repeated)} group indices are in more than one place: {shown}")
    outside = sorted(i for i in where_of if not 0 <= i < started)
    if outside:
        problems.append(f"group indices outside range(groups_started={started}): {outside[:8]}")
    if not problems and len(places) == 4 and len(where_of) != started:  # every place is known: a partition
        missing = sorted(set(range(started)) - set(where_of))
        problems.append(f"{len(missing)} started groups are in no place: {missing[:8]}")
    if problems:
        prefix = f"inconsistent checkpoint{f' ({where})' if where else ''}: "
        raise InconsistentCheckpoint(prefix + "; ".join(problems))


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
