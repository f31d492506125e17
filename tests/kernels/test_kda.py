"""Kimi Delta Attention (the delta rule with a per-channel decay, g [T, H, dk]) on the aligned delta rule's
fixed chunk grid: a prefill cut at every offset within a chunk, one-token decode and any batch give every
token the same bits (fp32 and bf16), close to transformers' KDA references (chunked and recurrent); the
reference's per-call chunking differs when cut (negative control)."""

import pytest
import torch

from rz_kernels.delta_rule import CHUNK, gated_delta_rule, l2_normalize

pytestmark = pytest.mark.usefixtures("one_torch_thread")

H, DK, DV = 2, 16, 8


def _inputs(seed: int, t: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(t, H, DK, generator=gen))
    k = l2_normalize(torch.randn(t, H, DK, generator=gen))
    v = torch.randn(t, H, DV, generator=gen)
    g = -0.3 * torch.rand(t, H, DK, generator=gen)  # a log decay per key channel
    beta = torch.rand(t, H, generator=gen)
    return tuple(x.to(dtype) for x in (q, k, v, g, beta))


def _run(xs, lens, caches=None):
    return gated_delta_rule(*xs, lens, caches, keep_caches=True)


def _cut(xs, a, b):
    return tuple(x[a:b] for x in xs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_cut_at_every_offset_within_a_chunk_equals_the_full_forward(dtype):
    t = 2 * CHUNK + 21
    xs = _inputs(0, t, dtype)
    full, (cache_full,) = _run(xs, [t])
    assert cache_full.g.shape == (t % CHUNK, H, DK)  # the pending chunk keeps its per-channel decay
    for cut in range(CHUNK, 2 * CHUNK + 1):
        first, (cache,) = _run(_cut(xs, 0, cut), [cut])
        rest, (cache_end,) = _run(_cut(xs, cut, t), [t - cut], [cache])
        assert torch.equal(torch.cat([first, rest]), full), cut
        assert torch.equal(cache_end.state, cache_full.state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_and_any_batch_give_the_same_bits(dtype):
    t = CHUNK + 40
    xs = _inputs(1, t, dtype)
    full, _ = _run(xs, [t])
    cache, rows = None, []
    for i in range(t):
        out, (cache,) = _run(_cut(xs, i, i + 1), [1], [cache])
        rows.append(out)
    assert torch.equal(torch.cat(rows), full)
    lens = [CHUNK + 9, 5, t, 1]
    ys = _inputs(2, sum(lens) - t, dtype)
    mix = tuple(torch.cat([a[: lens[0] + 5], b, a[lens[0] + 5 :]]) for a, b in zip(ys, xs, strict=True))
    packed, _ = _run(mix, lens)
    assert torch.equal(packed[lens[0] + 5 : lens[0] + 5 + t], full)


def _hf():
    return pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")


def test_close_to_transformers_kda_references_and_their_cut_differs():
    t = 3 * CHUNK + 7
    xs = _inputs(3, t)
    q, k, v, g, beta = (x.unsqueeze(0) for x in xs)
    ref, _ = _hf().chunk_kimi_delta_attention(q, k, v, g, beta)
    rec, _ = _hf().recurrent_kimi_delta_attention(q, k, v, g, beta, None, False)
    out, _ = _run(xs, [t])
    assert (out - ref[0]).abs().max() <= 1e-5 and (out - rec[0]).abs().max() <= 1e-5
    # negative control: the reference chunked per call (cut at 37) or run recurrently rounds differently
    first, state = _hf().chunk_kimi_delta_attention(*(x[:, :37] for x in (q, k, v, g, beta)),
                                                    output_final_state=True)  # fmt: skip
    rest, _ = _hf().chunk_kimi_delta_attention(*(x[:, 37:] for x in (q, k, v, g, beta)), initial_state=state)
    assert not torch.equal(torch.cat([first, rest], 1), ref)
    assert not torch.equal(rec, ref)
