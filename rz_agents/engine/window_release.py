"""Pages behind a sliding window given back to the pool while their sequence runs.

A cache kind whose later tokens read only the last positions of a sequence (DeepSeek-V4's sliding window and
compressor windows: model/deepseek_v4_cache.py) says so through ``window_release()`` (None for plain K/V and
recurrent caches, whose every position stays readable). After each step, for each sequence the step fed,
the leading page-table columns that no later call reads rows of (``pages_behind(num_cached)``) are given
back: what a later token still reads of such a page (DeepSeek-V4's compressed entries) is first copied into
an archive page (``archive_page``), one archive page per ``archive_span`` columns, whose id then fills those
columns (it is referenced once per column, so releasing the table frees it like any page).

Why this stays exact: the cache reads an archived column's entries from the archive page with the bits the
page held, and no call reads the given-back rows (``pages_behind`` is the cache's own reach, and a sequence's
calls only move forward). Preemption and a recompute after a weight update free the whole table and rebuild
it from position 0. Prefix reuse: a given-back page keeps its content and its place in the prefix index
(cached when nobody holds it), so a later prompt reuses it while it lasts; a match stops at the first page
that was evicted (reused by another sequence), so reuse never reaches past what is kept. Only columns the
index is done with are given back (``indexed_pages``); the chain over the table's later pages continues from
the node the sequence keeps (``index_parent``), so no page is held for the chain's sake.
"""

from __future__ import annotations

from typing import Protocol

from rz_agents.engine.pages import PagePool
from rz_agents.engine.sequence import Sequence


class WindowRelease(Protocol):
    """What a cache kind offers for giving pages back behind its window (model/deepseek_v4_cache.py)."""

    archive_span: int

    def pages_behind(self, position: int) -> int: ...

    def archive_page(self, src: int, dst: int, index: int) -> None: ...


def release_behind(pool: PagePool, seq: Sequence, cache: WindowRelease) -> tuple[int, int]:
    """Give back the pages of ``seq`` that no later call reads, archiving what it still reads of them.
    Returns (pages given back, archive pages taken). Stops (to try again after the next step) when an
    archive page cannot be found: it never preempts a sequence for this."""
    target = cache.pages_behind(seq.num_cached)
    if not seq.kv_from_old_weights:  # (its pages are out of the index: no chain to keep)
        target = min(target, seq.indexed_pages)
    span, given, taken = cache.archive_span, 0, 0
    while seq.pages_released < target:
        column = seq.pages_released
        if column % span == 0:
            got = pool.allocate(1)
            if got is None:
                break
            archive = got[0]
            taken += 1
        else:
            archive = seq.pages[column - column % span]
            pool.ref([archive])
        cache.archive_page(seq.pages[column], archive, column % span)
        pool.give_back(seq, seq.pages[column])
        seq.pages[column] = archive
        seq.pages_released += 1
        given += 1
    return given, taken
