"""The rollout's accounting: where every started group is, and the one check that says it adds up.

Each group index in ``range(groups_started)`` is exactly one of

- in flight: its episodes are running, or (after a resume) it waits to run again with the same index,
  task and seeds (``in_flight``, ``relaunch``);
- queued: finished, its trajectories in the ``TrajectoryQueue``;
- taken: in a batch ``next_batch`` returned whose learner step has not finished (``taken``; a checkpoint
  saves these as queued, in front);
- trained: its batch's learner step finished (``groups_trained`` of them; the run's history says which);
- dropped: every episode failed, a token went past the lag bound, or its rewards were all equal and
  another group replaced it (``groups_dropped_failed`` + ``groups_dropped_stale`` +
  ``groups_dropped_uniform``, indices in ``dropped_indices``).

A resume from a state that breaks this would wait for groups that can never come (admission counts them
as live) or train a group twice, so ``GroupLedger.check`` runs when a state is saved and when it is loaded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from rz_agents.rollout.trajectory_queue import Group, TrajectoryQueue
from rz_agents.trajectory import Trajectory

STATE_FORMAT = 2  # 1: before groups_trained / dropped_groups (steps_done could lag the history)

# The counters' names, in the order a saved state and the metrics list them.
COUNTERS = (
    "groups_started",
    "groups_finished",
    "groups_dropped_failed",
    "groups_dropped_stale",
    "groups_dropped_uniform",
    "groups_trained",
    "episodes_started",
    "episodes_finished",
    "episodes_failed",
    "episodes_rerun",
    "episodes_lost",
    "infra_failed",
)


class InconsistentCheckpoint(ValueError):
    """A checkpoint's counters and its queued / in-flight / trained groups disagree."""


