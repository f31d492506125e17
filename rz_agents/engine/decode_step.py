"""The decode step over static buffers: the batch padded to a bucket, shapes fixed per bucket.

A decode-only step (one new token per sequence) runs over buffers allocated once per bucket:
tokens, positions, page-table rows, RoPE positions and the page tables (width: the pages of max_len). One
layout for every model family: a text model's RoPE positions are its positions, a vision-language model's
are index + its sequence's M-RoPE delta (the same on all three axes); the model rotates by them
(``text_rope_positions`` of the forward contract) and orders attention by the positions. ``fill``
writes the step's metadata on the host and uploads it in one copy (pinned, non-blocking on CUDA); the page
tables are kept in the bucket's buffer from step to step and only the entries that changed are written (a
row admitted, grown by a page, replaced or finished), so a step costs O(batch) Python work plus a C-speed
comparison of each real row's pages, never a rebuild of batch x width entries; the upload covers the page
tables only in a step that changed them;
``forward`` is the model over those buffers. The model then sees the same shapes, addresses and
metadata layout every time a bucket repeats, and ``forward`` reads nothing back to the host: it is
the function rz_agents.engine.cuda_graphs captures once per bucket and replays on CUDA, and the
function every device runs eagerly, so its padding and its bits are tested on CPU.

Padding rows are sequences of their own: token 0 at position 0, whose page-table row points at a
scratch page outside the page pool. Their K/V go to the scratch page, they attend only to it, and
the aligned op set makes every row's result independent of the other rows in the call (batch
invariance), so padding changes no bit of the real rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rz_agents.model.kv_cache import PAGE_SIZE, KVCache

# Graph bounds on the highest position are multiples of this many positions: the Triton attention's split-KV
# split (SPLIT_BLOCKS x BLOCK_N = 512 keys, rz_kernels.triton_ops.attention; a kernels test checks they
# agree), so a bound's decode grid has exactly a power-of-two number of splits.
GRAPH_POSITION_QUANTUM = 512

# int64 sections per row before the page tables: tokens, positions, page-table rows, RoPE positions
HEAD_ROWS = 4


def decode_buckets(max_batch: int) -> list[int]:
    """Batch sizes a decode step is padded to: 1, 2, 4, then multiples of 8, and max_batch itself."""
    sizes = {b for b in (1, 2, 4) if b < max_batch} | set(range(8, max_batch, 8)) | {max_batch}
    return sorted(sizes)


@dataclass
class StepBuffers:
    """One bucket's inputs: [tokens B | positions B | rows B | RoPE positions B | page table B x W], one int64
    block, for every model family.

    ``host`` is the staging copy (pinned on CUDA), ``device`` the same on the model's device (the
    model reads views of it; on CPU both are one tensor). Allocated once per bucket and only ever
    written in place, so a captured graph's addresses stay valid.
    """

    host: torch.Tensor
    device: torch.Tensor
    batch: int
    width: int
    uploaded: torch.cuda.Event | None = None  # the last upload from ``host`` (CUDA): wait before rewriting
    # The pages written in each row of the table (a copy of the list; [] for a padding row): what the next
    # ``fill`` compares with, to write only what changed.
    written: list[list[int]] | None = None
    tables_uploaded: bool = False  # the device copy's page tables equal the host's

    @staticmethod
    def size(batch: int, width: int) -> int:
        """int64 entries of a bucket's block: HEAD_ROWS per row, then its page table."""
        return batch * (HEAD_ROWS + width)

    def part(self, t: torch.Tensor, i: int) -> torch.Tensor:
        return t[i * self.batch : (i + 1) * self.batch]

    def table(self, t: torch.Tensor) -> torch.Tensor:
        return t[HEAD_ROWS * self.batch :].view(self.batch, self.width)

    @property
    def tokens(self) -> torch.Tensor:
        return self.part(self.device, 0)

    @property
    def positions(self) -> torch.Tensor:
        return self.part(self.device, 1)

    @property
    def rows(self) -> torch.Tensor:
        return self.part(self.device, 2)

    @property
    def rope_positions(self) -> torch.Tensor:
        """The rows' RoPE positions (a text model: the positions; a vision-language model: index + the
        sequence's M-RoPE delta)."""
        return self.part(self.device, 3)

    @property
    def page_table(self) -> torch.Tensor:
        return self.table(self.device)


