"""DeepSeek-V4's Triton kernels (compressor pooling, indexer scores and stable top-k, sink attention), run by
the interpreter: a row's bits are the same alone (the engine's decode), among other rows (the learner's
packed forward) and with its compressed group padded by invisible entries; close to the CPU kernels, the
top-k exactly the CPU's stable selection; negative controls show the checks can fail."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from rz_kernels import sink_attention as cpu_sink  # noqa: E402
from rz_kernels import sparse_select as cpu_select  # noqa: E402
from rz_kernels import window_pool as cpu_pool  # noqa: E402
from rz_kernels.triton_ops import sink_attention, sparse_select, window_pool  # noqa: E402


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pool_entries_depend_on_their_window_alone_and_match_the_cpu_form(dtype):
    gen = torch.Generator().manual_seed(0)
    kv = torch.randn(9, 8, 40, generator=gen).to(dtype)
    gate = torch.randn(9, 8, 40, generator=gen) * 3
    gate[2, 5:] = float("-inf")  # empty slots of a window not yet full
    full = window_pool.aligned_pool(kv, gate)
    torch.testing.assert_close(full, cpu_pool.aligned_pool(kv, gate), **_tol(dtype))
    for i in (0, 2, 8):
        assert torch.equal(window_pool.aligned_pool(kv[i : i + 1], gate[i : i + 1]), full[i : i + 1])
    # negative control: the slots' softmax is what pools them (a gate changed in one slot moves the entry)
    moved = gate.clone()
    moved[4, 3] += 1e-3
    assert not torch.equal(window_pool.aligned_pool(kv, moved)[4], full[4])
    a, b = kv.clone().requires_grad_(), kv.clone().requires_grad_()
    window_pool.aligned_pool(a, gate).square().sum().backward()
    cpu_pool.aligned_pool(b, gate).square().sum().backward()
    torch.testing.assert_close(a.grad, b.grad, **_tol(dtype))


def _index_inputs(seed, t=11, h=2, w=37, c=32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(t, h, c, generator=gen)
    keys = torch.randn(t, w, c, generator=gen)
    weights = torch.randn(t, h, generator=gen)
    visible = torch.rand(t, w, generator=gen) < 0.8
    return q, keys, weights, visible


def test_index_scores_depend_on_their_query_alone_and_padding_blocks_change_nothing():
    q, keys, weights, visible = _index_inputs(1)
    full = sparse_select.aligned_scores(q, keys, weights, visible, 0.2)
    torch.testing.assert_close(full, cpu_select.aligned_scores(q, keys, weights, visible, 0.2))
    for i in (0, 10):
        alone = sparse_select.aligned_scores(
            q[i : i + 1], keys[i : i + 1], weights[i : i + 1], visible[i : i + 1], 0.2
        )
        assert torch.equal(alone, full[i : i + 1])
    # a query whose call has more (invisible) blocks: its visible blocks' scores are the same bits
    wider = torch.cat([keys, torch.randn(11, 30, 32)], 1)
    vis = torch.cat([visible, torch.zeros(11, 30, dtype=torch.bool)], 1)
    assert torch.equal(sparse_select.aligned_scores(q, wider, weights, vis, 0.2)[:, :37], full)


def test_top_k_is_the_cpu_stable_selection_with_ties_to_the_lowest_block():
    gen = torch.Generator().manual_seed(2)
    scores = torch.randint(0, 6, (13, 150), generator=gen).float()  # many ties, several rank blocks
    scores[scores == 5] = float("-inf")
    scores[3, 4:] = float("-inf")  # fewer visible blocks than k: -1 past them
    for k in (1, 7, 40):
        got = sparse_select.aligned_top_k(scores, k)
        assert torch.equal(got, cpu_select.aligned_top_k(scores, k)), k
        assert torch.equal(sparse_select.aligned_top_k(scores[3:4], k), got[3:4])
    assert (got[3, 4:] == -1).all()
    # negative control: torch.topk's own tie order is not the stable one on these rows
    assert not torch.equal(cpu_select.standard_top_k(scores, 40), got)


def _sink_inputs(seed, dtype, t=6, h=2, w=8, c=21, d=32):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(t, h, d, generator=gen) * 2).to(dtype)
    slide = torch.randn(t, w, d, generator=gen).to(dtype)
    comp = torch.randn(t, c, d, generator=gen).to(dtype)
    slide_ok = torch.rand(t, w, generator=gen) < 0.8
    comp_ok = torch.rand(t, c, generator=gen) < 0.7
    slide_ok[:, -1] = True  # a query always sees itself
    sinks = torch.randn(h, generator=gen)
    return q, slide, slide_ok, comp, comp_ok, sinks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sink_attention_row_alone_packed_or_padded_gets_the_same_bits(dtype):
    q, slide, slide_ok, comp, comp_ok, sinks = _sink_inputs(3, dtype)
    full = sink_attention.aligned_sink_attention(q, slide, slide_ok, comp, comp_ok, sinks, 0.2, 64)
    ref = cpu_sink.aligned_sink_attention(q, slide, slide_ok, comp, comp_ok, sinks, 0.2, 64)
    torch.testing.assert_close(full, ref, **_tol(dtype))
    for i in (0, 5):  # the engine's decode row: alone, its compressed group cut to its own 21 entries
        one = (x[i : i + 1] for x in (q, slide, slide_ok, comp, comp_ok))
        assert torch.equal(sink_attention.aligned_sink_attention(*one, sinks, 0.2, 64), full[i : i + 1])
    # the learner's pack: every row's group padded to the batch's widest with invisible entries
    pad_c = torch.cat([comp, torch.randn(6, 40, 32).to(dtype)], 1)
    pad_ok = torch.cat([comp_ok, torch.zeros(6, 40, dtype=torch.bool)], 1)
    padded = sink_attention.aligned_sink_attention(q, slide, slide_ok, pad_c, pad_ok, sinks, 0.2, 64)
    assert torch.equal(padded, full)
    # negative control: the stock form (matmul, stock softmax) is close, and its bits differ
    std = cpu_sink.standard_sink_attention(q, slide, slide_ok, comp, comp_ok, sinks, 0.2, None)
    torch.testing.assert_close(std, full, **_tol(dtype))
    assert not torch.equal(std, full)


def test_sink_attention_gradients_follow_the_torch_form():
    q, slide, slide_ok, comp, comp_ok, sinks = _sink_inputs(4, torch.float32)
    a = [x.clone().requires_grad_() for x in (q, slide, comp, sinks)]
    b = [x.clone().requires_grad_() for x in (q, slide, comp, sinks)]
    sink_attention.aligned_sink_attention(a[0], a[1], slide_ok, a[2], comp_ok, a[3], 0.2, 64).sum().backward()
    cpu_sink.aligned_sink_attention(b[0], b[1], slide_ok, b[2], comp_ok, b[3], 0.2, 64).sum().backward()
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.grad, y.grad)
