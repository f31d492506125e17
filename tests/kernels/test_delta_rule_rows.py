"""The delta rule's row path: a one-token decode computes only its own row of the chunk (delta_rule_rows),
and every decode token is torch.equal to the learner's packed forward at every offset within a chunk, for
Gated DeltaNet (a scalar decay) and KDA (a decay per key channel), fp32 and bf16, without recomputing the
chunk; batches, branches and chunk ends keep the bits. Negative control: the same rows computed as 1-3 row
GEMMs round differently, the check (`verify_rows`) sees it and decoding falls back to the chunk path."""

import dataclasses

import pytest
import torch

import rz_kernels.delta_rule as dr
import rz_kernels.delta_rule_rows as rows_mod
from rz_kernels.delta_rule import CHUNK, gated_delta_rule, l2_normalize, verify_rows

pytestmark = pytest.mark.usefixtures("one_torch_thread")

H, DK, DV = 2, 16, 8
KINDS = ["gdn", "kda"]


def _inputs(seed: int, t: int, kind: str, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(t, H, DK, generator=gen))
    k = l2_normalize(torch.randn(t, H, DK, generator=gen))
    v = torch.randn(t, H, DV, generator=gen)
    g = -0.3 * torch.rand(t, H, *((DK,) if kind == "kda" else ()), generator=gen)
    beta = torch.rand(t, H, generator=gen)
    return tuple(x.to(dtype) for x in (q, k, v, g, beta))


def _cut(xs, a, b):
    return tuple(x[a:b] for x in xs)


def _cat(*parts):
    return tuple(torch.cat(xs) for xs in zip(*parts, strict=True))


@pytest.fixture
def chunk_calls(monkeypatch):
    """How many sequences each chunk-path call recomputed (the row path must leave this empty)."""
    for kind in KINDS:  # the row path's check runs the chunk path: settle it before counting
        gated_delta_rule(*_inputs(99, 3, kind), [3], keep_caches=True)
    calls = []
    inner = dr._chunked

    def spy(xs, seq_lens, caches, keep_caches, rows):
        calls.append(len(seq_lens))
        return inner(xs, seq_lens, caches, keep_caches, rows)

    monkeypatch.setattr(dr, "_chunked", spy)
    return calls


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_tokens_equal_the_packed_forward_at_every_offset_without_recomputing_the_chunk(
    kind, dtype, chunk_calls
):
    t = CHUNK + 9
    xs, other = _inputs(0, t, kind, dtype), _inputs(1, 11, kind, dtype)
    packed, _ = gated_delta_rule(*_cat(other, xs), [11, t])  # the learner's pack, another sequence first
    full = packed[11:]
    cache, outs, stores = None, [], set()
    for i in range(t):  # offsets 0 .. CHUNK - 1, the chunk's end, then the next chunk's first tokens
        out, (cache,) = gated_delta_rule(*_cut(xs, i, i + 1), [1], [cache], keep_caches=True)
        assert torch.equal(out, full[i : i + 1]), i
        outs.append(out)
        stores.add(id(cache.rows.store))
    assert chunk_calls == [2]  # the packed forward (two sequences) only: every step took the row path
    assert len(stores) == 1  # and continued one store in place
    assert torch.equal(torch.cat(outs), full) and cache.pending == t - CHUNK


