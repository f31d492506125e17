"""Paged KV cache: fixed pages of one attention key block (64 positions) per layer, addressed by page.

A sequence's K/V live in the pages its page table lists, in position order: position p is at
offset p % 64 of page ``page_table[p // 64]``. Which pages a sequence holds is decided by the
engine's page pool (rz_agents.engine.pages); the model only reads and writes through a
``CacheView`` that carries the page tables of one forward's sequences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rz_agents.model.config import ModelConfig
from rz_kernels.attention import KEY_BLOCK

PAGE_SIZE = KEY_BLOCK  # positions per page: one key block, so attention walks whole pages


def pages_for(num_positions: int) -> int:
    """Pages needed to hold positions 0..num_positions-1."""
    return -(-num_positions // PAGE_SIZE)


def bytes_per_page(config: ModelConfig, dtype: torch.dtype | None = None) -> int:
    """Bytes of K and V of one page (64 positions), all layers."""
    itemsize = torch.empty(0, dtype=dtype or config.torch_dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * PAGE_SIZE * config.head_dim * itemsize


def bytes_per_slot(config: ModelConfig, max_len: int, dtype: torch.dtype | None = None) -> int:
    """Bytes of K and V of max_len positions (rounded up to whole pages), all layers.

    What a slot cache reserves per sequence whatever its real length; the paged cache spends this
    only on a sequence that really reaches max_len.
    """
    return pages_for(max_len) * bytes_per_page(config, dtype)


class KVCache:
    """k, v: per layer [num_pages, num_kv_heads, 64, head_dim], zero-initialised.

    Zero init matters: blocked attention multiplies masked probabilities (exactly 0) by the values
    past a sequence's end in its last page, which must be finite (a reused page holds another
    sequence's finite values there).
    """

    def __init__(
        self,
        config: ModelConfig,
        num_pages: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_pages < 1:
            raise ValueError(f"KVCache needs at least one page, got {num_pages}")
        self.num_pages = num_pages
        dtype = dtype or config.torch_dtype
        shape = (num_pages, config.num_key_value_heads, PAGE_SIZE, config.head_dim)
        self.device = torch.device(device)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.bytes_per_page = bytes_per_page(config, dtype)

    @property
    def bytes_total(self) -> int:
        return self.num_pages * self.bytes_per_page

    def buffers(self) -> list[torch.Tensor]:
        """Every tensor of the cache (each layer's k and v)."""
        return [*self.k, *self.v]

    def view(
        self,
        page_table: torch.Tensor,
        max_position: int | None = None,
        decode_positions: Sequence[int] | None = None,
    ) -> CacheView:
        """What one forward reads and writes: row i of ``page_table`` [S, W] lists sequence i's pages.

        The forward's ``seq_ids`` index these rows. ``max_position`` (the largest position fed, known
        to the caller) lets the model check capacity without reading a device tensor back.
        ``decode_positions`` (host ints, one per row) says the forward is a decode step: token i is
        the one token of row i, at that position; attention plans then need no device read-back.
        """
        if page_table.dim() != 2:
            raise ValueError(f"page_table must be [sequences, pages], got {tuple(page_table.shape)}")
        table = page_table.to(device=self.device, dtype=torch.long)
        if decode_positions is not None:
            decode_positions = tuple(decode_positions)
            if len(decode_positions) != table.shape[0]:
                raise ValueError(
                    f"decode_positions has {len(decode_positions)} rows, the page table {table.shape[0]}"
                )
        return CacheView(self, table, max_position, decode_positions)

    def window_release(self) -> None:
        """None: every position's K/V stays readable by a later token (no page is given back behind a window;
        model/deepseek_v4_cache.py's cache returns itself here)."""
        return None

    @torch.no_grad()
    def copy_page(self, src: int, dst: int, num_positions: int = PAGE_SIZE) -> None:
        """Copy the first num_positions positions of page src into page dst (every layer; bit-exact)."""
        for layer in range(len(self.k)):
            for buf in (self.k[layer], self.v[layer]):
                buf[dst, :, :num_positions].copy_(buf[src, :, :num_positions])


@dataclass
class CacheView:
    """The paged cache as one forward sees it: the cache and the page table of each of its sequences."""

    cache: KVCache
    page_table: torch.Tensor  # [S, W] long: page of key block j of sequence s
    max_position: int | None = None
    decode_positions: tuple[int, ...] | None = None  # decode step: row i's one token, at this position

    @property
    def capacity(self) -> int:
        """Positions each row of the page table can address."""
        return self.page_table.shape[1] * PAGE_SIZE

    @property
    def device(self) -> torch.device:
        return self.cache.device


def sequence_cache(
    config: ModelConfig,
    num_sequences: int,
    max_len: int,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
) -> CacheView:
    """A paged cache for a fixed set of sequences (benches, checks): sequence i owns pages
    i*W .. i*W+W-1 for W = pages_for(max_len); feed it with seq_ids = i."""
    width = pages_for(max_len)
    cache = KVCache(config, num_sequences * width, dtype=dtype, device=device)
    return cache.view(torch.arange(num_sequences * width).view(num_sequences, width))
