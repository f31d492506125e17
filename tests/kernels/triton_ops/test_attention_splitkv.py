"""Split-KV Triton attention: the key range cut at multiples of SPLIT_BLOCKS * BLOCK_N positions, one
partial per split folded in split order. A decode step (one program per token, kv head and split,
then a combine kernel) gives the bits of prefill, chunked prefill and the trainer's packed forward
(splits run in one program), at any batch, paged or not; a different split or fold order gives other
bits (the negative controls), and the gradients still match a plain attention's..

The interpreter runs every program of a launch in Python, so the tests that fold several splits over long
sequences run at 128-key splits (SPLIT_BLOCKS = 2, set on the module: kernels, plans and split counts read
it at the call, as scripts/gpu_check.py's dry run does): the same kernels, boundaries and fold at a quarter
of the keys. The production 512-key split keeps its own tests (a capacity-sized grid, the split size in the
bits, the engine's graph quantum)."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from rz_kernels.triton_ops import attention as ta  # noqa: E402
from rz_kernels.triton_ops.attention import _combine  # noqa: E402

SPLIT = ta.SPLIT_BLOCKS * ta.BLOCK_N  # keys per production split (512)
SMALL_SPLIT_BLOCKS = 2  # 128-key splits for the long multi-split tests (the interpreter pays per program)
HEADS, KV_HEADS, D = 4, 1, 16


@pytest.fixture
def small_split(monkeypatch) -> int:
    """The Triton attention's split set to SMALL_SPLIT_BLOCKS key blocks for the test; its keys per split."""
    monkeypatch.setattr(ta, "SPLIT_BLOCKS", SMALL_SPLIT_BLOCKS)
    return SMALL_SPLIT_BLOCKS * ta.BLOCK_N


def _reference(q, k, v, seq, pos, scale=0.25):
    """Materialised fp32 causal GQA attention (differentiable)."""
    group = q.shape[1] // k.shape[1]
    kk = k.float().repeat_interleave(group, dim=1)[seq]
    vv = v.float().repeat_interleave(group, dim=1)[seq]
    scores = torch.einsum("thd,thld->thl", q.float(), kk) * scale
    visible = torch.arange(k.shape[2])[None, None, :] <= pos[:, None, None]
    return torch.einsum("thl,thld->thd", scores.masked_fill(~visible, float("-inf")).softmax(-1), vv)


