"""Triton attention: close to the CPU reference, prefill = chunked prefill = decode bit for bit, and a
backward that matches autograd through a plain attention."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from rz_kernels import attention as cpu_attention  # noqa: E402
from rz_kernels.triton_ops import attention as ta  # noqa: E402


def triton_attention(q, k, v, seq, pos, scale=0.25):
    return ta.attention(q, k, v, ta.plan_attention(seq, pos, q.shape[1], k.shape[1]), scale)


def reference_attention(q, k, v, seq, pos, scale=0.25):
    """Materialised fp32 causal GQA attention (differentiable)."""
    group = q.shape[1] // k.shape[1]
    kk = k.float().repeat_interleave(group, dim=1)[seq]
    vv = v.float().repeat_interleave(group, dim=1)[seq]
    scores = torch.einsum("thd,thld->thl", q.float(), kk) * scale
    visible = torch.arange(k.shape[2])[None, None, :] <= pos[:, None, None]
    return torch.einsum("thl,thld->thd", scores.masked_fill(~visible, float("-inf")).softmax(-1), vv)


def _case(dtype, t=150, heads=4, kv_heads=2, d=16, seqs=2, length=192, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(t, heads, d, generator=gen).to(dtype)
    k = torch.randn(seqs, kv_heads, length, d, generator=gen).to(dtype)
    v = torch.randn(seqs, kv_heads, length, d, generator=gen).to(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_matches_reference(dtype):
    q, k, v = _case(dtype, t=100)
    seq = torch.tensor([0] * 40 + [1] * 60)
    pos = torch.cat([torch.arange(40), torch.arange(70, 130)])
    out = triton_attention(q, k, v, seq, pos)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), reference_attention(q, k, v, seq, pos), rtol=tol, atol=tol)
    cpu = cpu_attention.blocked_attention(
        q.float(), k.float(), v.float(), cpu_attention.plan_blocked(seq, pos, 4, 2), 0.25
    )
    torch.testing.assert_close(out.float(), cpu, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    ("dtype", "heads", "kv_heads"),
    [(torch.float32, 4, 2), (torch.bfloat16, 4, 2), (torch.bfloat16, 4, 1), (torch.float32, 3, 1)],
)
def test_decode_and_chunked_prefill_equal_full_prefill(dtype, heads, kv_heads):
    q, k, v = _case(dtype, t=150, heads=heads, kv_heads=kv_heads, seqs=1)
    seq = torch.zeros(150, dtype=torch.long)
    pos = torch.arange(150)
    full = triton_attention(q, k, v, seq, pos)
    for p in (0, 15, 16, 63, 64, 65, 149):  # one-token decode rows, across tile and key-block edges
        assert torch.equal(triton_attention(q[p : p + 1], k, v, seq[:1], pos[p : p + 1])[0], full[p]), p
    for size in (37, 64):
        chunks = [
            triton_attention(q[i : i + size], k, v, seq[i : i + size], pos[i : i + size])
            for i in range(0, 150, size)
        ]
        assert torch.equal(torch.cat(chunks), full), size


def test_a_sequence_is_unaffected_by_other_sequences_in_the_call():
    q, k, v = _case(torch.bfloat16, t=90, seqs=3)
    seq = torch.tensor([1] * 30 + [0] * 30 + [2] * 30)
    pos = torch.cat([torch.arange(30), torch.arange(100, 130), torch.arange(30)])
    mixed = triton_attention(q, k, v, seq, pos)
    alone = triton_attention(q[30:60], k, v, seq[30:60], pos[30:60])
    assert torch.equal(mixed[30:60], alone)


def test_backward_matches_autograd_of_reference():
    gen = torch.Generator().manual_seed(3)
    lengths = [70, 5, 80]
    seq = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(n) for n in lengths])
    q = torch.randn(seq.numel(), 4, 16, generator=gen, requires_grad=True)
    k = torch.randn(3, 2, 128, 16, generator=gen, requires_grad=True)
    v = torch.randn(3, 2, 128, 16, generator=gen, requires_grad=True)
    grad = torch.randn(seq.numel(), 4, 16, generator=gen)
    triton_attention(q, k, v, seq, pos).backward(grad)
    ours = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    reference_attention(q, k, v, seq, pos).backward(grad)
    for a, t in zip(ours, (q, k, v), strict=True):
        torch.testing.assert_close(a, t.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scattered_pages_give_the_bits_of_the_contiguous_buffer(dtype):
    gen = torch.Generator().manual_seed(4)
    q, k, v = _case(dtype, t=90, seqs=2, length=192)
    width = 192 // ta.BLOCK_N
    table = torch.randperm(2 * width + 3, generator=gen)[: 2 * width].view(2, width)
    kp = torch.randn(2 * width + 3, 2, ta.BLOCK_N, 16, generator=gen).to(dtype)  # stale pages
    vp = torch.randn(2 * width + 3, 2, ta.BLOCK_N, 16, generator=gen).to(dtype)
    for s in range(2):
        for j in range(width):
            kp[table[s, j]] = k[s, :, j * 64 : (j + 1) * 64]
            vp[table[s, j]] = v[s, :, j * 64 : (j + 1) * 64]
    seq = torch.tensor([0] * 60 + [1] * 30)
    pos = torch.cat([torch.arange(60), torch.arange(150, 180)])
    dense = triton_attention(q, k, v, seq, pos)
    plan = ta.plan_attention(seq, pos, q.shape[1], k.shape[1], page_table=table)
    assert torch.equal(ta.attention(q, kp, vp, plan, 0.25), dense)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_decode_plan_built_without_read_back_gives_the_general_plans_bits(dtype):
    # A decode step (one query per sequence, rows in any order, pages scattered) planned from its
    # shape alone (decode_positions: no unique, no read-back, graph-capturable) == the general plan.
    gen = torch.Generator().manual_seed(6)
    width = 3
    kp = torch.randn(12, 2, ta.BLOCK_N, 16, generator=gen).to(dtype)
    vp = torch.randn(12, 2, ta.BLOCK_N, 16, generator=gen).to(dtype)
    table = torch.randperm(12, generator=gen)[:12].view(4, width)
    q = torch.randn(4, 4, 16, generator=gen).to(dtype)
    seq = torch.tensor([2, 0, 3, 1])
    pos = torch.tensor([5, 150, 0, 63])
    general = ta.plan_attention(seq, pos, 4, 2, page_table=table)
    decode = ta.plan_attention(seq, pos, 4, 2, page_table=table, decode_positions=(5, 150, 0, 63))
    assert decode.num_tiles == general.num_tiles == 4
    order = torch.argsort(seq)  # the general plan sorts tiles by sequence
    for name in ("tile_tokens", "tile_seq", "tile_start", "tile_blocks", "tile_last"):
        assert torch.equal(getattr(decode, name)[order], getattr(general, name)), name
    assert torch.equal(ta.attention(q, kp, vp, decode, 0.25), ta.attention(q, kp, vp, general, 0.25))
