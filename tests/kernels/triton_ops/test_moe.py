"""Triton MoE: grouped GEMM close to the CPU aligned MoE, a token's output independent of the others
routed with it, and gradients close to autograd through per-expert torch GEMMs."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from rz_kernels import moe as cpu_moe  # noqa: E402
from rz_kernels.triton_ops import moe as tm  # noqa: E402

E, HIDDEN, INTER, TOP_K = 8, 32, 48, 2


def _experts(dtype, gen, requires_grad=False):
    def make(shape):
        return (torch.randn(shape, generator=gen) * 0.2).to(dtype).requires_grad_(requires_grad)

    return (
        [make((INTER, HIDDEN)) for _ in range(E)],
        [make((INTER, HIDDEN)) for _ in range(E)],
        [make((HIDDEN, INTER)) for _ in range(E)],
    )


def _reference_fn(weights):
    gate, up, down = weights
    return lambda e, xe: F.linear(F.silu(F.linear(xe, gate[e])) * F.linear(xe, up[e]), down[e])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_moe_matches_cpu_moe_and_tokens_are_independent(dtype):
    gen = torch.Generator().manual_seed(0)
    weights = _experts(dtype, gen)
    x = torch.randn(70, HIDDEN, generator=gen).to(dtype)
    logits = torch.randn(70, E, generator=gen)
    w, ex = tm.route(logits, TOP_K, True)
    w_ref, ex_ref = cpu_moe.route(logits, TOP_K, True)
    assert torch.equal(ex, ex_ref)
    torch.testing.assert_close(w, w_ref, rtol=1e-6, atol=1e-6)
    out = tm.aligned_moe(x, w, ex, E, expert_weights=weights)
    ref = cpu_moe.aligned_moe(x, w, ex, E, _reference_fn(weights))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)
    for i in (0, 33, 69):  # alone, or with a different crowd routed alongside
        assert torch.equal(
            tm.aligned_moe(x[i : i + 1], w[i : i + 1], ex[i : i + 1], E, expert_weights=weights)[0], out[i]
        )
    assert torch.equal(tm.aligned_moe(x[30:37], w[30:37], ex[30:37], E, expert_weights=weights), out[30:37])


def test_grouped_moe_gradients_match_per_expert_autograd():
    gen = torch.Generator().manual_seed(1)
    weights = _experts(torch.float32, gen, requires_grad=True)
    x = torch.randn(20, HIDDEN, generator=gen, requires_grad=True)
    logits = torch.randn(20, E, generator=gen, requires_grad=True)
    g = torch.randn(20, HIDDEN, generator=gen)
    params = [x, logits, *weights[0], *weights[1], *weights[2]]

    w, ex = tm.route(logits, TOP_K, True)
    tm.aligned_moe(x, w, ex, E, expert_weights=weights).backward(g)
    ours = [None if p.grad is None else p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    w, ex = cpu_moe.route(logits, TOP_K, True)
    cpu_moe.aligned_moe(x, w, ex, E, _reference_fn(weights)).backward(g)
    for a, p in zip(ours, params, strict=True):
        if p.grad is None:
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-5)


def test_grouped_moe_backward_is_one_batched_gemm_per_weight_without_index_add_and_the_same_bits_twice():
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    gen = torch.Generator().manual_seed(2)
    weights = _experts(torch.bfloat16, gen, requires_grad=True)
    x = torch.randn(24, HIDDEN, generator=gen).to(torch.bfloat16).requires_grad_(True)
    logits = torch.randn(24, E, generator=gen)
    g = torch.randn(24, HIDDEN, generator=gen).to(torch.bfloat16)
    params = [x, *weights[0], *weights[1], *weights[2]]
    runs = []
    for _ in range(2):
        for p in params:
            p.grad = None
        w, ex = tm.route(logits, TOP_K, True)
        out = tm.aligned_moe(x, w, ex, E, expert_weights=weights)
        ops = Ops()
        with ops:
            out.backward(g)
        runs.append([None if p.grad is None else p.grad.clone() for p in params])
    # every expert's weight gradient from one bmm per projection (gate, up, down); no per-expert mm, no
    # scatter-add for the gathered rows
    assert ops.seen["bmm"] == 3 and ops.seen["mm"] == 0, ops.seen
    assert ops.seen["index_add"] == 0 and ops.seen["index_add_"] == 0, ops.seen
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(*runs, strict=True))
