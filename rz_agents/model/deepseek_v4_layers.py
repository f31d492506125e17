"""DeepSeek-V4's small building blocks: the unweighted RMSNorm, interleaved partial RoPE, and the manifold-
constrained hyper-connections (mHC) that carry `hc_mult` residual streams through every layer.

Every op here is per token (row) with fixed-length reductions in a fixed order: the sums over the few streams
are explicit loops, the transcendentals take the vector path (`aligned_unary`), the projections are the op
set's GEMM. A token's result never depends on the other tokens of the call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rz_agents.model.rope_scaling import yarn_frequencies
from rz_kernels import OpSet
from rz_kernels.elementwise import aligned_unary


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim (the scale computed in fp32, as transformers does)."""
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


class InterleavedRope:
    """RoPE on the trailing `dim` channels of a head, pairs (2i, 2i+1) rotated by angle position * inv_freq[i]
    (DeepSeek's interleaved layout). Angles are computed per position in fp32, cos/sin on the vector path, so
    a position's rotation has the same bits in every call."""

    def __init__(self, dim: int, theta: float, params: dict | None = None, max_positions: int = 0) -> None:
        params = params or {}
        if params.get("rope_type", "default") == "yarn":
            self.inv_freq, self.scale = yarn_frequencies(dim, theta, params, max_positions)
        else:
            cpu = torch.device("cpu")  # real tables even when the model is built on the meta device
            self.inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=cpu) / dim))
            self.scale = 1.0
        self.dim = dim
        # inv_freq per device, copied once: a CUDA-graph capture of a decode step may not copy from the host
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [N, dim // 2] fp32 of positions [N]."""
        inv_freq = self._on_device.get(positions.device)
        if inv_freq is None:
            inv_freq = self._on_device[positions.device] = self.inv_freq.to(positions.device)
        freqs = positions.float().unsqueeze(-1) * inv_freq
        cos, sin = aligned_unary(torch.cos, freqs), aligned_unary(torch.sin, freqs)
        if self.scale != 1.0:
            cos, sin = cos * self.scale, sin * self.scale
        return cos, sin

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [N, ..., D] with its last `dim` channels rotated by cos/sin [N, dim // 2] (broadcast over the
        middle dims); math in fp32, result in x's dtype."""
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
        cos, sin = cos.view(shape), sin.view(shape)
        rope = x[..., -self.dim :].float()
        even, odd = rope[..., 0::2], rope[..., 1::2]
        rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
        return torch.cat([x[..., : -self.dim], rotated.to(x.dtype)], dim=-1)


def _softmax_last(x: torch.Tensor) -> torch.Tensor:
    """Softmax over a short last dim: exact max, vector-path exp, a fixed-order sum."""
    e = aligned_unary(torch.exp, x - x.amax(-1, keepdim=True))
    return e / _sum_slices(e, -1, keepdim=True)


def _sum_slices(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """Sum over a short dim as an explicit loop in index order."""
    parts = x.unbind(dim)
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total.unsqueeze(dim) if keepdim else total


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """Elementwise sigmoid on the vector path for every element."""
    return aligned_unary(torch.sigmoid, x)


def hyper_mix(
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    ops: OpSet,
    norm_eps: float,
    hc_eps: float,
    sinkhorn_iters: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One mHC site (before attention or the MoE): streams [T, n, H] -> (post [T, n] fp32, comb [T, n, n] fp32
    (doubly stochastic after Sinkhorn-Knopp), collapsed input [T, H] in the streams' dtype)."""
    t, n, _ = streams.shape
    flat = unweighted_rms_norm(streams.reshape(t, -1).float(), norm_eps)
    mixes = ops.linear(flat, fn.float())
    pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = base.float().split([n, n, n * n])
    s = scale.float()
    pre = sigmoid(pre_w * s[0] + pre_b) + hc_eps
    post = 2 * sigmoid(post_w * s[1] + post_b)
    comb = _softmax_last(comb_w.view(t, n, n) * s[2] + comb_b.view(n, n)) + hc_eps
    comb = comb / (_sum_slices(comb, -2, keepdim=True) + hc_eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (_sum_slices(comb, -1, keepdim=True) + hc_eps)
        comb = comb / (_sum_slices(comb, -2, keepdim=True) + hc_eps)
    collapsed = _sum_slices(pre.unsqueeze(-1) * streams, 1).to(streams.dtype)
    return post, comb, collapsed


def hyper_merge(
    streams: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
) -> torch.Tensor:
    """The streams after a block: stream k = post_k * out + sum_j comb[j, k] * stream j (in j order)."""
    dtype = streams.dtype
    comb = comb.to(dtype)
    mixed = comb[:, 0].unsqueeze(-1) * streams[:, :1]
    for j in range(1, streams.shape[1]):
        mixed = mixed + comb[:, j].unsqueeze(-1) * streams[:, j : j + 1]
    return post.to(dtype).unsqueeze(-1) * out.unsqueeze(1) + mixed


def hyper_head(
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    ops: OpSet,
    norm_eps: float,
    hc_eps: float,
) -> torch.Tensor:
    """The final collapse of the streams [T, n, H] into one [T, H] (sigmoid weights, no Sinkhorn)."""
    t = streams.shape[0]
    flat = unweighted_rms_norm(streams.reshape(t, -1).float(), norm_eps)
    pre = sigmoid(ops.linear(flat, fn.float()) * scale.float() + base.float()) + hc_eps
    return _sum_slices(pre.unsqueeze(-1) * streams, 1).to(streams.dtype)


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit): V4's expert activation."""
    return aligned_unary(F.silu, gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)
