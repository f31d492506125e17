"""The hybrid cache keeps fewer delta-rule state snapshots than pages (model/qwen3_5_snapshots.py): a forward
resumes from the latest kept snapshot and recomputes the chunks after it from their kept inputs, bit for bit.
Checked on the model's paged forward (a resume through an intermediate snapshot, a pool of one slot that
evicts, and a negative control that corrupts the snapshot it resumes from) and through the engine (prefix
reuse and preemption at one snapshot per 1, 2 and 4 pages)."""

from __future__ import annotations

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, generate_batch
from rz_agents.model.kv_cache import PAGE_SIZE
from rz_agents.model.qwen3_5_cache import HybridCache, hybrid_bytes_per_page
from tests.engine.test_engine_qwen3_5_alignment import _assert_equal, _model, _params, _prompts


def _paged_logits(model, cache, table, tokens, start):
    """Logits of ``tokens`` fed at positions start.. to one sequence whose pages are ``table``."""
    n = len(tokens)
    view = cache.view(torch.tensor([table]), start + n - 1)
    with torch.no_grad():
        hidden = model(
            torch.tensor(tokens),
            positions=torch.arange(start, start + n),
            seq_ids=torch.zeros(n, dtype=torch.long),
            kv_cache=view,
        )
        return model.logits(hidden)


def _reference(model, tokens):
    with torch.no_grad():
        return model.logits(model(torch.tensor(tokens), seq_lens=[len(tokens)]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_resume_through_an_intermediate_snapshot_is_exact(dtype):
    model = _model(dtype)
    cache = HybridCache(model.config, num_pages=8, snapshot_every=2, dtype=model.lm_head.weight.dtype)
    (a,) = _prompts([300], seed=7)
    _paged_logits(model, cache, list(range(8)), a, 0)  # chunks 0..3 complete: anchors 1 and 3 kept
    kept = [p for p in range(8) if cache.slots.slot(p) is not None]
    assert kept == [1, 3]
    # B shares A's first three pages (192 tokens) and continues elsewhere: its resume point (after chunk 2)
    # has no snapshot, so chunk 2 is recomputed from page 1's
    b = a[:192] + _prompts([70], seed=8)[0]
    got = _paged_logits(model, cache, [0, 1, 2, 6, 7], b[192:], 192)
    assert torch.equal(got, _reference(model, b)[192:])


def test_negative_control_a_corrupted_snapshot_moves_the_resumed_logits():
    model = _model()
    cache = HybridCache(model.config, num_pages=8, snapshot_every=2)
    (a,) = _prompts([300], seed=7)
    _paged_logits(model, cache, list(range(8)), a, 0)
    slot = cache.slots.slot(1)
    for state in cache.state.values():
        state[slot].mul_(1.01)
    b = a[:192] + _prompts([70], seed=8)[0]
    got = _paged_logits(model, cache, [0, 1, 2, 6, 7], b[192:], 192)
    assert (got - _reference(model, b)[192:]).abs().max() > 1e-3


def test_one_slot_evicts_and_every_resume_still_recomputes_exactly():
    model = _model()
    cache = HybridCache(model.config, num_pages=7, snapshot_every=8)  # 7 // 8 -> one slot
    assert cache.slots.num_slots == 1
    a, b = _prompts([200, 190], seed=9)
    # two sequences fed in pieces, interleaved: each one's write evicts the other's snapshot
    pages = {0: [0, 1, 2, 3], 1: [4, 5, 6]}
    cuts = {0: [0, 70, 150, 200], 1: [0, 100, 180, 190]}
    out = {0: [], 1: []}
    for step in range(3):
        for s, seq in ((0, a), (1, b)):
            lo, hi = cuts[s][step], cuts[s][step + 1]
            out[s].append(_paged_logits(model, cache, pages[s], seq[lo:hi], lo))
    assert torch.equal(torch.cat(out[0]), _reference(model, a))
    assert torch.equal(torch.cat(out[1]), _reference(model, b))


@pytest.mark.parametrize("every", [1, 2, 4])
def test_engine_prefix_reuse_and_preemption_are_exact_at_any_snapshot_spacing(every):
    model = _model()
    model.snapshot_every = every
    engine = RZEngine(model, EngineConfig(max_len=512, max_batch_tokens=96, num_threads=1))
    (base,) = _prompts([300], seed=10)
    first = generate_batch(engine, [base], _params(1))
    prompts = [base[:200] + _prompts([20], seed=11)[0], base + first[0].tokens[:3]]
    outs = generate_batch(engine, prompts, _params(2))
    assert engine.stats()["prefix_tokens_reused"] >= 192 + 256
    _assert_equal(model, [base, *prompts], [*first, *outs])
    # preemption: 8 pages (and the scratch page) for four sequences growing to 11, the newest recompute
    page = model.kv_page_bytes()
    small = RZEngine(model, EngineConfig(max_len=320, max_batch_tokens=64, kv_cache_bytes=9 * page))
    prompts = _prompts([100, 120, 110, 60], seed=12)
    outs = generate_batch(small, prompts, _params(4, max_tokens=60))
    assert small.stats()["preemptions"] > 0
    _assert_equal(model, prompts, outs)


def test_the_4b_page_shrinks_from_74_to_38_mib():
    from rz_agents.model.presets import preset_config

    config = preset_config("qwen3.5-4b")
    before, after = hybrid_bytes_per_page(config, snapshot_every=1), hybrid_bytes_per_page(config)
    assert (before / 2**20, after / 2**20) == (74.375, 38.375)
    assert PAGE_SIZE == 64
