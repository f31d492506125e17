"""Batch-invariant GEMM in Triton: `x @ weight.T` with a fixed reduction order per output element.

Every output element is fp32 accumulators fed by `tl.dot` over K in blocks of BLOCK_K, always in the same
order (k = 0, BLOCK_K, 2 BLOCK_K, ... within each of a fixed number of K splits, the splits then summed in
order; see "Split-K" below), with no atomics. M is never specialized
(`do_not_specialize`), so M = 1 and M = 16 run the same binary. fp32 uses `input_precision="ieee"` (the
default would be TF32).

One tile config per dtype, whatever M (`GEMM_CONFIG`), as the public batch-invariant kernels do. A table
keyed on M (small tiles for decode, big ones for training) keeps BLOCK_K and the K loop, but on Hopper
BLOCK_M 16 compiles to `mma.sync` and 64/128 to `wgmma`: different instructions whose per-element sums
nothing guarantees to agree, so an engine decoding 16 rows and a trainer running 512-row chunks could differ
in the last bit. The earlier per-M table is kept as `GEMM_CONFIGS_BY_M`, selected by
`RZ_TRITON_GEMM_TILES=by_m` (or `set_gemm_tiles("by_m")`, or `table=` per call), so that
`scripts/gpu_check.py` can measure its speed and its bits against the single config on a real GPU; the
interpreter (CPU tests) computes every config with the same fixed-order dot, so only a GPU can tell them
apart. Engine and trainer must use the same mode. The single config is wgmma-shaped (64 rows: one warpgroup)
with 128 columns: at decode sizes the grid alone would be N / 128 programs (Qwen3-4B's o_proj and down_proj,
N = 2560: 20 programs on 132 SMs).

Split-K (issue 37): the K range is cut into ``split_count(K, N)`` splits, a function of K and N only (never
of M), each a run of whole BLOCK_K blocks; a program per (tile, split) accumulates its split in fp32 exactly
as the unsplit kernel does (same tl.dot, same block order within the split) and stores the fp32 partial; a
combine kernel sums each element's partials in split order 0, 1, ..., S - 1 (fp32, from partial 0) and casts
once, as split-KV attention folds its splits. Every M therefore gives an element the same partials summed in
the same order: batch-invariant, engine and trainer alike; o_proj / down_proj of Qwen3-4B run 6 x 20 = 120
programs at decode. Wide outputs (>= WIDE_N_TILES column tiles: gate/up, the LM head) fill the SMs by columns
and keep S = 1 (no partials); N enters only through that test, so narrow parts stacked into one GEMM (fused
q/k/v, model/fused.py) split as the stack does. ``fusion_keeps_bits`` (the op set's ``fusable``) checks it per
stack: a stack straddling the threshold runs unfused. The partials cost S * M * N * 4 bytes written and read
once: at decode a few MB against the weight's tens of MB; in training rows are launched in chunks of
``SPLIT_ROWS`` so the scratch stays bounded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# The tile config per dtype, for every M. BLOCK_K is 64 for 16-bit inputs, 32 for fp32.
GEMM_CONFIG: dict[torch.dtype, GemmConfig] = {
    torch.bfloat16: GemmConfig(64, 128, 64, 4, 4),
    torch.float16: GemmConfig(64, 128, 64, 4, 4),
    torch.float32: GemmConfig(64, 64, 32, 4, 3),
}

# The earlier per-M table, (largest M, config) per dtype: the first row whose bound is >= M applies. Same
# BLOCK_K per dtype; kept only to be measured against GEMM_CONFIG (see the module docstring).
GEMM_CONFIGS_BY_M: dict[torch.dtype, tuple[tuple[int, GemmConfig], ...]] = {
    torch.bfloat16: (
        (16, GemmConfig(16, 32, 64, 4, 5)),
        (64, GemmConfig(64, 64, 64, 4, 4)),
        (256, GemmConfig(64, 128, 64, 4, 4)),
        (1 << 62, GemmConfig(128, 256, 64, 8, 3)),
    ),
    torch.float16: (
        (16, GemmConfig(16, 32, 64, 4, 5)),
        (64, GemmConfig(64, 64, 64, 4, 4)),
        (256, GemmConfig(64, 128, 64, 4, 4)),
        (1 << 62, GemmConfig(128, 256, 64, 8, 3)),
    ),
    torch.float32: (
        (16, GemmConfig(16, 32, 32, 4, 4)),
        (64, GemmConfig(64, 64, 32, 4, 3)),
        (1 << 62, GemmConfig(128, 128, 32, 8, 3)),
    ),
}

TILE_MODES = ("single", "by_m")
_tiles = os.environ.get("RZ_TRITON_GEMM_TILES", "single")


def set_gemm_tiles(mode: str) -> None:
    """Choose the tile configs for this process: "single" (default: GEMM_CONFIG) or "by_m" (the old table)."""
    global _tiles
    if mode not in TILE_MODES:
        raise ValueError(f"gemm tiles must be one of {TILE_MODES}, got {mode!r}")
    _tiles = mode


def gemm_tiles() -> str:
    """The current tile mode (see `set_gemm_tiles`)."""
    if _tiles not in TILE_MODES:
        raise ValueError(f"RZ_TRITON_GEMM_TILES must be one of {TILE_MODES}, got {_tiles!r}")
    return _tiles


def config_for(dtype: torch.dtype, m: int, table=None) -> GemmConfig:
    """The tile config for M rows of `dtype`: GEMM_CONFIG's, or from a per-M `table` (or the "by_m"
    mode's)."""
    if table is None and gemm_tiles() == "by_m":
        table = GEMM_CONFIGS_BY_M
    if table is None:
        return GEMM_CONFIG[dtype]
    rows = table[dtype]
    for bound, cfg in rows:
        if m <= bound:
            return cfg
    return rows[-1][1]


