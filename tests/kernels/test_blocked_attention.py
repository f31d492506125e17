"""Blocked attention: small decode tiles, long spans, the tile-size guard, gradients."""

import pytest
import torch

from rz_kernels import attention as attn


def blocked(q, k, v, seq, pos, scale=0.25):
    return attn.blocked_attention(q, k, v, attn.plan_blocked(seq, pos, q.shape[1], k.shape[1]), scale)


def _case(gen, t, h=8, hkv=2, d=16, seqs=3, length=1216):
    return (
        torch.randn(t, h, d, generator=gen),
        torch.randn(seqs, hkv, length, d, generator=gen),
        torch.randn(seqs, hkv, length, d, generator=gen),
    )


@pytest.fixture
def fresh_guard():
    attn.clear_tile_verdicts()
    yield
    attn.clear_tile_verdicts()


def test_long_span_decode_rows_equal_the_prefill_rows_and_a_crowded_batch():
    # 1,200 keys: tiles past IN_PLACE_BLOCKS read K/V in place; short tiles are gathered in batches.
    gen = torch.Generator().manual_seed(0)
    q, k, v = _case(gen, 1200)
    seq = torch.zeros(1200, dtype=torch.long)
    full = blocked(q, k, v, seq, torch.arange(1200))
    for p in (0, 5, 1023, 1024, 1199):
        assert torch.equal(blocked(q[p : p + 1], k, v, seq[:1], torch.tensor([p]))[0], full[p])
    # the same rows decoded next to other sequences (short and long ones) in one call
    crowd_q = torch.cat([q[1199:1200], torch.randn(3, 8, 16, generator=gen), q[5:6]])
    crowd_seq = torch.tensor([0, 1, 2, 1, 0])
    crowd_pos = torch.tensor([1199, 30, 700, 31, 5])
    crowd = blocked(crowd_q, k, v, crowd_seq, crowd_pos)
    assert torch.equal(crowd[0], full[1199]) and torch.equal(crowd[4], full[5])
    chunks = torch.cat(
        [blocked(q[i : i + 300], k, v, seq[:300], torch.arange(i, i + 300)) for i in range(0, 1200, 300)]
    )
    assert torch.equal(chunks, full)


@pytest.mark.parametrize("heads,kv_heads", [(8, 8), (8, 2), (16, 1)])
def test_decode_equals_prefill_for_any_group_size(heads, kv_heads):
    gen = torch.Generator().manual_seed(1)
    q, k, v = _case(gen, 140, h=heads, hkv=kv_heads, length=192)
    seq = torch.zeros(140, dtype=torch.long)
    full = blocked(q, k, v, seq, torch.arange(140))
    for p in (0, 63, 64, 139):
        assert torch.equal(blocked(q[p : p + 1], k, v, seq[:1], torch.tensor([p]))[0], full[p])


def test_decode_tile_is_smaller_than_the_old_16_row_tile():
    plan = attn.plan_blocked(torch.tensor([0, 1]), torch.tensor([70, 9]), 8, 4)
    assert all(b.rows == 4 for b in plan.buckets(64))  # group 2 -> 4 rows, not 16


def test_guard_failure_pads_every_tile_to_the_fixed_size_and_stays_invariant(monkeypatch, fresh_guard):
    monkeypatch.setattr(attn, "_check_tile_rows", lambda d, rows: (False, [4]))
    plan = attn.plan_blocked(torch.tensor([0]), torch.tensor([70]), 8, 4)
    assert all(b.rows == attn.FIXED_TILE_ROWS for b in plan.buckets(16))
    gen = torch.Generator().manual_seed(2)
    q, k, v = _case(gen, 100, h=8, hkv=4, length=128)
    seq = torch.zeros(100, dtype=torch.long)
    full = blocked(q, k, v, seq, torch.arange(100))
    for p in (0, 64, 99):
        assert torch.equal(blocked(q[p : p + 1], k, v, seq[:1], torch.tensor([p]))[0], full[p])


def test_tile_guard_accepts_this_blas_from_four_rows(fresh_guard):
    assert attn.verify_tile_rows(16, 64)


@pytest.fixture
def flash_backward(request):
    attn.set_flash_backward(request.param)
    yield request.param
    attn.set_flash_backward(True)