@dataclass(eq=False)  # holds a queue: two ledgers are the same only if they are one
class GroupLedger:
    """Every started group's place, the counters, and the learner steps done (the rollout's accounting).

    The controller moves groups between places only through the transition methods; ``state_dict`` is a
    consistent cut of it and ``check`` verifies one.
    """

    queue: TrajectoryQueue = field(default_factory=TrajectoryQueue)  # the queued groups
    groups_started: int = 0
    groups_finished: int = 0  # ever queued (a queued group later dropped as stale stays counted)
    groups_dropped_failed: int = 0
    groups_dropped_stale: int = 0
    groups_dropped_uniform: int = 0  # all rewards equal, replaced by another group (rollout.oversample)
    groups_trained: int = 0
    episodes_started: int = 0
    episodes_finished: int = 0
    episodes_failed: int = 0
    episodes_rerun: int = 0  # runs started again after their engine replica or env worker died
    episodes_lost: int = 0  # dropped after that happened more than max_episode_reruns times
    # episodes masked as lost to infrastructure (InfraFailure after its reruns; episodes_lost among them):
    # out of their group's baseline and the loss, never scored. Also counted in episodes_failed.
    infra_failed: int = 0
    steps_done: int = 0  # finished learner steps
    in_flight: dict[int, Any] = field(default_factory=dict)  # group index -> its task
    # Groups in flight at the checkpoint this run resumed from: started again first (same index, task and
    # seeds), outside admission (they were admitted before) and still counted in groups_started.
    relaunch: list[tuple[int, Any]] = field(default_factory=list)
    taken: deque[list[Group]] = field(default_factory=deque)  # returned by next_batch, not yet trained
    dropped_indices: list[int] = field(default_factory=list)
    # False after resuming a format-1 state, which did not record them: the counts are still checked.
    dropped_indices_known: bool = True

    # ---- transitions ------------------------------------------------------------------------------
    def start(self, task: Any) -> int:
        """Admit a new group for ``task``: it takes the next index and is in flight. Returns the index."""
        index = self.groups_started
        self.groups_started += 1
        self.in_flight[index] = task
        return index

    def relaunch_next(self) -> tuple[int, Any] | None:
        """The next group to run again after a resume, now in flight again; None when none is left."""
        if not self.relaunch:
            return None
        index, task = self.relaunch.pop(0)
        self.in_flight[index] = task
        return index, task

    def finish(self, index: int, trajectories: list[Trajectory]) -> None:
        """A group's episodes ended with these trajectories: in flight -> queued."""
        self.in_flight.pop(index, None)
        self.queue.put(Group(index, trajectories))
        self.groups_finished += 1

    def drop_failed(self, index: int) -> None:
        """Every episode of the group failed: in flight -> dropped."""
        self.in_flight.pop(index, None)
        self.groups_dropped_failed += 1
        self._record_dropped([index])

    def drop_uniform(self, index: int) -> None:
        """The group finished with all rewards equal and another replaces it: in flight -> dropped."""
        self.in_flight.pop(index, None)
        self.groups_dropped_uniform += 1
        self._record_dropped([index])

    def drop_stale(self, groups: list[Group]) -> None:
        """The queue removed these groups (a token past the lag bound): queued -> dropped."""
        self.groups_dropped_stale += len(groups)
        self._record_dropped([g.index for g in groups])

    def take(self, groups: list[Group]) -> None:
        """The queue handed these groups to the learner as one batch: queued -> taken."""
        self.taken.append(groups)

    def step_done(self) -> None:
        """The learner finished a step (applied or skipped) on the oldest taken batch: taken -> trained."""
        if not self.taken:
            raise RuntimeError("step_done() without a batch taken by next_batch()")
        self.groups_trained += len(self.taken.popleft())
        self.steps_done += 1

    def _record_dropped(self, indices: list[int]) -> None:
        if self.dropped_indices_known:
            self.dropped_indices.extend(indices)

    # ---- derived figures --------------------------------------------------------------------------
    @property
    def dropped(self) -> int:
        """Groups dropped so far, for any reason."""
        return self.groups_dropped_failed + self.groups_dropped_stale + self.groups_dropped_uniform

    @property
    def live(self) -> int:
        """Groups started and not dropped (in flight, queued, taken or trained): what admission counts."""
        return self.groups_started - self.dropped

    @property
    def pending(self) -> bool:
        """Whether a group is in flight, waiting for relaunch, or taken and not yet trained."""
        return bool(self.in_flight or self.relaunch or self.taken)

    @property
    def counters(self) -> Counters:
        """The counters by their metric names (``groups_started``, ...), read and written through."""
        return Counters(self)

    # ---- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """steps_done, counters, queued groups (taken batches first), groups in flight, dropped indices."""
        taken = [g for batch in self.taken for g in batch]
        in_flight = list(self.in_flight.items()) + list(self.relaunch)
        return {
            "steps_done": self.steps_done,
            "counters": dict(self.counters),
            "queued": [
                {"index": g.index, "trajectories": [t.to_dict() for t in g.trajectories]}
                for g in taken + self.queue.snapshot()
            ],
            "in_flight": sorted(in_flight, key=lambda x: x[0]),
            "dropped_groups": list(self.dropped_indices) if self.dropped_indices_known else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state of the current format into this (new) ledger: its queued groups are queued,
        its groups in flight wait for relaunch. Counters it lacks stay 0. Does not check it (``check``)."""
        if state.get("format", 1) != STATE_FORMAT:
            raise ValueError(
                f"controller state of format {state.get('format', 1)}, expected {STATE_FORMAT} "
                "(rz_agents.rollout.checkpoint_cut.upgrade_state converts format 1)"
            )
        unknown = sorted(set(state["counters"]) - set(COUNTERS))
        if unknown:
            raise ValueError(f"controller state has unknown counters {unknown}; known: {', '.join(COUNTERS)}")
        self.steps_done = int(state["steps_done"])
        self.counters.update(state["counters"])
        for g in state["queued"]:
            self.queue.put(Group(g["index"], [Trajectory.from_dict(d) for d in g["trajectories"]]))
        self.relaunch = [(int(i), task) for i, task in state["in_flight"]]
        dropped = state.get("dropped_groups")
        self.dropped_indices_known = dropped is not None
        self.dropped_indices = [] if dropped is None else list(dropped)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> GroupLedger:
        """A new ledger holding ``state`` (see ``load_state_dict``)."""
        ledger = cls()
        ledger.load_state_dict(state)
        return ledger

    # ---- the invariant ----------------------------------------------------------------------------
    def check(
        self,
        steps: int,
        trained_groups: list[list[int]] | None = None,
        task_position: int | None = None,
        where: str = "",
    ) -> None:
        """Raise InconsistentCheckpoint (naming the counts) unless every started group is in exactly one
        place.

        ``steps``: learner steps in the checkpoint (its history); ``trained_groups``: the group indices of
        each of those steps, when the history records them; ``task_position``: the task source's position
        (one task per started group). The counts must add up, and no index may be in two known places or
        outside ``range(groups_started)``. With the dropped indices and ``trained_groups`` known, that makes
        the places a partition: their sizes sum to groups_started, so distinct indices in range cover all.
        """
        problems = self._count_problems(steps, trained_groups, task_position)
        problems += _place_problems(self._places(trained_groups), self.groups_started)
        if problems:
            prefix = f"inconsistent checkpoint{f' ({where})' if where else ''}: "
            raise InconsistentCheckpoint(prefix + "; ".join(problems))

    def _places(self, trained_groups: list[list[int]] | None) -> dict[str, list[int]]:
        """The group indices of each known place (taken batches count as queued, as a checkpoint saves
        them)."""
        places = {
            "queued": [g.index for batch in self.taken for g in batch]
            + [g.index for g in self.queue.snapshot()],
            "in flight": list(self.in_flight) + [i for i, _ in self.relaunch],
        }
        if self.dropped_indices_known:
            places["dropped"] = [int(i) for i in self.dropped_indices]
        if trained_groups is not None:
            places["trained"] = [int(i) for batch in trained_groups for i in batch]
        return places

    def _count_problems(
        self, steps: int, trained_groups: list[list[int]] | None, task_position: int | None
    ) -> list[str]:
        """What in the counts disagrees: steps, started vs the places, task position, recorded indices."""
        problems = []
        started, trained, uniform = self.groups_started, self.groups_trained, self.groups_dropped_uniform
        failed, stale = self.groups_dropped_failed, self.groups_dropped_stale
        with_uniform = f" + {uniform} uniform" if uniform else ""
        if self.steps_done != steps:
            problems.append(f"steps_done {self.steps_done} != {steps} learner steps in the history")
        queued = sum(len(batch) for batch in self.taken) + len(self.queue)
        in_flight = len(self.in_flight) + len(self.relaunch)
        total = trained + queued + in_flight + self.dropped
        if total != started:
            problems.append(
                f"groups_started {started} != trained {trained} + queued {queued} + in flight {in_flight} + "
                f"dropped {failed} failed + {stale} stale{with_uniform} (= {total})"
            )
        if task_position is not None and task_position != started:
            problems.append(f"task position {task_position} != groups_started {started}")
        if self.dropped_indices_known and len(self.dropped_indices) != self.dropped:
            problems.append(
                f"{len(self.dropped_indices)} dropped group indices != dropped {failed} + "
                f"{stale}{with_uniform}"
            )
        if trained_groups is not None:
            if len(trained_groups) != steps:
                problems.append(f"{len(trained_groups)} trained batches recorded != {steps} steps")
            flat = sum(len(batch) for batch in trained_groups)
            if flat != trained:
                problems.append(f"{flat} trained group indices recorded != groups_trained {trained}")
        return problems


def _place_problems(places: dict[str, list[int]], started: int) -> list[str]:
    """Group indices in more than one place or outside ``range(started)``."""
    where_of: dict[int, list[str]] = {}
    for place, indices in places.items():
        for i in indices:
            where_of.setdefault(i, []).append(place)
    problems = []
    repeated = {i: p for i, p in where_of.items() if len(p) > 1}
    if repeated:
        shown = ", ".join(f"{i} ({' + '.join(p)})" for i, p in sorted(repeated.items())[:8])
        problems.append(f"{len(repeated)} group indices are in more than one place: {shown}")
    outside = sorted(i for i in where_of if not 0 <= i < started)
    if outside:
        problems.append(f"group indices outside range(groups_started={started}): {outside[:8]}")
    return problems


class Counters(MutableMapping[str, int]):
    """A ledger's counters as a mapping of the names in ``COUNTERS`` (what metrics and checkpoints show)."""

    def __init__(self, ledger: GroupLedger) -> None:
        self._ledger = ledger

    def __getitem__(self, name: str) -> int:
        if name not in COUNTERS:
            raise KeyError(name)
        return getattr(self._ledger, name)

    def __setitem__(self, name: str, value: int) -> None:
        if name not in COUNTERS:
            raise KeyError(f"{name!r} is not a rollout counter; known: {', '.join(COUNTERS)}")
        setattr(self._ledger, name, value)

    def __delitem__(self, name: str) -> None:
        raise TypeError("rollout counters cannot be removed")

    def __iter__(self) -> Iterator[str]:
        return iter(COUNTERS)

    def __len__(self) -> int:
        return len(COUNTERS)

    def __repr__(self) -> str:
        return repr(dict(self))
