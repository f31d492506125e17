"""Aligned mixture-of-experts on Triton: stable dispatch, one grouped GEMM launch per projection, fixed
combine.

Routing: router softmax one program per row (fp32), top-k by a stable descending sort. Dispatch: the
(token, slot) pairs are stably sorted by expert, so each expert owns one contiguous run of rows. The
grouped GEMM runs every expert's rows in one launch: a table of row tiles (expert, first row, last row)
and a table of the experts' weight addresses; each tile walks K in fixed BLOCK_K blocks with an fp32
accumulator exactly like the dense GEMM, with ONE tile config whatever the expert's row count — so a
token's expert output never depends on which other tokens chose that expert. No atomics anywhere: the
top-k outputs of a token are combined in fp32 in its top-k order (elementwise, exact per token).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from rz_kernels.moe import top_k_of
from rz_kernels.triton_ops.gemm import precision_for
from rz_kernels.triton_ops.rowwise import silu_mul
from rz_kernels.triton_ops.softmax import softmax

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) per dtype: one config (expert row counts vary call to call).
GROUPED_CONFIG = {
    torch.bfloat16: (64, 128, 64, 4, 4),
    torch.float16: (64, 128, 64, 4, 4),
    torch.float32: (64, 64, 32, 4, 3),
}
_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit(do_not_specialize=["M"])
def _grouped_matmul_kernel(
    a_ptr,
    w_table,
    c_ptr,
    tile_expert,
    tile_row0,
    tile_row1,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_wn,
    stride_wk,
    stride_cm,
    stride_cn,
    W_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(tile_expert + tile)
    row0 = tl.load(tile_row0 + tile).to(tl.int64)
    row1 = tl.load(tile_row1 + tile).to(tl.int64)
    w_ptr = tl.load(w_table + expert).to(tl.pointer_type(W_DTYPE))
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    row_ok = offs_m < row1
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=row_ok[:, None] & (offs_k[None, :] + k0 < K), other=0.0)
        w = tl.load(w_ptrs, mask=(offs_k[:, None] + k0 < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n[None, :] < N))


def row_tiles(counts: Sequence[int], block_m: int, device) -> tuple[torch.Tensor, ...]:
    """(expert, first row, end row) of every BLOCK_M-row tile of every expert's contiguous run."""
    experts, row0, row1 = [], [], []
    start = 0
    for e, n in enumerate(counts):
        for r in range(start, start + n, block_m):
            experts.append(e)
            row0.append(r)
            row1.append(min(r + block_m, start + n))
        start += n
    as_t = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    return as_t(experts), as_t(row0), as_t(row1)


def grouped_matmul(
    x: torch.Tensor, weights: Sequence[torch.Tensor], counts: Sequence[int], transpose: bool = False
) -> torch.Tensor:
    """Rows of x [M, K] in expert runs (counts[e] rows for expert e, in order) times weights[e].T.

    weights[e] is [N, K] (contiguous, all the same shape); with transpose=True it is used as [K, N]
    (x @ weights[e], the input gradient of the forward).
    """
    m = x.shape[0]
    w0 = weights[0]
    n, k = (w0.shape[1], w0.shape[0]) if transpose else (w0.shape[0], w0.shape[1])
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    for w in weights:
        if not w.is_contiguous() or w.shape != w0.shape or w.dtype != x.dtype:
            raise ValueError("grouped_matmul: expert weights must be contiguous, of one shape and x's dtype")
    x = x.contiguous()
    bm, bn, bk, warps, stages = GROUPED_CONFIG[x.dtype]
    experts, row0, row1 = row_tiles(counts, bm, x.device)
    table = torch.tensor([w.data_ptr() for w in weights], dtype=torch.int64, device=x.device)
    stride_wn, stride_wk = (w0.stride(1), w0.stride(0)) if transpose else (w0.stride(0), w0.stride(1))
    grid = (experts.numel(), triton.cdiv(n, bn))
    _grouped_matmul_kernel[grid](
        x,
        table,
        out,
        experts,
        row0,
        row1,
        m,
        n,
        k,
        x.stride(0),
        x.stride(1),
        stride_wn,
        stride_wk,
        out.stride(0),
        out.stride(1),
        W_DTYPE=_TL_DTYPES[x.dtype],
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        PRECISION=precision_for(x.dtype),
        num_warps=warps,
        num_stages=stages,
    )
    return out