def precision_for(dtype: torch.dtype) -> str | None:
    # fp32 must not silently run in TF32 on the GPU; 16-bit inputs ignore input_precision.
    return "ieee" if dtype == torch.float32 else None


# Split-K: outputs of at least WIDE_N_TILES column tiles (half the H100 / H200's 132 SMs, rounded up) fill the
# SMs by columns and are not split; narrower ones split K into runs of at least MIN_K_BLOCKS_PER_SPLIT blocks,
# at most MAX_SPLITS (6 x Qwen3-4B's 20 o_proj / down_proj tiles = 120 programs).
WIDE_N_TILES = 67
MIN_K_BLOCKS_PER_SPLIT = 8
MAX_SPLITS = 6
# Rows per launch when S > 1 (bounds the fp32 partials' scratch: S * SPLIT_ROWS * N * 4 bytes).
SPLIT_ROWS = 4096


def split_count(k: int, n: int, cfg: GemmConfig) -> tuple[int, int]:
    """(splits S, K blocks per split) for a [*, K] x [K, N] GEMM with tile config ``cfg``: a function of K and
    N only (never of M). N enters only as wide (>= WIDE_N_TILES column tiles: S = 1) or narrow (S from K), so
    projections stacked from narrow parts (q/k/v) split alike and stay fusable; then trimmed so that no
    split is empty."""
    k_blocks = triton.cdiv(k, cfg.block_k)
    if triton.cdiv(n, cfg.block_n) >= WIDE_N_TILES:
        return 1, k_blocks
    want = min(k_blocks // MIN_K_BLOCKS_PER_SPLIT, MAX_SPLITS)
    if want <= 1:
        return 1, k_blocks
    per = triton.cdiv(k_blocks, want)
    return triton.cdiv(k_blocks, per), per


def fusion_keeps_bits(sizes, k: int, dtype: torch.dtype) -> bool:
    """Whether one GEMM over weights stacked row-wise ([sum(sizes), k]) gives each part's columns bit for bit:
    the same tiles and K blocks, so the same split count for the stack and every part."""
    cfg = GEMM_CONFIG[dtype]
    whole = split_count(k, sum(sizes), cfg)
    return all(split_count(k, n, cfg) == whole for n in sizes)


@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    K_PER_SPLIT,
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    stride_cs,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PRECISION: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """C tile (pid) over K blocks [split * K_PER_SPLIT, ...) (SPLIT: the fp32 partial to c_ptr's split
    slice, else the whole K cast to c's dtype)."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Grouped launch order (L2 reuse of weight tiles); it changes which program computes a tile, not how.
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    if SPLIT:
        split = tl.program_id(1)
        k_lo = split * K_PER_SPLIT
        k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
        c_ptr += split.to(tl.int64) * stride_cs
    else:
        k_lo = 0
        k_hi = K
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + (k_lo + offs_k[None, :]) * stride_ak
    b_ptrs = b_ptr + (k_lo + offs_k[:, None]) * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] + k0 < k_hi), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] + k0 < k_hi) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit(do_not_specialize=["M"])
def _splitk_combine_kernel(part_ptr, c_ptr, M, N, S, stride_ps, stride_cm, BLOCK: tl.constexpr):
    """c[m, n] = sum of the S fp32 partials of (m, n) in split order 0, 1, ..., cast once."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M.to(tl.int64) * N
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for s in range(1, S):
        acc += tl.load(part_ptr + s * stride_ps + offs, mask=mask, other=0.0)
    row = offs // N
    col = offs % N
    tl.store(c_ptr + row * stride_cm + col, acc.to(c_ptr.dtype.element_ty), mask=mask)


COMBINE_BLOCK = 1024


def matmul(x: torch.Tensor, weight: torch.Tensor, table=None) -> torch.Tensor:
    """[M, K] @ weight[N, K].T -> [M, N] in x's dtype, batch-invariant (see module docstring)."""
    if x.dtype != weight.dtype:
        raise ValueError(f"matmul: x is {x.dtype}, weight is {weight.dtype}")
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    x = x.contiguous()
    cfg = config_for(x.dtype, m, table)
    # The per-M table (a measurement mode) runs unsplit; the single config splits K by (K, N).
    if table is not None or gemm_tiles() == "by_m":
        splits, per = 1, triton.cdiv(k, cfg.block_k)
    else:
        splits, per = split_count(k, n, cfg)
    stages = _STAGES.get(cfg, cfg.num_stages)
    while True:
        try:
            if splits == 1:
                grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), 1)
                _launch(x, weight, out, cfg, grid, stages, 1, per)
            else:
                for r0 in range(0, m, SPLIT_ROWS):  # rows are independent: chunks bound the scratch
                    _split_launch(
                        x[r0 : r0 + SPLIT_ROWS], weight, out[r0 : r0 + SPLIT_ROWS], cfg, stages, splits, per
                    )
            return out
        except OutOfResources:
            # A GPU with less shared memory: pipeline fewer K blocks ahead. Same tiles, same K order,
            # so the same arithmetic; remembered for the process.
            if stages <= 1:
                raise
            stages -= 1
            _STAGES[cfg] = stages


