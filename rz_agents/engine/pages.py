"""KV pages: the free list, reference counts, and the prefix cache of finished sequences.

A page holds the K/V of 64 consecutive positions (one attention key block) of one sequence. A
running sequence owns a page table (``Sequence.pages``); a page may appear in several tables at once
when sequences share a prefix (the members of a group share their prompt's full pages), and is
freed when its last holder lets go. When a sequence finishes, its pages can stay as a prefix
entry keyed by the tokens whose K/V they hold, so that the next turn of a multi-turn episode
(whose prompt extends the previous prompt + completion) reuses them instead of prefilling again.
Entries are evicted least-recently-used when pages run out, when they outlive ``ttl_s``, or all at
once when the weights change (their K/V belong to old weights).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from rz_agents.model.kv_cache import pages_for


@dataclass
class PrefixEntry:
    tokens: list[int]  # tokens whose K/V the pages hold, positions 0..len-1
    pages: list[int]  # pages covering those positions, in order (each referenced by this entry)
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


class PagePool:
    """Owns page ids 0..num_pages-1: free, referenced by page tables, or held by prefix entries."""

    def __init__(
        self,
        num_pages: int,
        bytes_per_page: int,
        prefix_cache: bool = True,
        ttl_s: float = 300.0,
        clock=time.monotonic,
    ) -> None:
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        self.num_pages = num_pages
        self.bytes_per_page = int(bytes_per_page)
        self.prefix_cache = prefix_cache
        self.ttl_s = ttl_s
        self._clock = clock
        self._free: list[int] = list(range(num_pages - 1, -1, -1))  # pop() hands out page 0 first
        self._refs = [0] * num_pages
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()  # id -> entry, oldest first
        self._next_entry = 0
        self.prefix_hits = 0
        self.prefix_tokens_reused = 0

    # -- accounting -------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Pages on the free list (not counting those prefix entries would give back)."""
        return len(self._free)

    @property
    def num_prefix_entries(self) -> int:
        return len(self._entries)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def num_entry_only_pages(self) -> int:
        """Pages referenced by prefix entries and nothing else (what evicting every entry frees)."""
        held = [0] * self.num_pages
        for entry in self._entries.values():
            for p in entry.pages:
                held[p] += 1
        return sum(1 for p in range(self.num_pages) if held[p] and held[p] == self._refs[p])

    @property
    def bytes_total(self) -> int:
        return self.num_pages * self.bytes_per_page

    @property
    def bytes_used(self) -> int:
        """Bytes of every page not on the free list."""
        return self.num_used * self.bytes_per_page

    @property
    def bytes_prefix_cache(self) -> int:
        """Bytes of pages only prefix entries hold (reclaimable on demand)."""
        return self.num_entry_only_pages() * self.bytes_per_page

    @property
    def bytes_held(self) -> int:
        """Bytes of pages that running sequences reference."""
        return self.bytes_used - self.bytes_prefix_cache

    def refcount(self, page: int) -> int:
        return self._refs[page]

    # -- pages ------------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int] | None:
        """n fresh pages (reference count 1 each), evicting prefix entries if needed; None if they
        cannot be found (then nothing is taken)."""
        if n <= 0:
            return []
        self.expire()
        while len(self._free) < n and self._entries:
            self._drop(next(iter(self._entries)))  # the least recently stored entry
        if len(self._free) < n:
            return None
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._refs[p] = 1
        return pages

    def ref(self, pages: list[int]) -> None:
        """Add a holder to each page (a sequence sharing them)."""
        for p in pages:
            if self._refs[p] < 1:
                raise ValueError(f"page {p} is free: it cannot be shared")
            self._refs[p] += 1

    def unref(self, pages: list[int]) -> None:
        """Remove a holder from each page; a page nobody holds returns to the free list."""
        for p in pages:
            if self._refs[p] < 1:
                raise ValueError(f"page {p} is not held")
            self._refs[p] -= 1
            if self._refs[p] == 0:
                self._free.append(p)

    # -- prefix entries ---------------------------------------------------------------------
    def match(self, tokens: list[int], version: int) -> tuple[PrefixEntry | None, int]:
        """The entry of this version sharing the longest prefix with ``tokens``, and that length.

        The length is capped at len(tokens) - 1: the last token must be fed through the model to
        produce the logits of the next one.
        """
        self.expire()
        best, best_len = None, 0
        if not self.prefix_cache:
            return None, 0
        for entry in self._entries.values():
            if entry.version != version:
                continue
            n = min(common_prefix_len(entry.tokens, tokens), len(tokens) - 1)
            if n > best_len:
                best, best_len = entry, n
        return best, best_len

    def store(self, tokens: list[int], pages: list[int], version: int) -> None:
        """Keep ``pages`` (holding the K/V of ``tokens``) as a prefix entry; entries this one extends
        are dropped (it answers every match they would)."""
        if not self.prefix_cache or not tokens:
            return
        for key, entry in list(self._entries.items()):
            if entry.version == version and len(entry.tokens) <= len(tokens):
                if common_prefix_len(entry.tokens, tokens) == len(entry.tokens):
                    self._drop(key)
        kept = pages[: pages_for(len(tokens))]
        self.ref(kept)
        self._entries[self._next_entry] = PrefixEntry(list(tokens), list(kept), version, self._clock())
        self._next_entry += 1

    def touch(self, entry: PrefixEntry) -> None:
        """Count a reuse of ``entry`` and make it the most recently used."""
        for key, e in self._entries.items():
            if e is entry:
                self._entries.move_to_end(key)
                e.stored_at = self._clock()
                break

    def expire(self) -> None:
        """Drop prefix entries older than ttl_s."""
        now = self._clock()
        for key in [k for k, e in self._entries.items() if now - e.stored_at > self.ttl_s]:
            self._drop(key)

    def invalidate(self) -> None:
        """Drop every prefix entry (their K/V were computed by weights that are gone)."""
        for key in list(self._entries):
            self._drop(key)

    def _drop(self, key: int) -> None:
        self.unref(self._entries.pop(key).pages)