@pytest.mark.parametrize("kind", KINDS)
def test_decode_after_prefills_cut_in_every_solve_block_in_one_batch(kind, chunk_calls):
    cuts = [1, 15, 16, 33, 47, 63]  # each solve block (16 rows), its edges, the chunk's last row
    t = CHUNK + 4
    seqs = [_inputs(10 + i, t, kind) for i in range(len(cuts))]
    fulls = [gated_delta_rule(*xs, [t])[0] for xs in seqs]
    _, caches = gated_delta_rule(
        *_cat(*(_cut(xs, 0, c) for xs, c in zip(seqs, cuts, strict=True))), cuts, keep_caches=True
    )
    chunk_calls.clear()
    pos = list(cuts)
    while min(pos) < t:  # one token per sequence per step, each at its own offset
        live = [s for s, p in enumerate(pos) if p < t]
        step = _cat(*(_cut(seqs[s], pos[s], pos[s] + 1) for s in live))
        out, new = gated_delta_rule(*step, [1] * len(live), [caches[s] for s in live], keep_caches=True)
        for j, s in enumerate(live):
            assert torch.equal(out[j], fulls[s][pos[s]]), (s, pos[s])
            caches[s] = new[j]
            pos[s] += 1
    assert chunk_calls == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_cache_continued_twice_keeps_both_branches_exact(kind, chunk_calls):
    xs, ys = _inputs(20, 40, kind), _inputs(21, 40, kind)
    _, (cache,) = gated_delta_rule(*_cut(xs, 0, 30), [30], keep_caches=True)
    full_x, full_y = (
        gated_delta_rule(*xs, [40])[0],
        gated_delta_rule(*_cat(_cut(xs, 0, 30), _cut(ys, 30, 40)), [40])[0],
    )
    chunk_calls.clear()
    a, b = cache, cache
    for i in range(30, 40):  # branch x and branch y, interleaved, both from `cache`
        out_a, (a,) = gated_delta_rule(*_cut(xs, i, i + 1), [1], [a], keep_caches=True)
        out_b, (b,) = gated_delta_rule(*_cut(ys, i, i + 1), [1], [b], keep_caches=True)
        assert torch.equal(out_a, full_x[i : i + 1]) and torch.equal(out_b, full_y[i : i + 1]), i
    again, _ = gated_delta_rule(*_cut(xs, 30, 31), [1], [cache], keep_caches=True)  # the original still holds
    assert torch.equal(again, full_x[30:31]) and chunk_calls == []
    # a multi-token call continues a row-path cache through the chunk path (the cache keeps its inputs)
    mid = cache
    for i in range(30, 35):
        _, (mid,) = gated_delta_rule(*_cut(ys, i, i + 1), [1], [mid], keep_caches=True)
    rest, _ = gated_delta_rule(*_cut(ys, 35, 40), [5], [mid])
    assert torch.equal(rest, full_y[35:40])


@pytest.mark.parametrize("kind", KINDS)
def test_negative_control_one_row_gemms_differ_and_the_check_falls_back_to_chunks(kind, monkeypatch):
    t = 40
    xs = _inputs(30, t, kind)
    full, _ = gated_delta_rule(*xs, [t])
    monkeypatch.setattr(rows_mod, "TILE_ROWS", 1)  # a row as a 1-row GEMM: MKL sums it in another order
    monkeypatch.setattr(dr, "_row_verdicts", {})
    for form in dr.ROW_FORMS:
        cache, forced = None, []
        for i in range(t):
            out, (cache,) = dr._gated_delta_rule(*_cut(xs, i, i + 1), [1], [cache], None, True, form)
            forced.append(out)
        assert not torch.equal(torch.cat(forced), full), form  # the row path alone would break the bits
        assert not verify_rows(DK, DV, kind == "kda", form=form)  # which the check sees
    cache, outs = None, []
    for i in range(t):
        out, (cache,) = gated_delta_rule(*_cut(xs, i, i + 1), [1], [cache], keep_caches=True)
        outs.append(out)
    assert torch.equal(torch.cat(outs), full) and cache.rows is None  # decoded by chunks instead


def test_rows_can_be_left_out_and_the_row_path_turned_off(chunk_calls):
    xs = _inputs(40, 20, "gdn")
    full, _ = gated_delta_rule(*xs, [20])
    _, (kept,) = gated_delta_rule(*_cut(xs, 0, 10), [10], keep_caches=True)
    _, (bare,) = gated_delta_rule(*_cut(xs, 0, 10), [10], keep_caches=True, keep_rows=False)
    assert kept.rows is not None and bare.rows is None
    off, (c,) = gated_delta_rule(*_cut(xs, 10, 11), [1], [kept], keep_caches=True, row_decode=False)
    assert torch.equal(off, full[10:11]) and c.rows is None
    chunk_calls.clear()
    on, _ = gated_delta_rule(*_cut(xs, 10, 11), [1], [bare], keep_caches=True)  # no rows: by chunks
    assert torch.equal(on, full[10:11]) and chunk_calls == [1]