@pytest.mark.parametrize("flash_backward", [True, False], indirect=True, ids=["flash", "tiles"])
def test_gradients_match_sdpa(flash_backward):
    # seq 2's queries start at position 30 (a chunk over earlier keys); seq 1 has no queries (zero grads)
    gen = torch.Generator().manual_seed(3)
    q, k, v = _case(gen, 150, h=4, hkv=2, length=192)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    seq = torch.tensor([0] * 60 + [2] * 90)
    pos = torch.cat([torch.arange(60), torch.arange(30, 120)])
    out = blocked(q, k, v, seq, pos)
    g = torch.randn(out.shape, generator=gen)
    out.backward(g)
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    ref = attn.sdpa_attention(q2, k2, v2, attn.plan_sdpa(seq, pos, 4, 2), 0.25)
    ref.backward(g)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_tree_sum_ignores_trailing_zero_blocks():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 5, 3, generator=gen)
    ref = attn._tree_sum(x)
    for extra in (1, 3, 11):
        padded = torch.cat([x, torch.zeros(2, extra, 3)], dim=1)
        assert torch.equal(attn._tree_sum(padded), ref)
    # Negative control: a sequential sum of the same blocks rounds differently somewhere.
    y = torch.randn(64, 37, 16, generator=gen)
    seq = y[:, 0]
    for j in range(1, 37):
        seq = seq + y[:, j]
    assert not torch.equal(attn._tree_sum(y), seq)


def _paged(k, v, gen, spare=5):
    """The same K/V as pages [P, Hkv, 64, D] scattered in random order, plus the page table."""
    s, hkv, length, d = k.shape
    width = length // attn.KEY_BLOCK
    perm = torch.randperm(s * width + spare, generator=gen)
    table = perm[: s * width].view(s, width)
    kp = torch.randn(s * width + spare, hkv, attn.KEY_BLOCK, d, generator=gen)  # stale pages
    vp = torch.randn(s * width + spare, hkv, attn.KEY_BLOCK, d, generator=gen)
    for i in range(s):
        for j in range(width):
            kp[table[i, j]] = k[i, :, j * 64 : (j + 1) * 64]
            vp[table[i, j]] = v[i, :, j * 64 : (j + 1) * 64]
    return kp, vp, table


@pytest.mark.parametrize("standard", [False, True])
def test_scattered_pages_give_the_bits_of_the_contiguous_buffer(standard):
    gen = torch.Generator().manual_seed(5)
    q, k, v = _case(gen, t=70)
    kp, vp, table = _paged(k, v, gen)
    # a crowded mixed batch: a 30-token chunk late in sequence 0 (long span, read tile by tile),
    # a decode of sequence 1, a prefill of sequence 2
    seq = torch.tensor([0] * 30 + [1] + [2] * 39)
    pos = torch.cat([torch.arange(1100, 1130), torch.tensor([700]), torch.arange(39)])
    plan, run = (
        (attn.plan_sdpa, attn.sdpa_attention) if standard else (attn.plan_blocked, attn.blocked_attention)
    )
    dense = run(q, k, v, plan(seq, pos, 8, 2), 0.25)
    paged = run(q, kp, vp, plan(seq, pos, 8, 2, page_table=table), 0.25)
    assert torch.equal(paged, dense)
    kp2, vp2, table2 = _paged(k, v, gen, spare=11)  # another placement, other stale pages
    assert not torch.equal(table2, table)
    assert torch.equal(run(q, kp2, vp2, plan(seq, pos, 8, 2, page_table=table2), 0.25), dense)