def _packed(dtype, lengths, seed=0):
    """Queries of every position of every sequence (the trainer's packed layout) and dense K/V."""
    gen = torch.Generator().manual_seed(seed)
    seq = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(n) for n in lengths])
    span = -(-max(lengths) // ta.BLOCK_N) * ta.BLOCK_N
    q = torch.randn(seq.numel(), HEADS, D, generator=gen).to(dtype)
    k = torch.randn(len(lengths), KV_HEADS, span, D, generator=gen).to(dtype)
    v = torch.randn(len(lengths), KV_HEADS, span, D, generator=gen).to(dtype)
    return q, k, v, seq, pos


def _paged(k, v, seed=1):
    """The dense buffers scattered over pages (one key block each) among stale ones, and the table."""
    gen = torch.Generator().manual_seed(seed)
    s, hkv, span, d = k.shape
    width = span // ta.BLOCK_N
    total = s * width + 5
    table = torch.randperm(total, generator=gen)[: s * width].view(s, width)
    kp = torch.randn(total, hkv, ta.BLOCK_N, d, generator=gen).to(k.dtype)
    vp = torch.randn(total, hkv, ta.BLOCK_N, d, generator=gen).to(k.dtype)
    for i in range(s):
        for j in range(width):
            kp[table[i, j]] = k[i, :, j * ta.BLOCK_N : (j + 1) * ta.BLOCK_N]
            vp[table[i, j]] = v[i, :, j * ta.BLOCK_N : (j + 1) * ta.BLOCK_N]
    return kp, vp, table


def _trainer_forward(q, k, v, seq, pos):
    """The packed training forward: every token in one call, through autograd."""
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    plan = ta.plan_attention(seq, pos, HEADS, KV_HEADS)
    return ta.attention(q, k, v, plan, 0.25).detach()


def _decode(q, kp, vp, table, rows, max_position=None):
    """One decode step over the page table: row i is sequence rows[i][0]'s token at rows[i][1]."""
    seq = torch.tensor([s for s, _ in rows])
    pos = torch.tensor([p for _, p in rows])
    plan = ta.plan_attention(
        seq, pos, HEADS, KV_HEADS, page_table=table, max_position=max_position,
        decode_positions=[p for _, p in rows],
    )  # fmt: skip
    return ta.attention(q, kp, vp, plan, 0.25), plan


def _row(seq, pos, s, p) -> int:
    return int(((seq == s) & (pos == p)).nonzero())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_equals_prefill_chunked_and_trainer_across_split_boundaries(dtype, small_split):
    split = small_split
    lengths = (split * 2 + 76, split + 88, 90)  # crosses two split boundaries, one, none
    chunk = split * 3 // 4 + 4  # not a multiple of a key block: chunks straddle both boundaries
    q, k, v, seq, pos = _packed(dtype, lengths)
    trainer = _trainer_forward(q, k, v, seq, pos)
    kp, vp, table = _paged(k, v)
    # Full prefill over the pages (the engine's first forward) == the packed training forward.
    paged_plan = ta.plan_attention(seq, pos, HEADS, KV_HEADS, page_table=table)
    assert torch.equal(ta.attention(q, kp, vp, paged_plan, 0.25), trainer)
    # Chunked prefill of sequence 0 in chunks that straddle the split boundaries.
    first = (seq == 0).nonzero().flatten()
    for lo in range(0, lengths[0], chunk):
        idx = first[lo : lo + chunk]
        plan = ta.plan_attention(seq[idx], pos[idx], HEADS, KV_HEADS, page_table=table)
        assert torch.equal(ta.attention(q[idx], kp, vp, plan, 0.25), trainer[idx]), lo
    # Decode, one sequence at a time, at and around the split boundaries.
    probes = [(0, 0), (0, split - 1), (0, split), (0, split + 1), (0, 2 * split - 1), (0, 2 * split)]
    probes += [(0, lengths[0] - 1), (1, split - 1), (1, split), (1, lengths[1] - 1), (2, 89)]
    for s, p in probes:
        i = _row(seq, pos, s, p)
        out, plan = _decode(q[i : i + 1], kp, vp, table, [(s, p)])
        assert plan.decode_splits == p // split + 1 and plan.block_m == 16
        assert torch.equal(out[0], trainer[i]), (s, p)
    # A batch of sequences of different lengths, rows in any order: each row its trainer bits.
    rows = [(1, lengths[1] - 1), (2, 40), (0, 2 * split + 3), (0, split)]
    idx = [_row(seq, pos, s, p) for s, p in rows]
    out, plan = _decode(q[idx], kp, vp, table, rows)
    assert plan.decode_splits == 3
    assert torch.equal(out, trainer[idx])


def test_a_decode_grid_sized_for_the_capacity_gives_the_same_bits():
    # Under a CUDA graph the split bound is the step's highest position rounded up to a power-of-two number
    # of splits (DecodeStep.graph_max_position; before issue 37 the capacity): programs past a token's last
    # split exit, and the bits do not move.
    q, k, v, seq, pos = _packed(torch.float32, lengths=(SPLIT + 20, 30))
    kp, vp, table = _paged(k, v)
    rows = [(0, SPLIT + 19), (1, 29)]
    idx = [_row(seq, pos, s, p) for s, p in rows]
    exact, plan = _decode(q[idx], kp, vp, table, rows, max_position=SPLIT + 19)
    padded, big = _decode(q[idx], kp, vp, table, rows, max_position=4 * SPLIT - 1)
    assert (plan.decode_splits, big.decode_splits) == (2, 4)
    assert torch.equal(exact, padded)
    assert torch.equal(exact, _trainer_forward(q, k, v, seq, pos)[idx])


def test_the_split_size_is_part_of_the_bits(monkeypatch):
    # Negative control: rows below the first boundary of both split sizes agree, rows past it do not;
    # so the equality tests above would fail if decode and training cut the keys differently.
    q, k, v, seq, pos = _packed(torch.float32, lengths=(SPLIT + 100,))
    ours = _trainer_forward(q, k, v, seq, pos)
    for other in (ta.SPLIT_BLOCKS // 2, 10**6):  # a smaller split, and no split at all
        monkeypatch.setattr(ta, "SPLIT_BLOCKS", other)
        theirs = _trainer_forward(q, k, v, seq, pos)
        first_boundary = min(other, 8) * ta.BLOCK_N
        assert torch.equal(theirs[:first_boundary], ours[:first_boundary]), other
        assert not torch.equal(theirs[first_boundary:], ours[first_boundary:]), other
        torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)


@triton.jit
def _fold_kernel(
    part_m, part_l, part_acc, out, n_splits, REVERSE: tl.constexpr, R: tl.constexpr, D: tl.constexpr
):
    """Fold R rows' partials with the kernels' combine, in split order or reversed."""
    r = tl.arange(0, R)
    d = tl.arange(0, D)
    m = tl.full((R,), float("-inf"), tl.float32)
    l_i = tl.zeros((R,), tl.float32)
    acc = tl.zeros((R, D), tl.float32)
    for i in range(0, n_splits):
        s = n_splits - 1 - i if REVERSE else i
        m_s = tl.load(part_m + r * n_splits + s)
        l_s = tl.load(part_l + r * n_splits + s)
        acc_s = tl.load(part_acc + (r[:, None] * n_splits + s) * D + d[None, :])
        m, l_i, acc = _combine(m, l_i, acc, m_s, l_s, acc_s)
    tl.store(out + r[:, None] * D + d[None, :], acc / l_i[:, None])


def test_the_combine_folds_the_splits_in_split_order():
    # Folding the decode step's own partials in split order reproduces its output; the reverse order
    # (the same partials, the same combine) gives other bits: the order is fixed, and it matters.
    q, k, v, seq, pos = _packed(torch.float32, lengths=(2 * SPLIT + 50, 2 * SPLIT + 10, 2 * SPLIT + 30))
    kp, vp, table = _paged(k, v)
    rows = [(1, 2 * SPLIT + 9), (0, 2 * SPLIT + 49), (2, 2 * SPLIT + 29), (0, 2 * SPLIT + 1)]
    idx = [_row(seq, pos, s, p) for s, p in rows]
    out, plan = _decode(q[idx], kp, vp, table, rows)
    part_m, part_l, part_acc = ta.decode_partials(q[idx], kp, vp, plan, 0.25)
    n = plan.decode_splits
    assert n == 3
    folds = {}
    for reverse in (False, True):
        folds[reverse] = torch.empty(len(rows) * HEADS, D)
        _fold_kernel[(1,)](
            part_m, part_l, part_acc, folds[reverse], n, REVERSE=reverse, R=len(rows) * HEADS, D=D
        )
    assert torch.equal(folds[False].view(len(rows), HEADS, D), out)
    assert not torch.equal(folds[True].view(len(rows), HEADS, D), out)
    torch.testing.assert_close(folds[True].view(len(rows), HEADS, D), out, rtol=1e-5, atol=1e-5)


def test_gradients_across_a_split_boundary_match_autograd_of_reference():
    q, k, v, seq, pos = _packed(torch.float32, lengths=(SPLIT + 40, 70), seed=3)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(4))
    ta.attention(q, k, v, ta.plan_attention(seq, pos, HEADS, KV_HEADS), 0.25).backward(grad)
    ours = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    _reference(q, k, v, seq, pos).backward(grad)
    for a, t in zip(ours, (q, k, v), strict=True):
        torch.testing.assert_close(a, t.grad, rtol=1e-4, atol=1e-4)


