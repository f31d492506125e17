"""Unit properties of the aligned ops: row invariance, agreement with stock PyTorch, sampling maths."""

import math

import pytest
import torch
import torch.nn.functional as F

from rz_kernels import attention as attn
from rz_kernels import sampling_logprobs
from rz_kernels.gemm import standard_linear, tiled_linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_linear_row_result_independent_of_row_count(dtype):
    torch.manual_seed(0)
    w = torch.randn(384, 256, dtype=dtype)
    x = torch.randn(300, 256, dtype=dtype)
    ref = tiled_linear(x[:1], w)[0]
    for m in (1, 2, 8, 15, 16, 17, 63, 64, 65, 129, 300):
        assert torch.equal(tiled_linear(x[:m], w)[0], ref), m
    # fp32: a different summation order moves a sum of 256 products by ~1e-6 relative; an accumulation
    # in lower precision would be off by ~1e-3. bf16: one rounding step of the output (2**-7 relative).
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(tiled_linear(x, w), F.linear(x, w), **tol)


def test_standard_linear_is_not_row_invariant_negative_control():
    torch.manual_seed(0)
    w = torch.randn(512, 512)
    x = torch.randn(64, 512)
    rows = [standard_linear(x[:m], w)[0] for m in (1, 2, 16, 64)]
    assert any(not torch.equal(rows[0], r) for r in rows[1:])


def blocked_attention(q, k, v, seq, pos, scale):
    return attn.blocked_attention(q, k, v, attn.plan_blocked(seq, pos, q.shape[1], k.shape[1]), scale)


def sdpa_attention(q, k, v, seq, pos, scale):
    return attn.sdpa_attention(q, k, v, attn.plan_sdpa(seq, pos, q.shape[1], k.shape[1]), scale)


def _random_case(gen, t=120, h=4, hkv=2, d=16, seqs=3, length=192):
    q = torch.randn(t, h, d, generator=gen)
    k = torch.randn(seqs, hkv, length, d, generator=gen)
    v = torch.randn(seqs, hkv, length, d, generator=gen)
    return q, k, v


def test_blocked_attention_matches_sdpa_within_float_tolerance():
    gen = torch.Generator().manual_seed(1)
    q, k, v = _random_case(gen)
    seq = torch.tensor([0] * 60 + [2] * 60)
    pos = torch.cat([torch.arange(60), torch.arange(100, 160)])
    a = blocked_attention(q, k, v, seq, pos, 0.25)
    b = sdpa_attention(q, k, v, seq, pos, 0.25)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_blocked_attention_decode_equals_prefill_row_and_chunks():
    gen = torch.Generator().manual_seed(2)
    q, k, v = _random_case(gen, t=150, length=192)
    seq = torch.zeros(150, dtype=torch.long)
    pos = torch.arange(150)
    full = blocked_attention(q, k, v, seq, pos, 0.25)
    for p in (0, 63, 64, 65, 149):
        assert torch.equal(blocked_attention(q[p : p + 1], k, v, seq[:1], pos[p : p + 1], 0.25)[0], full[p])
    chunks = torch.cat(
        [
            blocked_attention(q[i : i + 37], k, v, seq[i : i + 37], pos[i : i + 37], 0.25)
            for i in range(0, 150, 37)
        ]
    )
    assert torch.equal(chunks, full)
    # Negative control: SDPA's decode row differs from its own prefill row somewhere.
    sfull = sdpa_attention(q, k, v, seq, pos, 0.25)
    assert any(
        not torch.equal(sdpa_attention(q[p : p + 1], k, v, seq[:1], pos[p : p + 1], 0.25)[0], sfull[p])
        for p in range(100, 150)
    )


def test_sampling_logprobs_temperature_top_k_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])
    lp = sampling_logprobs(logits, temperature=0.5)
    torch.testing.assert_close(lp, torch.log_softmax(logits / 0.5, -1))
    lp = sampling_logprobs(logits, top_k=2)
    assert torch.isinf(lp[0, 2:]).all() and math.isclose(lp[0, :2].exp().sum().item(), 1.0, rel_tol=1e-6)
    probs = torch.softmax(logits, -1)[0]
    # top_p just above the top token's mass keeps the two most likely tokens.
    lp = sampling_logprobs(logits, top_p=float(probs[0]) + 1e-3)
    assert torch.isfinite(lp[0, :2]).all() and torch.isinf(lp[0, 2:]).all()
    lp = sampling_logprobs(logits, top_p=1e-6)  # never empty
    assert torch.isfinite(lp[0, 0]) and lp[0, 0].item() == 0.0


def test_sampling_logprobs_rows_independent_of_batch():
    torch.manual_seed(0)
    logits = torch.randn(70, 151_669)
    ref = sampling_logprobs(logits[:1], 0.7, 50, 0.9)[0]
    for n in (2, 17, 70):
        assert torch.equal(sampling_logprobs(logits[:n], 0.7, 50, 0.9)[0], ref)


