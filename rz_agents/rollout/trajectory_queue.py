"""Finished groups waiting for the learner; stale groups are dropped (and counted) when a batch is taken."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rz_agents.trajectory import Trajectory


@dataclass
class Group:
    """The G trajectories of one prompt (fewer if some episodes failed)."""

    index: int
    trajectories: list[Trajectory]

    def oldest_version(self) -> int:
        """The oldest policy version of any sampled token in the group."""
        return min(v for t in self.trajectories if (v := t.oldest_version()) is not None)


class TrajectoryQueue:
    """FIFO of finished groups. ``take`` waits until it can return ``n`` groups within the lag bound."""

    def __init__(self) -> None:
        self._groups: deque[Group] = deque()
        self._changed = asyncio.Event()
        self.dropped_stale = 0  # groups dropped because a token was older than max_lag
        self.closed = False

    def __len__(self) -> int:
        return len(self._groups)

    def put(self, group: Group) -> None:
        """Add a finished group."""
        self._groups.append(group)
        self._changed.set()

    def drop_stale(self, version: int, max_lag: int) -> list[Group]:
        """Remove groups with a token older than ``version - max_lag``; returns them."""
        dropped = [g for g in self._groups if version - g.oldest_version() > max_lag]
        if dropped:
            self._groups = deque(g for g in self._groups if version - g.oldest_version() <= max_lag)
            self.dropped_stale += len(dropped)
        return dropped

    def wake(self) -> None:
        """Wake a waiting ``take`` so that it returns early (with [] ) once ``closed`` is set."""
        self.closed = True
        self._changed.set()

    def notify(self) -> None:
        """Wake a waiting ``take`` so that it runs its ``check`` again (something it depends on changed)."""
        self._changed.set()

    async def take(
        self,
        n: int,
        version: int,
        max_lag: int,
        on_drop: Callable[[list[Group]], None] | None = None,
        check: Callable[[], None] | None = None,
        oldest_first: bool = False,
        wait: Callable[[], bool] | None = None,
    ) -> list[Group]:
        """Wait for ``n`` groups whose every token has lag <= max_lag at ``version``; first finished first
        (``oldest_first``: the groups with the oldest tokens first, finish order among equals).

        ``on_drop`` receives the groups dropped as stale. ``check`` runs before every wait and may raise
        (the caller's way to say that no group can ever arrive). ``wait``: while it returns True the take
        waits even with ``n`` groups queued (pacing: a group still in flight must be in the next batch).
        Returns [] if the queue is closed (``wake``) while waiting.
        """
        while not self.closed:
            dropped = self.drop_stale(version, max_lag)
            if dropped and on_drop is not None:
                on_drop(dropped)
            if len(self._groups) >= n and (wait is None or not wait()):
                if not oldest_first:
                    return [self._groups.popleft() for _ in range(n)]
                order = sorted(range(len(self._groups)), key=lambda i: (self._groups[i].oldest_version(), i))
                chosen = set(order[:n])
                taken = [g for i, g in enumerate(self._groups) if i in chosen]
                self._groups = deque(g for i, g in enumerate(self._groups) if i not in chosen)
                return taken
            if check is not None:
                check()
            self._changed.clear()
            await self._changed.wait()
        return []

    def snapshot(self) -> list[Group]:
        """The queued groups, in order (for checkpoints)."""
        return list(self._groups)