class DecodeStep:
    """Static, bucketed decode-step inputs for one model and paged cache.

    ``scratch_page`` is a page the pool never hands out (padding rows write there).
    """

    def __init__(self, model: torch.nn.Module, cache: KVCache, max_batch: int, width: int, scratch_page: int):
        self.model = model
        self.cache = cache
        self.width = width
        self.scratch_page = scratch_page
        self.buckets = decode_buckets(max_batch)
        self._buffers: dict[int, StepBuffers] = {}
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None) or width * PAGE_SIZE
        # Every position a step may feed is <= this (checked on the host): the largest bound a captured graph
        # is built with (see graph_max_position).
        self.static_max_position = min(width * PAGE_SIZE, limit) - 1

    def graph_bounds(self) -> list[int]:
        """Every bound a CUDA graph of this step is captured with: (2^k x 512) - 1 positions, k = 0, 1, ...,
        then ``static_max_position``."""
        bounds, splits = [], 1
        while splits * GRAPH_POSITION_QUANTUM - 1 < self.static_max_position:
            bounds.append(splits * GRAPH_POSITION_QUANTUM - 1)
            splits *= 2
        return bounds + [self.static_max_position]

    def graph_max_position(self, top: int) -> int:
        """The bound a CUDA graph replaying a step whose highest position is ``top`` (host-known) is captured
        with: the smallest of ``graph_bounds`` >= top. The attention's decode grid (one program per token,
        kv head and 512-key split up to the bound) then covers the batch's longest context rounded up to a
        power-of-two number of splits (at most 2x its real splits, never the whole max_len), from a handful
        of graphs per batch bucket. Any bound >= top gives the same bits (programs past a token's last split
        exit; the combine folds only the token's own splits)."""
        if top > self.static_max_position:
            raise ValueError(
                f"position {top} exceeds the decode step's {self.static_max_position + 1} positions"
            )
        return next(b for b in self.graph_bounds() if b >= top)

    def bucket(self, n: int) -> int:
        """The smallest bucket holding n rows."""
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"decode batch {n} exceeds the largest bucket {self.buckets[-1]}")

    def buffers(self, bucket: int) -> StepBuffers:
        """The bucket's buffers (allocated on first use, then reused: the same tensors every step)."""
        buf = self._buffers.get(bucket)
        if buf is None:
            device = self.cache.device
            size = StepBuffers.size(bucket, self.width)
            host = torch.zeros(size, dtype=torch.long)
            if device.type == "cuda":
                host = host.pin_memory()
            dev = torch.zeros(size, dtype=torch.long, device=device) if device.type != "cpu" else host
            buf = StepBuffers(host, dev, bucket, self.width)
            self.fill_padding(buf)
            self._buffers[bucket] = buf
        return buf

    def fill_padding(self, buf: StepBuffers) -> None:
        """Make every row of ``buf`` a padding row (token 0 at position 0 on the scratch page)."""
        self._write(buf, [], [], [], [])

    def fill(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        page_tables: Sequence[Sequence[int]],
        rope_positions: Sequence[int] | None = None,
    ) -> StepBuffers:
        """Write n decode rows (padded to their bucket) into the bucket's buffers: one host write,
        one upload. Raises ValueError (before touching the device) for a position the step cannot feed.
        ``rope_positions``: each row's RoPE position (None: the positions, as for every text token of a
        text model; a vision-language model's sequence with images passes index + its M-RoPE delta)."""
        n = len(tokens)
        if n == 0 or len(positions) != n or len(page_tables) != n:
            raise ValueError(f"a decode step needs one position and page table per token, got {n} tokens")
        if rope_positions is None:
            rope_positions = positions
        elif len(rope_positions) != n:
            raise ValueError(f"a decode step needs one RoPE position per token, got {len(rope_positions)}")
        elif any(not 0 <= r <= p for r, p in zip(rope_positions, positions, strict=True)):
            # M-RoPE positions run at or behind token indices (an image advances them by max(h, w) of its
            # t * h * w tokens): so the table check of ``positions`` covers them
            raise ValueError(f"RoPE positions {list(rope_positions)} must lie in [0, position]")
        top = max(positions)
        if top >= self.width * PAGE_SIZE:  # the model's own messages, checked here on the host
            raise ValueError(f"position {top} exceeds the page table's {self.width * PAGE_SIZE} positions")
        rope = getattr(self.model, "rope", None)
        if rope is not None:
            rope.check_top(top)
        buf = self.buffers(self.bucket(n))
        self._write(buf, tokens, positions, page_tables, rope_positions)
        return buf

    def _write(self, buf: StepBuffers, tokens, positions, page_tables, rope_positions=None) -> None:
        b, n, width = buf.batch, len(tokens), self.width
        rope_positions = positions if rope_positions is None else rope_positions  # a text row's: its position
        if any(len(pages) > width for pages in page_tables):
            raise ValueError(f"a page table of more than {width} pages (the step's width)")
        head = HEAD_ROWS * b
        flat = [0] * head
        flat[:n] = tokens
        flat[b : b + n] = positions
        flat[2 * b : 3 * b] = range(b)
        flat[3 * b : 3 * b + n] = rope_positions  # padding rows: RoPE position 0, like their position
        if buf.uploaded is not None and not buf.uploaded.query():
            # The previous upload from this pinned buffer must have been read before it is rewritten
            # (normally long done, so no wait: each engine step waits for its sampled tokens).
            buf.uploaded.synchronize()
        buf.host[:head].copy_(torch.tensor(flat, dtype=torch.long))
        changed = self._update_tables(buf, page_tables)
        if buf.device is not buf.host:
            # one upload: the tokens, positions and rows, and the page tables only if this step changed them
            size = buf.host.numel() if changed or not buf.tables_uploaded else head
            buf.device[:size].copy_(buf.host[:size], non_blocking=True)
            buf.tables_uploaded = True
            if buf.uploaded is None:
                buf.uploaded = torch.cuda.Event()
            buf.uploaded.record()

    def _update_tables(self, buf: StepBuffers, page_tables: Sequence[Sequence[int]]) -> bool:
        """Bring ``buf``'s page tables to ``page_tables`` (rows past them: padding, all scratch) by writing
        only the entries that differ from what the rows hold. Returns whether anything was written.

        Per row: unchanged (the common case: one list comparison), grown (only the new pages written), or
        different (admitted, replaced, finished: the row rewritten, and scratch over the old row's extra
        pages). Cost per step: O(real pages) list comparison in C plus O(changed entries) writes."""
        table = buf.table(buf.host)
        if buf.written is None:  # a new buffer: every row a padding row
            table.fill_(self.scratch_page)
            buf.written = [[] for _ in range(buf.batch)]
        changed = False
        for i in range(buf.batch):
            given = page_tables[i] if i < len(page_tables) else []
            old = buf.written[i]
            if given == old:  # (a list compared in C; other sequences of ints are copied first)
                continue
            pages = list(given)  # a copy: the caller's list grows in place between steps
            if pages == old:
                continue
            changed = True
            k = len(old)
            start = k if len(pages) > k and pages[:k] == old else 0  # grown: only the new pages
            if pages[start:]:
                table[i, start : len(pages)] = torch.tensor(pages[start:], dtype=torch.long)
            if len(pages) < k:  # the old row reached further: those entries back to the scratch page
                table[i, len(pages) : k] = self.scratch_page
            buf.written[i] = pages
        return changed

    def forward(self, buf: StepBuffers, max_position: int, positions: Sequence[int]) -> torch.Tensor:
        """Final hidden states [bucket, hidden] of the model over ``buf`` (padding rows included).

        This is the step CUDA graphs capture: it reads only ``buf``'s device tensors, the weights and
        the cache, and calls nothing that reads a device value back. ``max_position`` bounds every
        position in ``buf`` (the real one when eager, ``graph_max_position`` of it under a graph);
        ``positions`` (host, one per row of the bucket) marks the forward as a decode step, so the
        attention plan needs no read-back: the CPU plan groups rows by them, the Triton and SDPA plans
        use only the device positions (a replay feeds other positions than the capture saw).
        """
        view = self.cache.view(buf.page_table, max_position, decode_positions=positions)
        rope = buf.rope_positions
        return self.model(
            buf.tokens, buf.positions, seq_ids=buf.rows, kv_cache=view, text_rope_positions=rope
        )

    @torch.inference_mode()
    def run(
        self,
        tokens: list[int],
        positions: list[int],
        page_tables: list[list[int]],
        rope_positions: list[int] | None = None,
    ) -> torch.Tensor:
        """Hidden states [n, hidden] of n decode rows (row i: tokens[i] at positions[i], pages
        page_tables[i], rotated by rope_positions[i]; None: by positions[i])."""
        buf = self.fill(tokens, positions, page_tables, rope_positions)
        padded = list(positions) + [0] * (buf.batch - len(positions))
        return self.forward(buf, max(positions), padded)[: len(tokens)]
