"""The backward of the aligned delta rule and causal conv over many packed sequences (the learner's and the
warm start's case): its gradients are the recurrence's / the convolution's, and its autograd graph does not
grow with the number of sequences (per-sequence slices each wrote a full-size gradient: quadratic cost)."""

import pytest
import torch
import torch.nn.functional as F

from rz_kernels.causal_conv import causal_conv1d
from rz_kernels.delta_rule import CHUNK, gated_delta_rule, l2_normalize

pytestmark = pytest.mark.usefixtures("one_torch_thread")

H, DK, DV, CH, K = 2, 8, 4, 6, 4


def _delta_inputs(seed: int, t: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(t, H, DK, generator=gen))
    k = l2_normalize(torch.randn(t, H, DK, generator=gen))
    v = torch.randn(t, H, DV, generator=gen)
    g = -0.3 * torch.rand(t, H, generator=gen)
    beta = torch.rand(t, H, generator=gen)
    return [x.to(dtype).requires_grad_(True) for x in (q, k, v, g, beta)]


def _recurrent(q, k, v, g, beta):
    """The gated delta rule's recurrence (its definition), one sequence, in the inputs' dtype."""
    s = q.new_zeros(H, DK, DV)
    out = []
    for t in range(q.shape[0]):
        s = s * g[t].exp()[:, None, None]
        delta = (v[t] - torch.einsum("hkv,hk->hv", s, k[t])) * beta[t][:, None]
        s = s + k[t][:, :, None] * delta[:, None, :]
        out.append(torch.einsum("hkv,hk->hv", s, q[t] * DK**-0.5))
    return torch.stack(out)


def _graph_nodes(root: torch.Tensor) -> int:
    seen, todo = set(), [root.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo += [n for n, _ in node.next_functions]
    return len(seen)


def test_delta_rule_gradients_over_packed_sequences_are_the_recurrences():
    lens = [CHUNK + 9, 3, 30]
    starts = [0, CHUNK + 9, CHUNK + 12]
    xs = _delta_inputs(0, sum(lens), torch.float64)
    out, _ = gated_delta_rule(*xs, lens)
    weight = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)
    grads = torch.autograd.grad((out * weight).sum(), xs)
    ref_xs = [x.detach().clone().requires_grad_(True) for x in xs]
    ref = torch.cat([_recurrent(*(x[a : a + n] for x in ref_xs)) for a, n in zip(starts, lens, strict=True)])
    ref_grads = torch.autograd.grad((ref * weight).sum(), ref_xs)
    for got, want in zip(grads, ref_grads, strict=True):  # the kernel computes in fp32
        torch.testing.assert_close(got, want, rtol=1e-3, atol=2e-6)


def test_delta_rule_backward_graph_does_not_grow_with_the_number_of_sequences():
    def nodes(count: int) -> int:
        out, _ = gated_delta_rule(*_delta_inputs(1, count * 70), [70] * count)
        return _graph_nodes(out)

    assert nodes(2) == nodes(12)


def test_conv_gradients_over_packed_sequences_are_the_convolutions():
    lens = [5, 1, 9]
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(sum(lens), CH, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(CH, 1, K, generator=gen, dtype=torch.float64, requires_grad=True)
    out, _ = causal_conv1d(x, w, lens)
    ref = torch.cat(
        [
            F.silu(F.conv1d(part.t().unsqueeze(0), w, padding=K - 1, groups=CH)[0, :, :n].t())
            for part, n in zip(x.split(lens), lens, strict=True)
        ]
    )
    weight = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)
    got = torch.autograd.grad((out * weight).sum(), (x, w))
    want = torch.autograd.grad((ref * weight).sum(), (x, w))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=2e-6)  # the kernel computes in fp32


def test_conv_backward_graph_does_not_grow_with_the_number_of_sequences():
    def nodes(count: int) -> int:
        x = torch.randn(count * 7, CH, requires_grad=True)
        out, _ = causal_conv1d(x, torch.randn(CH, 1, K), [7] * count)
        return _graph_nodes(out)

    assert nodes(2) == nodes(12)