def test_the_decode_layout_grouped_on_the_host_gives_the_general_layouts_bits():
    # One query per sequence (a decode step), positions in several key-block counts, pages scattered:
    # the layout grouped from host positions (no unique / nonzero / read-back) == the general layout.
    gen = torch.Generator().manual_seed(8)
    k = torch.randn(14, 2, 64, 16, generator=gen)
    v = torch.randn(14, 2, 64, 16, generator=gen)
    table = torch.randperm(14, generator=gen)[:12].view(4, 3)
    q = torch.randn(4, 8, 16, generator=gen)
    seq, pos = torch.tensor([0, 1, 2, 3]), torch.tensor([150, 5, 63, 64])
    general = attn.plan_blocked(seq, pos, 8, 2, page_table=table)
    decode = attn.plan_blocked(seq, pos, 8, 2, page_table=table, decode_positions=(150, 5, 63, 64))
    assert [(b.rows, b.num_blocks) for b in decode.buckets(16)] == [
        (b.rows, b.num_blocks) for b in general.buckets(16)
    ]
    for a, b in zip(decode.buckets(16), general.buckets(16), strict=True):
        for name in ("tile_seq", "tile_head", "row_index", "row_pos"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    out = attn.blocked_attention(q, k, v, decode, 0.25)
    assert torch.equal(out, attn.blocked_attention(q, k, v, general, 0.25))
    sdpa = attn.plan_sdpa(
        seq, pos, 8, 2, page_table=table, max_position=150, decode_positions=(150, 5, 63, 64)
    )
    ref = attn.sdpa_attention(q, k, v, attn.plan_sdpa(seq, pos, 8, 2, page_table=table), 0.25)
    assert torch.equal(attn.sdpa_attention(q, k, v, sdpa, 0.25), ref)


def test_the_backward_runs_the_flash_kernel_and_leaves_the_forward_bits_alone():
    gen = torch.Generator().manual_seed(4)
    q, k, v = _case(gen, 150, h=6, hkv=2, length=192)
    seq = torch.tensor([0] * 60 + [2] * 90)
    pos = torch.cat([torch.arange(60), torch.arange(30, 120)])
    plan = attn.plan_blocked(seq, pos, 6, 2)
    g = torch.randn(150, 6, 16, generator=gen)
    grads, outs = {}, {}
    for flash in (True, False):
        attn.set_flash_backward(flash)
        try:
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            outs[flash] = attn.blocked_attention(*leaves, plan, 0.25)
            grads[flash] = torch.autograd.grad(outs[flash], leaves, g)
        finally:
            attn.set_flash_backward(True)
    assert torch.equal(outs[True], outs[False])  # the forward (the aligned bits) does not change
    # the flash path's gradients are the kernel's, bit for bit (lse from the forward's row max and sum)
    _, stats = attn._forward(q, k, v, plan, 0.25, with_stats=True)
    lse = (stats[:, 0] + stats[:, 1].log()).view(150, 6)
    direct = attn.attention_grad.flash_backward(q, k, v, outs[True], lse, g, plan.span_groups(), 0.25)
    for a, b, c in zip(grads[True], direct, grads[False], strict=True):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5)


def test_repeated_query_positions_keep_the_tile_backward():
    # two queries at one (sequence, position) cannot share a grid row: no span groups, the tile backward runs
    seq, pos = torch.tensor([0, 0, 0]), torch.tensor([0, 1, 1])
    assert attn.plan_blocked(seq, pos, 2, 1).span_groups() is None
    gen = torch.Generator().manual_seed(5)
    q, k, v = (x.requires_grad_() for x in _case(gen, 3, h=2, hkv=1, seqs=1, length=64))
    out = blocked(q, k, v, seq, pos)
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()


def test_tiles_of_a_sequence_from_position_zero_each_sit_inside_one_key_block():
    # SmolLM2's shape (9 query heads on 3 kv heads): 64-token tiles of 192 rows, each walking exactly the
    # key blocks up to its own (the old 21-token tiles crossed block boundaries and walked one more block)
    seq = torch.arange(3).repeat_interleave(340)
    plan = attn.plan_blocked(seq, torch.arange(340).repeat(3), 9, 3)
    buckets = plan.buckets(16)  # head_dim 16: the tile-size guard's check stays cheap
    assert max(b.rows for b in buckets) == 192
    padding = 3 * 340 * 9
    for b in buckets:
        real = b.row_index != padding
        assert torch.equal(
            b.row_pos[real] // attn.KEY_BLOCK, torch.full_like(b.row_pos[real], b.num_blocks - 1)
        )


def test_rows_in_any_call_order_see_only_the_keys_up_to_their_own_position():
    # a tile's masked blocks start at its earliest real row, wherever that row sits in the tile
    gen = torch.Generator().manual_seed(9)
    q, k, v = _case(gen, 200, h=6, hkv=2, seqs=1, length=256)
    seq, pos = torch.zeros(200, dtype=torch.long), torch.arange(200)
    full = blocked(q, k, v, seq, pos)
    for order in (torch.arange(199, -1, -1), torch.randperm(200, generator=gen)):
        assert torch.equal(blocked(q[order], k, v, seq, pos[order]), full[order])
    ref = attn.sdpa_attention(q, k, v, attn.plan_sdpa(seq, pos, 6, 2), 0.25)
    torch.testing.assert_close(full, ref, rtol=1e-5, atol=1e-5)


