"""Cache slots: which sequence owns which KV slot, the prefix cache of finished sequences, memory.

A slot holds the K/V of one sequence for positions 0..max_len-1. When a sequence finishes, its
slot can be kept, keyed by the tokens whose K/V it holds, so that the next turn of a multi-turn
episode (whose prompt extends the previous prompt + completion) reuses the matching prefix instead
of prefilling it again. Kept slots are evicted least-recently-used when a new sequence needs a slot,
when they outlive ``ttl_s``, or all at once when the weights change (their K/V belong to old weights).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class PrefixEntry:
    tokens: list[int]  # tokens whose K/V are in the slot, positions 0..len-1
    version: int  # policy version of the weights that computed them
    stored_at: float


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists.

    Binary search over slice equality: each comparison runs in C, so long prompts stay cheap.
    """
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] holds, a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class SlotPool:
    """Owns the slot ids 0..num_slots-1: free, held by a running sequence, or kept as a prefix entry."""

    def __init__(
        self,
        num_slots: int,
        bytes_per_slot: int,
        prefix_cache: bool = True,
        ttl_s: float = 300.0,
        clock=time.monotonic,
    ) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self.bytes_per_slot = int(bytes_per_slot)
        self.prefix_cache = prefix_cache
        self.ttl_s = ttl_s
        self._clock = clock
        self._free: list[int] = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._held: set[int] = set()
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()  # slot -> entry, oldest first
        self.prefix_hits = 0
        self.prefix_tokens_reused = 0

    # -- accounting -------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Slots a new sequence can take now (free ones plus evictable prefix entries)."""
        return len(self._free) + len(self._entries)

    @property
    def num_held(self) -> int:
        return len(self._held)

    @property
    def num_prefix_entries(self) -> int:
        return len(self._entries)

    @property
    def bytes_total(self) -> int:
        return self.num_slots * self.bytes_per_slot

    @property
    def bytes_held(self) -> int:
        """Bytes of KV owned by running sequences."""
        return len(self._held) * self.bytes_per_slot

    @property
    def bytes_prefix_cache(self) -> int:
        """Bytes of KV kept for prefix reuse (reclaimable on demand)."""
        return len(self._entries) * self.bytes_per_slot

    # -- allocation -------------------------------------------------------------------------
    def acquire(self, prompt: list[int], version: int) -> tuple[int, int] | None:
        """Give a slot to a sequence with this prompt; returns (slot, reusable_prefix_len) or None.

        The reusable length is capped at len(prompt) - 1: the last prompt token must be fed
        through the model to produce the logits of the first generated token.
        """
        self.expire()
        best_slot, best_len = None, 0
        if self.prefix_cache:
            for slot, entry in self._entries.items():
                if entry.version != version:
                    continue
                n = min(common_prefix_len(entry.tokens, prompt), len(prompt) - 1)
                if n > best_len:
                    best_slot, best_len = slot, n
        if best_slot is not None:
            del self._entries[best_slot]
            self.prefix_hits += 1
            self.prefix_tokens_reused += best_len
            self._held.add(best_slot)
            return best_slot, best_len
        if self._free:
            slot = self._free.pop()
        elif self._entries:
            slot, _ = self._entries.popitem(last=False)  # evict the least recently stored entry
        else:
            return None
        self._held.add(slot)
        return slot, 0

    def release(self, slot: int, cached_tokens: list[int] | None = None, version: int = 0) -> None:
        """Return a slot; with cached_tokens (and prefix caching on) keep it as a prefix entry."""
        if slot not in self._held:
            raise ValueError(f"slot {slot} is not held")
        self._held.remove(slot)
        if self.prefix_cache and cached_tokens:
            self._entries[slot] = PrefixEntry(list(cached_tokens), version, self._clock())
            self._entries.move_to_end(slot)
        else:
            self._free.append(slot)

    def expire(self) -> None:
        """Drop prefix entries older than ttl_s."""
        now = self._clock()
        for slot in [s for s, e in self._entries.items() if now - e.stored_at > self.ttl_s]:
            del self._entries[slot]
            self._free.append(slot)

    def invalidate(self) -> None:
        """Drop every prefix entry (their K/V were computed by weights that are gone)."""
        for slot in list(self._entries):
            del self._entries[slot]
            self._free.append(slot)
