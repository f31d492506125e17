#!/usr/bin/env python3
"""Host time of one decode step's metadata write (DecodeStep.fill) against the former per-step rebuild of
every page-table entry (batch x width Python list, then one tensor), on CPU.

    python3 scripts/bench_page_table_fill.py  # batches 48 and 256, width 256 (max_len 16K), 2K context

The decode rows hold 2K context (32 pages); a page is added to one row per step (the steady state: each row
crosses a page boundary every 64 tokens)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "kernels")]

import torch  # noqa: E402

from rz_agents.engine.decode_step import DecodeStep  # noqa: E402
from rz_agents.model import ModelConfig, Transformer  # noqa: E402
from rz_agents.model.kv_cache import KVCache  # noqa: E402


def rebuild(buf, scratch, tokens, positions, page_tables) -> None:
    """The former DecodeStep._write: the whole buffer rebuilt from Python lists every step."""
    b, n, width = buf.batch, len(tokens), buf.width
    flat = [0] * (3 * b)
    flat[:n] = tokens
    flat[b : b + n] = positions
    flat[2 * b : 3 * b] = range(b)
    table = [scratch] * (b * width)
    for i, pages in enumerate(page_tables):
        table[i * width : i * width + len(pages)] = pages
    buf.host.copy_(torch.tensor(flat + table, dtype=torch.long))


def main() -> None:
    torch.set_num_threads(1)
    model = Transformer(ModelConfig.tiny("qwen3", max_position_embeddings=16384))
    cache = KVCache(model.config, num_pages=2, device="cpu")
    width, context_pages, steps = 256, 32, 200
    for batch in (48, 256):
        step = DecodeStep(model, cache, max_batch=batch, width=width, scratch_page=1)
        tables = [list(range(i * width, i * width + context_pages)) for i in range(batch)]
        tokens, positions = [1] * batch, [64 * context_pages - 1] * batch
        step.fill(tokens, positions, tables)
        buf = step.buffers(step.bucket(batch))
        times = {}
        for label in ("incremental", "rebuild"):
            t0 = time.perf_counter()
            for s in range(steps):
                tables[s % batch].append(10**6 + s)  # one row grows by a page
                if label == "incremental":
                    step.fill(tokens, positions, tables)
                else:
                    rebuild(buf, 1, tokens, positions, tables)
            times[label] = (time.perf_counter() - t0) / steps * 1e3
            for s in range(steps):  # back to the same state for the other
                tables[s % batch].pop()
            step.fill(tokens, positions, tables)
        print(
            f"batch {batch}, width {width}, {context_pages} pages a row: incremental "
            f"{times['incremental']:.3f} ms, rebuild {times['rebuild']:.3f} ms per step"
        )


if __name__ == "__main__":
    main()
