"""The Triton router sigmoid (DeepSeek-V3 routing): close to torch.sigmoid, and a row's values and route do
not depend on the other rows of the call (interpreter)."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from rz_kernels.grouped_route import sigmoid_route as cpu_route  # noqa: E402
from rz_kernels.triton_ops.sigmoid import sigmoid, sigmoid_route  # noqa: E402


def test_sigmoid_is_row_invariant_and_close_to_torch():
    x = torch.randn(37, 24, generator=torch.Generator().manual_seed(0)) * 4
    out = sigmoid(x)
    torch.testing.assert_close(out, torch.sigmoid(x), rtol=1e-6, atol=1e-7)
    for i in (0, 5, 36):
        assert torch.equal(sigmoid(x[i : i + 1]), out[i : i + 1])
        assert torch.equal(sigmoid(torch.cat([x[i : i + 1], x[:3]])), torch.cat([out[i : i + 1], out[:3]]))
    g = x.clone().requires_grad_()
    sigmoid(g).sum().backward()
    torch.testing.assert_close(g.grad, torch.sigmoid(x) * (1 - torch.sigmoid(x)))


def test_route_on_triton_is_row_invariant_and_picks_the_cpu_experts():
    gen = torch.Generator().manual_seed(1)
    logits, bias = torch.randn(19, 16, generator=gen), torch.randn(16, generator=gen) * 0.2
    args = (bias, 3, 4, 2, True, 2.5)
    weights, experts = sigmoid_route(logits, *args)
    cpu_weights, cpu_experts = cpu_route(logits, *args)
    assert torch.equal(experts, cpu_experts)
    torch.testing.assert_close(weights, cpu_weights, rtol=1e-6, atol=1e-7)
    w1, e1 = sigmoid_route(logits[4:5], *args)
    assert torch.equal(w1, weights[4:5]) and torch.equal(e1, experts[4:5])