class _GroupedLinear(torch.autograd.Function):
    """Grouped GEMM forward; backward: the input gradient by the transposed grouped GEMM (one launch), the
    weight gradients of every expert by one batched GEMM over the experts' rows padded to the longest run
    (one launch per layer and weight, not one per expert; the zero rows add exact zeros). Fixed shapes and
    no atomics: run to run the same bits (gradients are not part of the engine/trainer bit-identity)."""

    @staticmethod
    def forward(ctx, x, counts, *weights):
        ctx.save_for_backward(x, *weights)
        ctx.counts = counts
        return grouped_matmul(x, weights, counts)

    @staticmethod
    def backward(ctx, grad_out):
        x, *weights = ctx.saved_tensors
        counts = ctx.counts
        grad_out = grad_out.contiguous()
        grad_x = (
            grouped_matmul(grad_out, weights, counts, transpose=True) if ctx.needs_input_grad[0] else None
        )
        wanted = [ctx.needs_input_grad[2 + e] and n > 0 for e, n in enumerate(counts)]
        grad_ws: list[torch.Tensor | None] = [None] * len(counts)
        if any(wanted):
            longest = max(counts)
            # Row r of expert e's run goes to [e, r]: a gather by a precomputed index, no scatter-add.
            starts = torch.tensor([0, *counts[:-1]], device=x.device).cumsum(0)
            rows = torch.arange(longest, device=x.device)
            index = (starts[:, None] + rows[None, :]).clamp(max=x.shape[0] - 1)
            valid = (rows[None, :] < torch.tensor(counts, device=x.device)[:, None]).unsqueeze(-1)
            xs = torch.where(valid, x[index], 0)  # [E, longest, K]
            gs = torch.where(valid, grad_out[index], 0)  # [E, longest, N]
            grads = torch.bmm(gs.transpose(1, 2), xs)  # [E, N, K], one launch
            for e, want in enumerate(wanted):
                if want:  # an expert no row reached keeps no gradient (as a plain autograd graph would)
                    grad_ws[e] = grads[e]
        return (grad_x, None, *grad_ws)


class _GatherRows(torch.autograd.Function):
    """rows = x[pair // top_k] in dispatch order; its backward sums each token's top_k row gradients in slot
    order (a gather by the inverse permutation and a fixed-order sum) instead of index_select's index_add_,
    whose atomics make the order of the additions, and so the bits, vary from run to run on CUDA."""

    @staticmethod
    def forward(ctx, x, order, top_k):
        ctx.top_k = top_k
        ctx.save_for_backward(order)
        return x.index_select(0, order // top_k)

    @staticmethod
    def backward(ctx, grad_rows):
        (order,) = ctx.saved_tensors
        top_k = ctx.top_k
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        per_slot = grad_rows.index_select(0, inverse).view(-1, top_k, grad_rows.shape[-1]).float()
        grad = per_slot[:, 0]
        for j in range(1, top_k):  # fixed order, fp32
            grad = grad + per_slot[:, j]
        return grad.to(grad_rows.dtype), None, None


def grouped_linear(x: torch.Tensor, weights: Sequence[torch.Tensor], counts: Sequence[int]) -> torch.Tensor:
    """Differentiable grouped GEMM (see grouped_matmul)."""
    if torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights)):
        return _GroupedLinear.apply(x, list(counts), *weights)
    return grouped_matmul(x, weights, counts)


def route(router_logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] fp32, experts [T, k]): row softmax in Triton, then the CPU op set's top-k."""
    return top_k_of(softmax(router_logits.float()), top_k, normalize)


def aligned_moe(
    x: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    num_experts: int,
    expert_fn=None,
    expert_weights: tuple[Sequence[torch.Tensor], Sequence[torch.Tensor], Sequence[torch.Tensor]]
    | None = None,
) -> torch.Tensor:
    """SwiGLU experts over x [T, H] by grouped GEMMs; expert_weights = (gate, up, down) weight lists.

    (expert_fn is the CPU op sets' per-expert callable; the grouped path reads the weights instead.)
    """
    if expert_weights is None:
        raise ValueError("the Triton MoE needs expert_weights (gate, up, down lists)")
    gate_w, up_w, down_w = expert_weights
    t, top_k = experts.shape
    flat_expert = experts.reshape(-1)
    order = torch.sort(flat_expert, stable=True).indices
    counts = torch.bincount(flat_expert, minlength=num_experts).tolist()
    if torch.is_grad_enabled() and x.requires_grad:
        xs = _GatherRows.apply(x, order, top_k)
    else:
        xs = x.index_select(0, order // top_k)
    h = silu_mul(grouped_linear(xs, gate_w, counts), grouped_linear(xs, up_w, counts))
    y = grouped_linear(h, down_w, counts)
    outputs = x.new_zeros(t * top_k, x.shape[-1], dtype=torch.float32).index_copy(0, order, y.float())
    outputs = outputs.view(t, top_k, -1)
    out = outputs[:, 0] * weights[:, :1]
    for j in range(1, top_k):  # fixed order, fp32
        out = out + outputs[:, j] * weights[:, j : j + 1]
    return out.to(x.dtype)
