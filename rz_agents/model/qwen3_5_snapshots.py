"""Which cache pages of a hybrid model hold a delta-rule state snapshot (model/qwen3_5_cache.py).

Snapshots are a cache over the pages, not part of them: there are fewer slots than pages, a page holds at
most one, and a forward that needs the state after some chunk of a sequence takes the latest snapshot at or
before it in the sequence's pages and recomputes the chunks after it from their kept inputs (the aligned
delta rule computes a chunk's state from the state entering it and the chunk's k, v, g, beta alone, so a
recomputed state has the bits of the first computation). A missing snapshot therefore costs compute, never
exactness; which pages keep one is a matter of speed: the slots go to the pages a forward writes last
(a running sequence's resume point) and to every Nth chunk (anchors a prefix reuse or a preempted sequence
resumes from), and the least recently used slot is evicted when none is free.

The bookkeeping is on the host (a forward plans its reads and writes once, before its first layer, so
every layer reads and writes the same slots).
"""

from __future__ import annotations


class SnapshotSlots:
    """The page -> slot map of ``num_slots`` state snapshots over ``num_pages`` pages, with LRU eviction."""

    def __init__(self, num_pages: int, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"a hybrid cache needs at least one snapshot slot, got {num_slots}")
        self.num_slots = num_slots
        self._slot_of_page: list[int] = [-1] * num_pages
        self._page_of_slot: list[int] = [-1] * num_slots
        self._used: list[int] = [0] * num_slots  # the clock of each slot's last use (0: free)
        self._clock = 0

    def slot(self, page: int) -> int | None:
        """The slot holding ``page``'s snapshot (None: it has none)."""
        s = self._slot_of_page[page]
        return None if s < 0 else s

    def touch(self, slot: int) -> None:
        """Mark ``slot`` as just used (it is evicted last)."""
        self._clock += 1
        self._used[slot] = self._clock

    def forget(self, pages) -> None:
        """Drop the snapshots of ``pages`` (their contents are being replaced)."""
        for page in pages:
            s = self._slot_of_page[page]
            if s >= 0:
                self._slot_of_page[page] = -1
                self._page_of_slot[s] = -1
                self._used[s] = 0

    def take(self, page: int, pinned: set[int]) -> int | None:
        """A slot for ``page``'s snapshot: its own, a free one, or the least recently used one not in
        ``pinned`` (its page loses its snapshot); None when every slot is pinned."""
        own = self.slot(page)
        if own is not None:
            self.touch(own)
            return own
        free = [s for s in range(self.num_slots) if s not in pinned]
        if not free:
            return None
        s = min(free, key=self._used.__getitem__)
        old = self._page_of_slot[s]
        if old >= 0:
            self._slot_of_page[old] = -1
        self._page_of_slot[s] = page
        self._slot_of_page[page] = s
        self.touch(s)
        return s


def plan_snapshots(
    slots: SnapshotSlots,
    table: list[list[int]],
    starts: list[int],
    seq_lens: list[int],
    every: int,
    chunk: int,
) -> tuple[list[tuple[int, int | None]], list[dict[int, int]]]:
    """One forward's snapshot reads and writes, planned before its first layer. ``table[s]`` is sequence s's
    page of each chunk, ``starts[s]``/``seq_lens[s]`` its first position and token count in this forward.

    Returns per sequence (j, slot): the latest chunk j before its first position's chunk whose page holds a
    snapshot (-1 and None: none, the state starts at zero), and {chunk: slot} for the chunks this forward
    completes (from j + 1 on) whose snapshot it keeps: every ``every``-th chunk and the last one. The
    slots read are pinned: a slot taken for a write never evicts one this forward reads."""
    sources: list[tuple[int, int | None]] = []
    pinned: set[int] = set()
    for a, row in zip(starts, table, strict=True):
        j = a // chunk - 1
        while j >= 0 and slots.slot(row[j]) is None:
            j -= 1
        slot = slots.slot(row[j]) if j >= 0 else None
        if slot is not None:
            pinned.add(slot)
            slots.touch(slot)
        sources.append((j, slot))
    targets: list[dict[int, int]] = []
    for (j, _), a, n, row in zip(sources, starts, seq_lens, table, strict=True):
        last = (a + n) // chunk - 1
        keep: dict[int, int] = {}
        for c in range(j + 1, last + 1):
            if (c + 1) % every and c != last:
                continue
            slot = slots.take(row[c], pinned)
            if slot is not None:
                pinned.add(slot)
                keep[c] = slot
        targets.append(keep)
    return sources, targets
