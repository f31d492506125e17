"""Aligned mixture-of-experts on Triton: stable dispatch, one grouped GEMM launch per projection, fixed
combine.

Routing: router softmax one program per row (fp32), top-k by a stable descending sort. Dispatch: the
(token, slot) pairs are stably sorted by expert, so each expert owns one contiguous run of rows. The
grouped GEMM runs every expert's rows in one launch: a table of row tiles (expert, first row, last row)
and a table of the experts' weight addresses; each tile walks K in fixed BLOCK_K blocks with an fp32
accumulator exactly like the dense GEMM, with ONE tile config whatever the expert's row count — so a
token's expert output never depends on which other tokens chose that expert. No atomics anywhere: the
top-k outputs of a token are combined in fp32 in its top-k order (elementwise, exact per token).

Nothing is read back to the host (no ``.tolist()``, ``.item()``, ``torch.unique``), forward or backward: the
grouping (``group_by_expert``) is built on the device, the way fused-MoE kernels do it. Each expert's run
is cut into BLOCK_M-row tiles (the last one partial, masked); the tile table has an upper bound of tiles
known from the shapes alone (tokens * top_k // BLOCK_M full tiles, plus at most one partial tile per
expert: ``max_tiles``), so the launch grid never depends on the routing, and the tiles past the real ones
exit at once. The tiles are the ones the host-built table had (cut from each run's start): the forward and
the input gradients keep their bits. The weight gradients come from one grouped launch per projection that
sums each expert's rows in order (``grouped_weight_grad``; the padded batched GEMM it replaces needed the
longest run on the host); an expert no row reached gets a zero gradient, not None (the host cannot know).
The experts' weight addresses (the pointer table) live on the device, built once per set of addresses and
reused (``pointer_table``): a decode step captured in a CUDA graph allocates no pinned memory and copies
nothing from the host; the capture's warm-up builds the tables, and a table a graph captured is never evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rz_kernels.moe import top_k_of
from rz_kernels.triton_ops.clamped_swiglu import clamped_swiglu
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
    row0 = tl.load(tile_row0 + tile).to(tl.int64)
    row1 = tl.load(tile_row1 + tile).to(tl.int64)
    if row0 >= row1:  # a tile past the real ones (the grid is an upper bound): nothing to do
        return
    expert = tl.load(tile_expert + tile)
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


@triton.jit(do_not_specialize=["N", "K"])
def _grouped_weight_grad_kernel(
    g_ptr,
    x_ptr,
    out_ptr,
    run_start,
    run_end,
    N,
    K,
    stride_gm,
    stride_gn,
    stride_xm,
    stride_xk,
    stride_oe,
    stride_on,
    stride_ok,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """out[e] = g[run e].T @ x[run e]: one program per (expert, N block, K block) walks its expert's rows in
    order in BLOCK_M steps with one fp32 accumulator (fixed order, no atomics; an expert without rows: 0)."""
    expert = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    row0 = tl.load(run_start + expert).to(tl.int64)
    row1 = tl.load(run_end + expert).to(tl.int64)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k.to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for r0 in range(row0, row1, BLOCK_M):
        rows = r0 + offs_m
        row_ok = rows < row1
        g = tl.load(  # [BLOCK_N, BLOCK_M]: the gradient rows, transposed by the addressing
            g_ptr + rows[None, :] * stride_gm + offs_n[:, None] * stride_gn,
            mask=row_ok[None, :] & (offs_n[:, None] < N),
            other=0.0,
        )
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + offs_k[None, :] * stride_xk,
            mask=row_ok[:, None] & (offs_k[None, :] < K),
            other=0.0,
        )
        acc = tl.dot(g, x, acc, input_precision=PRECISION)
    out_ptrs = out_ptr + expert * stride_oe + offs_n[:, None] * stride_on + offs_k[None, :] * stride_ok
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(offs_n[:, None] < N) & (offs_k[None, :] < K))


# (BLOCK_M: rows summed per step, BLOCK_N, BLOCK_K, warps, stages) of the weight-gradient kernel per dtype.
WEIGHT_GRAD_CONFIG = {
    torch.bfloat16: (32, 64, 64, 4, 3),
    torch.float16: (32, 64, 64, 4, 3),
    torch.float32: (32, 32, 32, 4, 3),
}


@dataclass(frozen=True)
class Grouping:
    """The (token, slot) pairs grouped by expert, all on the device (``group_by_expert``).

    ``order``: pair index at each dispatch row (a stable sort by expert); ``run_start`` / ``run_end`` [E]: the
    rows of each expert's contiguous run; ``tile_*`` [max tiles]: expert, first and end row of every
    ``block_m``-row tile of every run, then empty tiles (first row == end row == 0) up to the bound."""

    order: torch.Tensor
    run_start: torch.Tensor
    run_end: torch.Tensor
    tile_expert: torch.Tensor
    tile_row0: torch.Tensor
    tile_row1: torch.Tensor
    block_m: int

    @property
    def num_experts(self) -> int:
        return self.run_start.numel()


def max_tiles(rows: int, num_experts: int, block_m: int) -> int:
    """The most ``block_m``-row tiles ``rows`` rows cut into runs of ``num_experts`` experts can take (from
    the shapes alone): the full tiles, plus at most one partial tile per expert."""
    return rows // block_m + min(num_experts, rows)


def group_by_expert(flat_expert: torch.Tensor, num_experts: int, block_m: int) -> Grouping:
    """The grouping of the pairs whose experts are ``flat_expert`` [T * top_k], built with device ops only."""
    sorted_expert, order = torch.sort(flat_expert, stable=True)
    # Each run's bounds by binary search in the sorted experts (not bincount: on CUDA it reads the
    # input's max back to the host to size its output).
    expert_ids = torch.arange(num_experts, device=flat_expert.device, dtype=sorted_expert.dtype)
    run_start = torch.searchsorted(sorted_expert, expert_ids)
    run_end = torch.searchsorted(sorted_expert, expert_ids, right=True)
    counts = run_end - run_start
    tiles = (counts + block_m - 1) // block_m
    tile_end = tiles.cumsum(0)
    index = torch.arange(max_tiles(flat_expert.numel(), num_experts, block_m), device=flat_expert.device)
    owner = torch.searchsorted(tile_end, index, right=True)  # == num_experts past the real tiles
    real = owner < num_experts
    owner = owner.clamp(max=num_experts - 1)
    row0 = run_start[owner] + (index - (tile_end - tiles)[owner]) * block_m
    row1 = torch.minimum(row0 + block_m, run_end[owner])
    zero = torch.zeros_like(row0)
    as_i32 = lambda t: t.to(torch.int32)  # noqa: E731
    return Grouping(
        order,
        as_i32(run_start),
        as_i32(run_end),
        as_i32(owner),
        as_i32(torch.where(real, row0, zero)),
        as_i32(torch.where(real, row1, zero)),
        block_m,
    )


# Device pointer tables by (device, the experts' addresses): the table's content IS its key, so a hit is
# always right (even for new tensors that reuse old addresses). Bounded: the least recently used are dropped,
# except those a CUDA graph captured (the graph reads the table's memory at every replay).
_POINTER_TABLES: OrderedDict[tuple, torch.Tensor] = OrderedDict()
_CAPTURED_TABLES: set[tuple] = set()
MAX_POINTER_TABLES = 1024


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def pointer_table(weights: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The experts' weight addresses as an int64 tensor on ``device``, made once per set of addresses.

    A miss builds it from the host (on CUDA from pinned memory without a wait: a pageable copy would make the
    host wait for the GPU); a hit is the same device tensor, so a CUDA-graph capture (whose warm-up made the
    table) allocates nothing and copies nothing. A miss during a capture raises (the table would be a copy
    from host memory baked into the graph): the engine then decodes eagerly, same bits."""
    key = (str(device), *(w.data_ptr() for w in weights))
    capturing = _capturing(device)
    table = _POINTER_TABLES.get(key)
    if table is not None:
        _POINTER_TABLES.move_to_end(key)
        if capturing:
            _CAPTURED_TABLES.add(key)
        return table
    if capturing:
        raise RuntimeError(
            "grouped_matmul: no device pointer table for these expert weights during a CUDA-graph capture "
            "(run the step once before capturing: the warm-up builds it)"
        )
    host = torch.tensor([w.data_ptr() for w in weights], dtype=torch.int64)
    table = host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)
    _POINTER_TABLES[key] = table
    while len(_POINTER_TABLES) > MAX_POINTER_TABLES:
        old = next((k for k in _POINTER_TABLES if k not in _CAPTURED_TABLES), None)
        if old is None:
            break
        del _POINTER_TABLES[old]
    return table