def test_replaced_state_or_inputs_are_not_decoded_from_stale_rows():
    xs = _inputs(50, 12, "gdn")
    _, (cache,) = gated_delta_rule(*_cut(xs, 0, 11), [11], keep_caches=True)
    assert dr._row_ready(1, cache)
    assert not dr._row_ready(1, dataclasses.replace(cache, state=cache.state.clone()))
    assert not dr._row_ready(1, dataclasses.replace(cache, k=cache.k.clone()))
    assert not dr._row_ready(2, cache)


@pytest.mark.parametrize("kind", KINDS)
def test_the_row_path_is_verified_at_model_shapes_on_this_machine(kind):
    # Qwen3.5 / Kimi Linear heads (128 x 128): the decode speed-up needs the check to pass here
    assert verify_rows(128, 128, kind == "kda")


def test_mixed_call_decode_tokens_beside_a_prefill_chunk():
    lens = [CHUNK + 9, 5, 70]
    seqs = [_inputs(60 + i, n + 50, "kda") for i, n in enumerate(lens)]
    _, caches = gated_delta_rule(
        *_cat(*(_cut(xs, 0, n) for xs, n in zip(seqs, lens, strict=True))), lens, keep_caches=True
    )
    step = _cat(
        _cut(seqs[0], lens[0], lens[0] + 1), _cut(seqs[1], lens[1], lens[1] + 50), _cut(seqs[2], 70, 71)
    )
    out, new = gated_delta_rule(*step, [1, 50, 1], caches, keep_caches=True)
    fulls = [
        gated_delta_rule(*_cut(xs, 0, n + 1), [n + 1])[0]
        for xs, n in zip(seqs, [lens[0], 54, 70], strict=True)
    ]
    assert torch.equal(out[0], fulls[0][-1]) and torch.equal(out[51], fulls[2][-1])
    assert torch.equal(out[1:51], fulls[1][5:55])
    assert [c.pending for c in new] == [(n + m) % CHUNK for n, m in zip(lens, [1, 50, 1], strict=True)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_cache_kept_across_its_chunk_end_keeps_its_inputs_and_its_bits(kind, chunk_calls):
    t = CHUNK + 6
    xs, ys = _inputs(70, t, kind), _inputs(71, t, kind)
    full_x = gated_delta_rule(*xs, [t])[0]
    full_y = gated_delta_rule(*_cat(_cut(xs, 0, 60), _cut(ys, 60, t)), [t])[0]
    chunk_calls.clear()
    cache = None
    for i in range(60):
        _, (cache,) = gated_delta_rule(*_cut(xs, i, i + 1), [1], [cache], keep_caches=True)
    kept, inputs = cache, [getattr(cache, n).clone() for n in ("k", "v", "g", "beta")]
    for i in range(60, t):  # past the chunk's end: its slot starts chunk 1 in place
        out, (cache,) = gated_delta_rule(*_cut(xs, i, i + 1), [1], [cache], keep_caches=True)
        assert torch.equal(out, full_x[i : i + 1]), i
    assert all(torch.equal(getattr(kept, n), x) for n, x in zip(("k", "v", "g", "beta"), inputs, strict=True))
    assert chunk_calls == []
    branch = kept
    for i in range(60, t):  # the kept cache still continues exactly (another branch)
        out, (branch,) = gated_delta_rule(*_cut(ys, i, i + 1), [1], [branch], keep_caches=True)
        assert torch.equal(out, full_y[i : i + 1]), i
    assert chunk_calls == [1]  # its rows expired with the slot's chunk: one recompute, then rows again
