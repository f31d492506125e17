"""The decode step's page tables are kept in its bucket buffers between steps and updated by the entries that
changed: after every step of a run with admissions, growth by a page, finishes, reordering, a page replaced in
place (copy-on-write of a shared page) and a bucket change, each bucket's table equals the one rebuilt from
scratch (real rows: their pages, then the scratch page; padding rows: all scratch), and so do the tokens,
positions, rows and RoPE positions. A step that changes no page table does not rewrite one."""

from __future__ import annotations

import torch

from rz_agents.engine.decode_step import DecodeStep
from rz_agents.model.kv_cache import KVCache

SCRATCH = 99


def _step(tiny_model, width: int = 6) -> DecodeStep:
    model = tiny_model()
    cache = KVCache(model.config, num_pages=4, device="cpu")
    return DecodeStep(model, cache, max_batch=8, width=width, scratch_page=SCRATCH)


def _rebuilt(buf, tokens, positions, tables) -> torch.Tensor:
    """What the buffer must hold: the step's metadata written from scratch."""
    b, w = buf.batch, buf.width
    flat = [0] * (4 * b)  # tokens, positions, rows, RoPE positions (a text model's: its positions)
    flat[: len(tokens)] = tokens
    flat[b : b + len(positions)] = positions
    flat[2 * b : 3 * b] = range(b)
    flat[3 * b : 3 * b + len(positions)] = positions
    table = [SCRATCH] * (b * w)
    for i, pages in enumerate(tables):
        table[i * w : i * w + len(pages)] = pages
    return torch.tensor(flat + table)


def test_page_tables_updated_in_place_equal_the_rebuilt_ones_across_a_run(tiny_model):
    step = _step(tiny_model)
    a, b, c, d = [0, 1], [2], [3, 4, 5], [6]  # each sequence's page list, mutated like the scheduler does
    runs = [
        ([a, b], "admitted"),
        ([a, b], "unchanged"),
        ([a, b, c], "admitted: c"),
        ([a, b, c], "grown"),  # (a gets a page below)
        ([a, c], "b finished: c moves up a row"),
        ([c, a, d], "reordered, d admitted"),
        ([c, a, d], "a's last page replaced in place"),
        ([d], "two finished: a smaller bucket"),
        ([a, b, c, d, [7], [8], [9, 10]], "a larger bucket"),
        ([[7]], "back to bucket 1: its old rows are stale"),
    ]
    for tables, what in runs:
        if what == "grown":
            a.append(11)
        if what.startswith("a's last page"):
            a[-1] = 12
        tokens = list(range(5, 5 + len(tables)))
        positions = [64 * len(t) - 3 for t in tables]
        buf = step.fill(tokens, positions, tables)
        assert torch.equal(buf.host, _rebuilt(buf, tokens, positions, tables)), what


def test_a_step_that_changes_no_page_table_writes_none(tiny_model, monkeypatch):
    step = _step(tiny_model)
    tables = [[0, 1], [2]]
    step.fill([1, 2], [70, 10], tables)
    writes = []
    real = torch.Tensor.__setitem__

    def counting(self, key, value):
        writes.append(key)
        return real(self, key, value)

    monkeypatch.setattr(torch.Tensor, "__setitem__", counting)
    step.fill([3, 4], [71, 11], tables)
    assert writes == []  # the tokens and positions are one copy, the page tables untouched
    tables[0].append(5)
    step.fill([3, 4], [128, 12], tables)
    assert len(writes) == 1  # one slice: the new page of the grown row