def grouped_matmul(
    x: torch.Tensor, weights: Sequence[torch.Tensor], grouping: Grouping, transpose: bool = False
) -> torch.Tensor:
    """Rows of x [M, K] in expert runs (``grouping``) times weights[e].T.

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
    if grouping.block_m != bm:
        raise ValueError(f"grouped_matmul: a grouping of {grouping.block_m}-row tiles, the kernel's are {bm}")
    table = pointer_table(weights, x.device)
    stride_wn, stride_wk = (w0.stride(1), w0.stride(0)) if transpose else (w0.stride(0), w0.stride(1))
    grid = (grouping.tile_row0.numel(), triton.cdiv(n, bn))
    _grouped_matmul_kernel[grid](
        x,
        table,
        out,
        grouping.tile_expert,
        grouping.tile_row0,
        grouping.tile_row1,
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


def grouped_weight_grad(grad_out: torch.Tensor, x: torch.Tensor, grouping: Grouping) -> torch.Tensor:
    """[E, N, K]: for each expert e, grad_out[run e].T @ x[run e] (one launch for every expert)."""
    m, n = grad_out.shape
    k = x.shape[1]
    e = grouping.num_experts
    out = torch.empty(e, n, k, dtype=x.dtype, device=x.device)
    bm, bn, bk, warps, stages = WEIGHT_GRAD_CONFIG[x.dtype]
    grad_out, x = grad_out.contiguous(), x.contiguous()
    grid = (e, triton.cdiv(n, bn), triton.cdiv(k, bk))
    _grouped_weight_grad_kernel[grid](
        grad_out,
        x,
        out,
        grouping.run_start,
        grouping.run_end,
        n,
        k,
        grad_out.stride(0),
        grad_out.stride(1),
        x.stride(0),
        x.stride(1),
        out.stride(0),
        out.stride(1),
        out.stride(2),
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
    weight gradients of every expert by one grouped weight-gradient launch (each expert's rows summed in
    order, no atomics). Fixed shapes and no atomics: run to run the same bits (gradients are not part of the
    engine/trainer bit-identity). The host does not know which experts the rows reached: an expert no row
    reached gets a zero gradient (not None), as FSDP2's reduce-scatter of unused parameters gives it."""

    @staticmethod
    def forward(ctx, x, grouping, *weights):
        ctx.save_for_backward(x, *weights)
        ctx.grouping = grouping
        return grouped_matmul(x, weights, grouping)

    @staticmethod
    def backward(ctx, grad_out):
        x, *weights = ctx.saved_tensors
        grouping = ctx.grouping
        grad_out = grad_out.contiguous()
        grad_x = (
            grouped_matmul(grad_out, weights, grouping, transpose=True) if ctx.needs_input_grad[0] else None
        )
        grad_ws: list[torch.Tensor | None] = [None] * len(weights)
        if any(ctx.needs_input_grad[2:]):
            grads = grouped_weight_grad(grad_out, x, grouping)  # [E, N, K], one launch
            for e in range(len(weights)):
                if ctx.needs_input_grad[2 + e]:
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


