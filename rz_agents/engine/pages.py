"""KV pages: the free list, reference counts, and one prefix index over every page whose K/V can be reused.

A page holds the K/V of 64 consecutive positions (one attention key block) of one sequence. A running
sequence owns a page table (``Sequence.pages``); a page may appear in several tables at once when sequences
share a prefix, and its reference count says how many. Every page with K/V worth reusing has a node in one
index (nano-vLLM's block manager is the model): a page is named by its parent's node (the page before it in
its sequence) and its 64 tokens, a hash chain, so a prompt finds its longest cached prefix with one dict
lookup per full page, wherever those pages came from:

- pages a running sequence is writing (a group's shared prompt: members that arrive while the first is
  still prefilling wait for it, then reference its full pages instead of computing them again);
- pages of finished sequences, kept in an LRU cache when nobody holds them (the next turn of a multi-turn
  episode extends the previous prompt + completion, and reuses them): evicted least recently used when pages
  run out, when they outlive ``ttl_s``, and all at once when the weights change.

The last, partly matching page of a prompt is found among the children of the matched chain's last node
(bucketed by their first token) and copied (a bit-exact copy of its first positions), so reuse is not
limited to whole pages. Reusing a page is bit-identical to computing it: in aligned mode a position's K/V
depend only on the tokens up to it and the weights (``version`` is part of every key).

Images (a vision-language model): a prompt placeholder's K/V depend on its image's pixels, not only on its
token id, so the index keys every position by ``Sequence.index_tokens()``, where each placeholder is its
image's content label (pixel digest, dtype, shape, grid: engine/sequence.py), vLLM's multimodal hashes in its
block keys in one list. A page's key thus covers the images whose placeholders it holds, and through the
chain every image before it: equal ids with other pixels part at the first differing placeholder, and a
screenshot prompt is shared by a group and reused by the episode's next turn like text. A match may end
inside an image's placeholders (a page boundary, a partial page, a shorter earlier prompt): the rest of that
image's placeholders are prefilled with rows of its full encoding (the engine's image cache, or the tower
again: engine/images.py), which do not depend on where the split falls.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rz_agents.model.kv_cache import PAGE_SIZE

if TYPE_CHECKING:
    from rz_agents.engine.sequence import Sequence

ROOT = 0  # the parent of every sequence's first page


def common_prefix_len(a: list, b: list) -> int:
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


@dataclass(eq=False)
class PageNode:
    """What the index knows of one page: its place in a hash chain and the tokens whose K/V it holds.

    While ``owner`` (the running sequence that writes it, as its ``index``-th page) is set, the tokens and how
    many of them are computed are read live from it; once the owner lets go they are frozen in ``tokens``
    (computed positions only)."""

    block: int  # unique id of this node (a page id is reused; a node id never)
    parent: int  # the node of the page before it in its sequence (ROOT for a first page)
    version: int  # policy version of the weights that compute its K/V
    first: int | str  # its first index token (the bucket its parent's children are kept in)
    owner: Sequence | None
    index: int
    tokens: list[int | str] = field(default_factory=list)  # index tokens (Sequence.index_tokens)
    from_cache: bool = False  # it has been in the cache of finished sequences (reusable at any length)
    released_at: float = 0.0
    key: tuple | None = None  # its full-page key in the index, once its 64 tokens are known

    def known(self) -> list[int | str]:
        """The tokens this page holds or will hold (those the owner knows today)."""
        if self.owner is not None:
            start = self.index * PAGE_SIZE
            return self.owner.index_tokens()[start : start + PAGE_SIZE]
        return self.tokens

    def computed(self) -> int:
        """How many of its positions have K/V written."""
        if self.owner is not None:
            return max(0, min(PAGE_SIZE, self.owner.num_cached - self.index * PAGE_SIZE))
        return len(self.tokens)


@dataclass
class PrefixMatch:
    """The longest reusable prefix of a prompt: ``full`` pages to reference, then ``partial`` positions to
    copy from ``partial_page``; ``computed`` tokens in all. ``potential`` counts what running sequences have
    not computed yet as well (waiting for it pays when it exceeds ``computed``); ``running``: the match goes
    through pages a running sequence is writing (sharing rather than the cache of finished sequences)."""

    full: list[int] = field(default_factory=list)
    partial_page: int | None = None
    partial: int = 0
    computed: int = 0
    potential: int = 0
    running: bool = False


class PagePool:
    """Owns page ids 0..num_pages-1: free, held by page tables, or cached (nobody holds them, their K/V kept
    for reuse); and the prefix index over held and cached pages."""

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
        self._nodes: dict[int, PageNode] = {}  # page -> node
        self._full: dict[tuple, int] = {}  # (parent, tokens, version) -> page: the hash chain
        self._children: dict[tuple, set[int]] = {}  # (parent, version, first index token) -> pages
        self._by_parent: dict[int, set[int]] = {}  # parent node -> pages continuing it
        self._cached: OrderedDict[int, None] = OrderedDict()  # pages nobody holds, least recently used first
        self._next_block = ROOT + 1
        self.prefix_hits = 0
        self.prefix_tokens_reused = 0

    # -- accounting -------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Pages on the free list (not counting cached pages, which allocation takes back on demand)."""
        return len(self._free)

    @property
    def num_cached_pages(self) -> int:
        """Pages nobody holds whose K/V are kept for reuse."""
        return len(self._cached)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    @property
    def bytes_total(self) -> int:
        return self.num_pages * self.bytes_per_page

    @property
    def bytes_used(self) -> int:
        """Bytes of every page not on the free list."""
        return self.num_used * self.bytes_per_page

    @property
    def bytes_prefix_cache(self) -> int:
        """Bytes of cached pages (reclaimable on demand)."""
        return len(self._cached) * self.bytes_per_page

    @property
    def bytes_held(self) -> int:
        """Bytes of pages that running sequences reference."""
        return self.bytes_used - self.bytes_prefix_cache

    def refcount(self, page: int) -> int:
        return self._refs[page]

    # -- pages ------------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int] | None:
        """n fresh pages (reference count 1 each), evicting cached pages (least recently used first) if
        needed; None if they cannot be found (then nothing is taken)."""
        if n <= 0:
            return []
        self.expire()
        while len(self._free) < n and self._cached:
            self._evict(next(iter(self._cached)))
        if len(self._free) < n:
            return None
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._refs[p] = 1
        return pages

    def ref(self, pages: list[int]) -> None:
        """Add a holder to each page (a sequence sharing it, or reusing a cached page)."""
        for p in pages:
            if self._refs[p] < 1 and p not in self._cached:
                raise ValueError(f"page {p} is free: it cannot be shared")
            self._cached.pop(p, None)
            self._refs[p] += 1

    def unref(self, pages: list[int], keep: bool = True) -> None:
        """Remove a holder from each page. A page nobody holds any more stays cached when ``keep`` and the
        prefix cache is on and it holds computed K/V; otherwise it returns to the free list."""
        for p in pages:
            if self._refs[p] < 1:
                raise ValueError(f"page {p} is not held")
            self._refs[p] -= 1
            if self._refs[p]:
                continue
            node = self._nodes.get(p)
            if node is not None:
                self._freeze(node)
            if keep and self.prefix_cache and node is not None and node.tokens:
                node.from_cache = True
                node.released_at = self._clock()
                self._cached[p] = None
            else:
                self._forget(p)
                self._free.append(p)

    def release(self, seq: Sequence, keep: bool) -> None:
        """``seq`` lets go of its page table (finished, cancelled or preempted); its pages stay in the index
        for whoever else holds them, and are cached (``keep``) or freed when nobody does."""
        for p in seq.pages:
            node = self._nodes.get(p)
            if node is not None and node.owner is seq:
                self._freeze(node)
        self.unref(seq.pages, keep=keep)

    def give_back(self, seq: Sequence, page: int) -> None:
        """``seq`` lets go of one page of its table while it runs (behind its window:
        engine/window_release.py); the page keeps its content and its place in the index, cached or freed
        when nobody holds it."""
        node = self._nodes.get(page)
        if node is not None and node.owner is seq:
            self._freeze(node)
        self.unref([page])

    # -- the prefix index -------------------------------------------------------------------
    def track(self, seq: Sequence, version: int) -> None:
        """Index the pages of ``seq``'s table that have no node yet (fresh pages it writes), and give each
        page whose 64 tokens are now known its key in the hash chain. Starts at ``seq.indexed_pages`` (the
        leading pages already done), so a decode step costs O(1) pages, not the whole table."""
        items = seq.index_tokens()  # an image placeholder is keyed by its image's content too
        start = seq.indexed_pages
        parent = seq.index_parent if start else ROOT  # (page start - 1 may be given back: window_release.py)
        for j in range(start, len(seq.pages)):
            p = seq.pages[j]
            node = self._nodes.get(p)
            if node is None:
                if j * PAGE_SIZE >= seq.num_tokens:
                    break  # allocated ahead of its first token: indexed once it has one
                node = PageNode(self._next_block, parent, version, items[j * PAGE_SIZE], seq, j)
                self._next_block += 1
                self._nodes[p] = node
                self._children.setdefault((parent, version, node.first), set()).add(p)
                self._by_parent.setdefault(parent, set()).add(p)
            if node.key is None and node.owner is seq and (j + 1) * PAGE_SIZE <= seq.num_tokens:
                key = (node.parent, tuple(node.known()), node.version)
                node.key = key
                self._full.setdefault(key, p)
            if j == seq.indexed_pages and (node.key is not None or node.owner is not seq):
                seq.indexed_pages += 1  # done for good: its key is set, or another sequence owns it
                seq.index_parent = node.block
            parent = node.block

    def untrack(self, seq: Sequence) -> None:
        """Take ``seq``'s pages out of the index (their K/V now mix weight versions: nobody may reuse
        them)."""
        for p in seq.pages:
            if p in self._nodes and self._nodes[p].owner is seq:
                self._forget(p)

    def match(self, tokens: list[int | str], version: int, share_running: int) -> PrefixMatch:
        """The longest prefix of ``tokens`` (a sequence's ``index_tokens()``; at most len - 1: the last token
        must be fed through the model to give the next one's logits) whose K/V pages of this ``version``
        hold: full pages by the hash chain, then the best partial page among the last node's children.

        Pages of finished sequences (the cache) match at any length when the prefix cache is on; pages running
        sequences write match only when ``share_running`` >= 1 and the whole match is at least that long."""
        self.expire()
        m = self._walk(tokens, version, share_running >= 1)
        if m.running and m.potential < share_running:
            m = self._walk(tokens, version, False)
        return m

    def _usable(self, p: int, version: int, running: bool) -> bool:
        node = self._nodes[p]
        if node.version != version:
            return False
        if node.from_cache:
            return self.prefix_cache
        return running and self._refs[p] > 0

    def _walk(self, tokens: list[int | str], version: int, running: bool) -> PrefixMatch:
        m = PrefixMatch()
        limit = len(tokens) - 1
        parent, start = ROOT, 0
        while start < limit:
            if start + PAGE_SIZE <= limit:
                p = self._full.get((parent, tuple(tokens[start : start + PAGE_SIZE]), version))
                if p is not None and self._usable(p, version, running):
                    node = self._nodes[p]
                    m.running |= not node.from_cache
                    m.potential += PAGE_SIZE
                    if m.computed == start and node.computed() == PAGE_SIZE:
                        m.full.append(p)
                        m.computed += PAGE_SIZE
                    parent, start = node.block, start + PAGE_SIZE
                    continue
            seg = tokens[start : min(start + PAGE_SIZE, limit)]
            self._best_partial(m, seg, parent, version, running, start)
            break
        return m

    def _best_partial(
        self, m: PrefixMatch, seg: list[int | str], parent: int, version: int, running: bool, start: int
    ) -> None:
        """The child of ``parent`` sharing the most leading tokens with ``seg`` (ties: the most computed)."""
        best, best_n, best_c = None, 0, 0
        for p in self._children.get((parent, version, seg[0]), ()):
            if not self._usable(p, version, running):
                continue
            node = self._nodes[p]
            n = common_prefix_len(node.known(), seg)
            c = min(n, node.computed())
            if (n, c) > (best_n, best_c):
                best, best_n, best_c = p, n, c
        if best is None:
            return
        m.running |= not self._nodes[best].from_cache
        m.potential += best_n
        if m.computed == start and best_c:
            m.partial_page, m.partial = best, best_c
            m.computed += best_c

    def expire(self) -> None:
        """Evict cached pages older than ttl_s."""
        now = self._clock()
        for p in [p for p in self._cached if now - self._nodes[p].released_at > self.ttl_s]:
            if p in self._cached:
                self._evict(p)

    def invalidate(self) -> None:
        """Evict every cached page (their K/V were computed by weights that are gone)."""
        while self._cached:
            self._evict(next(iter(self._cached)))

    # -- internals --------------------------------------------------------------------------
    def _freeze(self, node: PageNode) -> None:
        """The owner lets go: keep its computed tokens (what a later match may reuse)."""
        if node.owner is not None:
            node.tokens = node.known()[: node.computed()]
            node.owner = None
        if node.key is not None and len(node.tokens) < PAGE_SIZE:
            # Keyed while its owner was still to compute it (cancelled mid-prefill): it will never hold 64
            # positions, so it leaves the hash chain (the same page computed in full may take the key) and
            # is found as a partial page among its parent's children (its computed positions copied).
            if self._nodes.get(self._full.get(node.key, -1)) is node:
                del self._full[node.key]
            node.key = None

    def _forget(self, p: int) -> None:
        """Take page ``p`` out of the index."""
        node = self._nodes.pop(p, None)
        if node is None:
            return
        bucket = self._children.get((node.parent, node.version, node.first))
        if bucket is not None:
            bucket.discard(p)
            if not bucket:
                del self._children[(node.parent, node.version, node.first)]
        kids = self._by_parent.get(node.parent)
        if kids is not None:
            kids.discard(p)
            if not kids:
                del self._by_parent[node.parent]
        if node.key is not None and self._full.get(node.key) == p:
            del self._full[node.key]

    def _evict(self, p: int) -> None:
        """Free cached page ``p`` and the cached pages that continue it (unreachable without it)."""
        stack = [p]
        while stack:
            q = stack.pop()
            node = self._nodes.get(q)
            if node is not None:
                stack.extend(c for c in self._by_parent.get(node.block, ()) if c in self._cached)
            if q in self._cached:
                del self._cached[q]
                self._forget(q)
                self._free.append(q)