# Pipeline depth actually used per config (lowered once if the GPU lacks the shared memory).
_STAGES: dict[GemmConfig, int] = {}


def _split_launch(x, weight, out, cfg: GemmConfig, stages: int, splits: int, per: int) -> None:
    """S partial GEMMs into fp32 scratch [S, m, n], then the fixed-order combine into ``out``."""
    m, k = x.shape
    n = weight.shape[0]
    part = torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), splits)
    _launch(x, weight, part, cfg, grid, stages, splits, per)
    _splitk_combine_kernel[(triton.cdiv(m * n, COMBINE_BLOCK),)](
        part, out, m, n, splits, part.stride(0), out.stride(0), BLOCK=COMBINE_BLOCK
    )


def _launch(x, weight, dest, cfg: GemmConfig, grid, stages: int, splits: int, per: int) -> None:
    """The tile kernel over ``grid``; ``dest`` is the output [m, n] (S = 1) or the fp32 partials [S, m, n]."""
    _matmul_kernel[grid](
        x,
        weight,
        dest,
        x.shape[0],
        weight.shape[0],
        x.shape[1],
        per * cfg.block_k,
        x.stride(0),
        x.stride(1),
        weight.stride(0),
        weight.stride(1),
        dest.stride(-2),
        dest.stride(-1),
        dest.stride(0) if splits > 1 else 0,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=8,
        PRECISION=precision_for(x.dtype),
        SPLIT=splits > 1,
        num_warps=cfg.num_warps,
        num_stages=stages,
    )


class _TritonLinear(torch.autograd.Function):
    """Aligned forward; backward as two plain GEMMs (gradients are not part of the bit-identity contract)."""

    @staticmethod
    def forward(ctx, x2: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x2, weight)
        return matmul(x2, weight)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x2, weight = ctx.saved_tensors
        grad_x = grad_out.mm(weight) if ctx.needs_input_grad[0] else None
        grad_w = grad_out.t().mm(x2) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T (+ bias)` on the aligned Triton GEMM (the op set's `linear`)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if torch.is_grad_enabled() and (x2.requires_grad or weight.requires_grad):
        out = _TritonLinear.apply(x2, weight)
    else:
        out = matmul(x2, weight)
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, weight.shape[0])