def test_silu_mul_rows_independent_of_tensor_size_at_two_threads():
    # Thread chunks of ceil(numel / threads) elements end in a scalar remainder loop whose libm
    # result can differ from the vector (SLEEF) one: seen on MoE expert batches (2787 x 32).
    import torch.nn.functional as F

    from rz_kernels import silu_mul

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen = torch.Generator().manual_seed(5)
        gate = torch.randn(2787, 32, generator=gen) * 3
        up = torch.ones(2787, 32)
        full = silu_mul(gate, up)
        alone = torch.cat([silu_mul(gate[i : i + 1], up[i : i + 1]) for i in range(gate.shape[0])])
        assert torch.equal(full, alone)
        # Negative control: stock silu of a lone element (scalar path) differs from the vector path.
        from rz_kernels.elementwise import aligned_unary

        v = torch.randn(4096, generator=gen) * 3
        vector = F.silu(v)
        scalar = torch.cat([F.silu(v[i : i + 1]) for i in range(v.numel())])
        assert not torch.equal(vector, scalar)
        assert torch.equal(vector, torch.cat([aligned_unary(F.silu, v[i : i + 1]) for i in range(v.numel())]))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_linear_forward_is_the_same_with_grad_and_its_gradients_match_f_linear(dtype):
    torch.manual_seed(0)
    x = torch.randn(150, 48, dtype=dtype)
    w = torch.randn(40, 48, dtype=dtype)
    with torch.no_grad():
        ref = tiled_linear(x, w)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = tiled_linear(xg, wg)
    assert torch.equal(out.detach(), ref)  # the autograd path computes the same (aligned) forward
    g = torch.randn_like(out)
    out.backward(g)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.linear(xs, ws).backward(g)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(xg.grad, xs.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(wg.grad, ws.grad, rtol=tol, atol=tol * 10)
    # only the weight needs a gradient (the embedding/LM head case), and 3-D inputs keep their shape
    w2 = w.clone().requires_grad_()
    tiled_linear(x.view(3, 50, 48), w2).sum().backward()
    torch.testing.assert_close(w2.grad, torch.ones(150, 40, dtype=dtype).t().mm(x), rtol=tol, atol=tol * 10)


def _nucleus_by_full_sort(x: torch.Tensor, top_p: float) -> torch.Tensor:
    probs = torch.softmax(x.double(), -1)
    sorted_p, idx = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = torch.cumsum(sorted_p, -1) - sorted_p
    return torch.zeros_like(x, dtype=torch.bool).scatter(-1, idx, before < top_p)


def test_top_p_nucleus_from_candidates_or_full_sort_matches_a_reference_row_by_row():
    gen = torch.Generator().manual_seed(3)
    peaked = torch.randn(3, 5000, generator=gen) * 6  # nucleus well inside the first 1,024 tokens
    flat = torch.randn(3, 5000, generator=gen) * 0.1  # needs the full sort
    mixed = torch.cat([peaked[:1], flat[:1], peaked[1:], flat[1:]])
    lp = sampling_logprobs(mixed, top_p=0.9)
    support = torch.isfinite(lp)
    ref = _nucleus_by_full_sort(mixed, 0.9)
    # same set up to the boundary token (fp32 vs fp64 cumulative sums may disagree there)
    assert (support != ref).sum(-1).le(1).all()
    assert support[1].sum() > 1024 and support[0].sum() < 1024
    for i in range(mixed.shape[0]):  # each row alone gives the same bits as in the mixed batch
        assert torch.equal(sampling_logprobs(mixed[i : i + 1], top_p=0.9)[0], lp[i])


def test_triton_op_set_on_cpu_without_the_interpreter_is_a_clear_error(monkeypatch):
    from rz_kernels import get_ops

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        get_ops("triton", "cpu")


def test_the_interpreter_switch_set_after_triton_was_imported_is_a_clear_error():
    # (a fresh process: whether this one imported triton before the switch depends on the test order)
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    late = (
        "import os, triton, torch\n"
        "assert not torch.cuda.is_available()\n"
        "os.environ['TRITON_INTERPRET'] = '1'\n"
        "from rz_kernels import get_ops\n"
        "try:\n    get_ops('triton', 'cpu')\n"
        "except RuntimeError as e:\n    print('ERROR', e)\n"
        "from rz_kernels.triton_ops.interpreter import patch_interpreter\n"
        "try:\n    patch_interpreter()\n"
        "except RuntimeError as e:\n    print('ERROR', e)\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "kernels"), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", late], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    errors = [line for line in out.stdout.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 2 and all("set after `triton` was imported" in e for e in errors), out.stdout