def test_the_tile_masks_are_built_once_per_plan_and_shared_by_the_layers():
    gen = torch.Generator().manual_seed(10)
    q, k, v = _case(gen, 100, h=4, hkv=2, seqs=1, length=128)
    plan = attn.plan_blocked(torch.zeros(100, dtype=torch.long), torch.arange(100), 4, 2)
    first = attn.blocked_attention(q, k, v, plan, 0.25)
    masks = [g.future for b in plan.buckets(16) for g in b.groups]
    assert torch.equal(attn.blocked_attention(q, k, v, plan, 0.25), first)
    assert all(
        a is b for a, b in zip(masks, [g.future for b in plan.buckets(16) for g in b.groups], strict=True)
    )


def _one_call_flash_backward(q, k, v, out, lse, grad_out, seq, pos, groups, scale):
    """The reference: every query head in one kernel call over grids of the whole span, K/V repeated per query
    head, then each kv head's gradient summed over its query heads (the backward before it read K/V in place
    and trimmed the grids' query rows)."""
    op = attn.attention_grad.FLASH_BACKWARD
    t, h, d = q.shape
    hkv = k.shape[1]
    group = h // hkv
    dq, dk, dv = torch.zeros(q.shape), torch.zeros(k.shape), torch.zeros(v.shape)
    for g in groups:
        n = g.seqs.numel()
        rank = torch.full((int(seq.max()) + 1,), -1)
        rank[g.seqs] = torch.arange(n)
        slots = rank[seq[g.tokens]] * g.span + pos[g.tokens]

        def grid(x, g=g, n=n, slots=slots):
            z = torch.zeros(n * g.span, *x.shape[1:]).index_copy_(0, slots, x[g.tokens].float())
            return z.view(n, g.span, *x.shape[1:]).transpose(1, 2)

        kv = [x[g.seqs][:, :, : g.span].float().repeat_interleave(group, dim=1) for x in (k, v)]
        gq, gk, gv = op(grid(grad_out), grid(q), *kv, grid(out), grid(lse).contiguous(), 0.0, True,
                        attn_mask=None, scale=scale)  # fmt: skip
        dq[g.tokens] = gq.transpose(1, 2).reshape(n * g.span, h, d)[slots]
        dk[g.seqs, :, : g.span] = gk.reshape(n, hkv, group, g.span, d).sum(2)
        dv[g.seqs, :, : g.span] = gv.reshape(n, hkv, group, g.span, d).sum(2)
    return dq, dk, dv


@pytest.fixture
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (16, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_flash_backward_reads_kv_in_place_with_the_one_call_bits(heads, kv_heads, dtype, threads):
    # span groups of 64 to 832 keys (grids trimmed to their highest query in each query-block class, spans
    # over the kernel's 512-key block), a sequence without queries, a chunk starting past position 0, and the
    # packed case (every token in one group, the first sequences): gradients bit for bit the one-call ones
    gen = torch.Generator().manual_seed(11)
    cases = [
        (
            torch.tensor([0] * 40 + [2] * 90 + [3] * 20),
            torch.cat([torch.arange(40), torch.arange(30, 120), torch.arange(20)]),
        ),
        (torch.arange(3).repeat_interleave(150), torch.arange(150).repeat(3)),
        (torch.arange(3).repeat_interleave(340), torch.arange(340).repeat(3)),
        (
            torch.tensor([0] * 800 + [1] * 600 + [3] * 300),
            torch.cat([torch.arange(n) for n in (800, 600, 300)]),
        ),
    ]
    for seq, pos in cases:
        t = seq.numel()
        q, out, g = (torch.randn(t, heads, 16, generator=gen).to(dtype) for _ in range(3))
        k, v = (torch.randn(4, kv_heads, 832, 16, generator=gen).to(dtype) for _ in range(2))
        lse = torch.randn(t, heads, generator=gen)
        groups = attn.plan_blocked(seq, pos, heads, kv_heads).span_groups()
        got = attn.attention_grad.flash_backward(q, k, v, out, lse, g, groups, 0.25)
        ref = _one_call_flash_backward(q, k, v, out, lse, g, seq, pos, groups, 0.25)
        for a, b in zip(got, ref, strict=True):
            assert torch.equal(a, b)