def grouped_linear(x: torch.Tensor, weights: Sequence[torch.Tensor], grouping: Grouping) -> torch.Tensor:
    """Differentiable grouped GEMM (see grouped_matmul)."""
    if torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights)):
        return _GroupedLinear.apply(x, grouping, *weights)
    return grouped_matmul(x, weights, grouping)


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
    swiglu_limit: float | None = None,
) -> torch.Tensor:
    """SwiGLU experts over x [T, H] by grouped GEMMs; expert_weights = (gate, up, down) weight lists.

    (expert_fn is the CPU op sets' per-expert callable; the grouped path reads the weights instead.)
    swiglu_limit: DeepSeek-V4's clamped activation, silu(min(gate, limit)) * clamp(up, -limit, limit).
    """
    if expert_weights is None:
        raise ValueError("the Triton MoE needs expert_weights (gate, up, down lists)")
    gate_w, up_w, down_w = expert_weights
    t, top_k = experts.shape
    grouping = group_by_expert(experts.reshape(-1), num_experts, GROUPED_CONFIG[x.dtype][0])
    order = grouping.order
    if torch.is_grad_enabled() and x.requires_grad:
        xs = _GatherRows.apply(x, order, top_k)
    else:
        xs = x.index_select(0, order // top_k)
    gate, up = grouped_linear(xs, gate_w, grouping), grouped_linear(xs, up_w, grouping)
    h = silu_mul(gate, up) if swiglu_limit is None else clamped_swiglu(gate, up, swiglu_limit)
    y = grouped_linear(h, down_w, grouping)
    outputs = x.new_zeros(t * top_k, x.shape[-1], dtype=torch.float32).index_copy(0, order, y.float())
    outputs = outputs.view(t, top_k, -1)
    out = outputs[:, 0] * weights[:, :1]
    for j in range(1, top_k):  # fixed order, fp32
        out = out + outputs[:, j] * weights[:, j : j + 1]
    return out.to(x.dtype)