def test_a_decode_plan_refuses_a_backward():
    q, k, v, seq, pos = _packed(torch.float32, lengths=(10,))
    plan = ta.plan_attention(seq[-1:], pos[-1:], HEADS, KV_HEADS, decode_positions=[9])
    with pytest.raises(ValueError, match="inference-only"):
        ta.attention(q[-1:].requires_grad_(True), k, v, plan, 0.25)


@pytest.mark.parametrize(("heads", "rows"), [(3, 16), (8, 16), (32, 32)])
def test_group_sizes_decode_in_the_prefill_tile_across_a_split(heads, rows):
    # G = 3 (padded to 4 rows a position), 8 (two positions a tile) and 32 (one position, 32 rows): the
    # decode tile is the prefill tile (same rows, same shape), and its split decode gives the chunk's bits.
    gen = torch.Generator().manual_seed(heads)
    length = SPLIT + 40
    q = torch.randn(length, heads, D, generator=gen)
    k = torch.randn(1, 1, length, D, generator=gen)
    v = torch.randn(1, 1, length, D, generator=gen)
    seq, pos = torch.zeros(length, dtype=torch.long), torch.arange(length)
    lo = SPLIT - 8  # a prefill chunk straddling the split boundary
    chunk = ta.attention(q[lo:], k, v, ta.plan_attention(seq[lo:], pos[lo:], heads, 1), 0.25)
    for p in (SPLIT - 1, SPLIT, SPLIT + 3, length - 1):
        plan = ta.plan_attention(seq[:1], pos[p : p + 1], heads, 1, decode_positions=[p])
        assert plan.block_m == rows == ta.tile_rows(heads, 1)
        assert torch.equal(ta.attention(q[p : p + 1], k, v, plan, 0.25)[0], chunk[p - lo]), p


def test_the_engine_rounds_graph_bounds_to_whole_attention_splits():
    from rz_agents.engine.decode_step import GRAPH_POSITION_QUANTUM

    assert GRAPH_POSITION_QUANTUM == SPLIT  # a graph bound of 2^k splits has exactly 2^k splits in the grid
    rows = [(0, SPLIT + 19)]
    seq, pos = torch.tensor([0]), torch.tensor([SPLIT + 19])
    plan = ta.plan_attention(
        seq, pos, HEADS, KV_HEADS, max_position=2 * SPLIT - 1, decode_positions=[rows[0][1]]
    )
    assert plan.decode_splits == 2
