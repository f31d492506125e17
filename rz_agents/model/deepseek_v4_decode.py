"""DeepSeek-V4's decode step straight over the engine's pages, with shapes fixed by (batch, position bound):
what a CUDA graph captures once per bucket and replays (engine/cuda_graphs.py).

A decode step feeds one token per page-table row (row b: its token at ``positions[b]``, a device tensor).
The general cached forward (model/deepseek_v4_cache.py) reads each row's state into a ``SequenceState``
whose size follows the host positions; this one reads the pages in place, in shapes that depend only on the
batch and on ``bound`` (a host int >= every position: the real top when eager, the graph's bound under a
replay), and reads nothing back to the host:

- the sliding window: the W rows before and at the token (positions below 0 masked; they read position 0's
  row, as the learner's layout does), after the token's own row is written;
- a compressor's window: the token's row is written, then the window holding it (and, on CSA, the window
  before) is read and pooled into that window's entry slot in the token's page. Only the window's last token
  completes it; before that the slot holds a partial pool that no query can see (entries are visible from
  their window's last token on) and that the window's last token overwrites. A rate that 64 divides keeps
  the slot in the token's page; a rate that is a multiple of 64 stores its entry in its last page's one slot,
  so an earlier page's slot (never read) takes the partial pools;
- the compressed entries (HCA) and indexer keys (CSA): ``(bound + 1) // rate`` of them for every row, each
  masked unless its window ended at or before the row's token, so the indexer's top-k runs over a fixed
  candidate set whose masked slots score -inf and are never selected (the stable sort puts them after every
  visible block, as the learner's padded set does), and HCA's masked entries add exact zeros; CSA's
  attention then reads only the k entries the indexer picked (-1: entry 0, masked).

Addresses follow the device positions and page tables alone, so a replay at other positions, other pages and
other archive states reads and writes the right places. Padding rows (token 0 at position 0 on the scratch
page) write and read only the scratch page. The arithmetic per row is the learner's (batch-invariant forms),
so the bits are the packed forward's: tests/engine/test_engine_deepseek_v4_graph_decode.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rz_agents.model.kv_cache import PAGE_SIZE

if TYPE_CHECKING:
    from rz_agents.model.deepseek_v4_cache import DeepseekV4Cache


class PagedDecode:
    """One decode step's fixed-shape reads and writes of the pages (see the module docstring): row b of
    ``table`` [B, W] holds the pages of the sequence whose token sits at ``positions[b]`` (device, [B]);
    ``bound`` (host) is at least every position and below the table's capacity."""

    def __init__(
        self, cache: DeepseekV4Cache, table: torch.Tensor, positions: torch.Tensor, bound: int
    ) -> None:
        if bound >= table.shape[1] * PAGE_SIZE:
            raise ValueError(f"position bound {bound} is past the page table's {table.shape[1] * PAGE_SIZE}")
        self.cache, self.table, self.positions, self.bound = cache, table, positions, bound
        self.width = table.shape[1]
        column = torch.div(positions, PAGE_SIZE, rounding_mode="floor")
        self.page = table.gather(1, column.unsqueeze(1)).squeeze(1)  # [B]: the page the token's rows go to
        self.offset = positions % PAGE_SIZE
        cache.archived[self.page] = False  # a page whose rows are written is an ordinary page (again)
        self.angles: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # per RoPE kind: (cos, sin) [B, ...]

    def write_row(self, key: str, value: torch.Tensor) -> None:
        """Store the rows' per-position state `key` ([B, channels]) at their tokens' positions."""
        self.cache.rows[key][self.page, self.offset] = value

    def read_rows(self, key: str, first: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows [B, count, channels] of `key` at positions first[b] .. first[b] + count - 1, ok [B, count]:
        the position is >= 0). A position below 0 reads position 0; one past the table's last column reads
        its last column (both finite values the caller masks)."""
        pos = first.unsqueeze(1) + torch.arange(count, device=first.device)
        ok = pos >= 0
        pos = pos.clamp(min=0)
        column = torch.div(pos, PAGE_SIZE, rounding_mode="floor").clamp(max=self.width - 1)
        return self.cache.rows[key][self.table.gather(1, column), pos % PAGE_SIZE], ok

    def window(self, key: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The sliding window's rows [B, size, channels], oldest first, ending at each row's token, and which
        slots hold a position [B, size]."""
        return self.read_rows(key, self.positions - (size - 1), size)

    def write_entry(self, key: str, value: torch.Tensor, rate: int) -> None:
        """Store each row's pool [B, channels] of the window holding its token in that window's slot of the
        token's page (complete only at the window's last token; see the module docstring)."""
        slot = self.offset // rate if rate <= PAGE_SIZE else torch.zeros_like(self.offset)
        self.cache.entries[key][self.page, slot] = value

    def entries(
        self, key: str, rate: int, picks: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(entries [B, N, channels] 0..N-1 of `key` for N = max(1, (bound + 1) // rate), visible [B, N]: the
        window ended at or before the row's token); with ``picks`` [B, k] (entry indices, -1: none, read as
        entry 0), those entries only and whether each is a pick. An archived column's entries come from its
        archive page (``DeepseekV4Cache.read_entries``, picked on the device)."""
        b = self.positions.shape[0]
        if picks is None:
            w = torch.arange(max(1, (self.bound + 1) // rate), device=self.positions.device).expand(b, -1)
        else:
            w = picks.clamp(min=0)
        column = torch.div((w + 1) * rate - 1, PAGE_SIZE, rounding_mode="floor").clamp(max=self.width - 1)
        slot = (w * rate % PAGE_SIZE) // rate if rate <= PAGE_SIZE else torch.zeros_like(w)
        out = self.cache.read_entries(key, self.table.gather(1, column), column, slot)  # [B, N, channels]
        if picks is not None:
            return out, picks >= 0
        limit = torch.div(self.positions + 1, rate, rounding_mode="floor")
        return out, w < limit.unsqueeze(1)


__all__ = ["PagedDecode"]
