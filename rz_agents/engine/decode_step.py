"""The decode step over static buffers: the batch padded to a bucket, shapes fixed per bucket.

One function (``DecodeStep.run``) runs a decode-only step (one new token per sequence) over
buffers allocated once per bucket: tokens, positions, page-table rows and the page tables (width:
the pages of max_len). The host fills them in one copy; the model then sees the same shapes,
addresses and metadata layout every time a bucket repeats, which is what CUDA-graph capture needs
(capture and replay are GPU-only; this step runs on every device, so its padding is tested here).

Padding rows are sequences of their own: token 0 at position 0, whose page-table row points at a
scratch page outside the page pool. Their K/V go to the scratch page, they attend only to it, and
the aligned op set makes every row's result independent of the other rows in the call (batch
invariance), so padding changes no bit of the real rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rz_agents.model.kv_cache import KVCache


def decode_buckets(max_batch: int) -> list[int]:
    """Batch sizes a decode step is padded to: 1, 2, 4, then multiples of 8, and max_batch itself."""
    sizes = {b for b in (1, 2, 4) if b < max_batch} | set(range(8, max_batch, 8)) | {max_batch}
    return sorted(sizes)


@dataclass
class _Buffers:
    """One bucket's inputs: [tokens B | positions B | rows B | page table B x W], one int64 block."""

    host: torch.Tensor  # staging (pinned on CUDA)
    device: torch.Tensor  # the same on the model's device: the model reads views of it
    batch: int
    width: int

    def part(self, t: torch.Tensor, i: int) -> torch.Tensor:
        return t[i * self.batch : (i + 1) * self.batch]

    def table(self, t: torch.Tensor) -> torch.Tensor:
        return t[3 * self.batch :].view(self.batch, self.width)


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
        self._buffers: dict[int, _Buffers] = {}

    def bucket(self, n: int) -> int:
        """The smallest bucket holding n rows."""
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"decode batch {n} exceeds the largest bucket {self.buckets[-1]}")

    def _get(self, bucket: int) -> _Buffers:
        buf = self._buffers.get(bucket)
        if buf is None:
            device = self.cache.device
            size = bucket * (3 + self.width)
            host = torch.zeros(size, dtype=torch.long)
            if device.type == "cuda":
                host = host.pin_memory()
            dev = torch.zeros(size, dtype=torch.long, device=device) if device.type != "cpu" else host
            buf = _Buffers(host, dev, bucket, self.width)
            self._buffers[bucket] = buf
        return buf

    @torch.inference_mode()
    def run(self, tokens: list[int], positions: list[int], page_tables: list[list[int]]) -> torch.Tensor:
        """Hidden states [n, hidden] of n decode rows (row i: tokens[i] at positions[i], pages page_tables[i])."""
        n = len(tokens)
        b = self.bucket(n)
        buf = self._get(b)
        flat = [0] * (3 * b)
        flat[:n] = tokens
        flat[b : b + n] = positions
        flat[2 * b : 3 * b] = range(b)
        table = [self.scratch_page] * (b * self.width)
        for i, pages in enumerate(page_tables):
            table[i * self.width : i * self.width + len(pages)] = pages
        buf.host.copy_(torch.tensor(flat + table, dtype=torch.long))
        if buf.device is not buf.host:
            buf.device.copy_(buf.host, non_blocking=True)  # one upload of the whole step's metadata
        d = buf.device
        hidden = self.model(
            buf.part(d, 0),
            buf.part(d, 1),
            seq_ids=buf.part(d, 2),
            kv_cache=self.cache.view(buf.table(d), max(positions)),
        )
        return hidden[:n]
