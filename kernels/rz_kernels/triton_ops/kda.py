"""Kimi Delta Attention (the delta rule with a per-channel decay, g [T, H, dk]) in Triton, on the gated
delta rule's fixed chunk grid and cache contract (rz_kernels.triton_ops.delta_rule assembles the chunks
and calls `launch_kda` when g has a channel dimension).

The kernel is the scalar-decay kernel's, with the decay per key channel, as the CPU kernel's
`_prepare_channel_decay`: the chunk's pair terms are no longer one product times one decay, but a sum over
key channels, L[i, j] = -sum_d beta_i k_id k_jd exp(gc_id - gc_jd) and A[i, j] = sum_d q_id k_jd exp(gc_id -
gc_jd) (j <= i; gc the chunk's cumulative log decay per channel). Each entry is reduced over channels in
blocks of CHANNEL_BLOCK ([C, C, CHANNEL_BLOCK] products summed over the block, the blocks accumulated in
order): a fixed order that reads rows i and j alone, so the row argument of the scalar kernel holds — a
token's output is a function of the rows at or before it, through exact zeros elsewhere. The exponent is
always gc_i - gc_j <= 0 (masked to the lower triangle before exp), never the unstable exp(gc) exp(-gc)
factorization. The rest is diagonal: w = (I - L)^-1 (beta k exp(gc)), o = (q exp(gc)) S + A v', and a
complete chunk's state S <- Diag(exp(gc_last)) S + (k exp(gc_last - gc))^T v'.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rz_kernels.delta_rule import CHUNK
from rz_kernels.triton_ops.unit_lower import unit_lower_inverse

BLOCK_V = 32  # value columns per program (the state block held is [dk, BLOCK_V] fp32)
CHANNEL_BLOCK = 4  # key channels per [C, C, CHANNEL_BLOCK] step of the pair sums (bounds registers)
PRECISION: tl.constexpr = tl.constexpr("tf32x3")  # as the scalar kernel (its module docstring says why)
NUM_WARPS = 8


@triton.jit
def _channel_pairs(q_ptr, k_ptr, g_ptr, beta, tok, h, H, DK, scale, rows, C: tl.constexpr,
                   BK: tl.constexpr, BD: tl.constexpr):  # fmt: skip
    """The chunk's two pair matrices [C, C]: sum_d beta_i k_id k_jd e_ijd and sum_d q_id k_jd e_ijd with
    e_ijd = exp(gc_id - gc_jd) on and below the diagonal, 0 above; channels in blocks of BD, in order."""
    lower = (rows[:, None] >= rows[None, :])[:, :, None]
    kk = tl.zeros([C, C], dtype=tl.float32)
    qk = tl.zeros([C, C], dtype=tl.float32)
    for d0 in range(0, BK, BD):
        cols = d0 + tl.arange(0, BD)
        off = (tok[:, None] * H + h) * DK + cols[None, :]
        m = (cols < DK)[None, :]
        kd = tl.load(k_ptr + off, mask=m, other=0.0)
        qd = tl.load(q_ptr + off, mask=m, other=0.0) * scale
        gd = tl.cumsum(tl.load(g_ptr + off, mask=m, other=0.0), 0)  # a channel's cumsum: its own column
        diff = tl.where(lower, gd[:, None, :] - gd[None, :, :], 0.0)
        kj = kd[None, :, :] * tl.where(lower, tl.exp(diff), 0.0)  # k_jd e_ijd
        kk += tl.sum((kd * beta[:, None])[:, None, :] * kj, axis=2)
        qk += tl.sum(qd[:, None, :] * kj, axis=2)
    return kk, qk


@triton.jit(do_not_specialize=["keep"])
def _kda_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, s0_ptr, first_ptr, count_ptr, full_ptr,
    out_ptr, s_out_ptr, snap_ptr, H, DK, DV, scale, keep,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    rows = tl.arange(0, C)
    kc = tl.arange(0, BK)
    vc = tl.program_id(2) * BV + tl.arange(0, BV)
    kmask = kc < DK
    vmask = vc < DV
    lower = rows[:, None] >= rows[None, :]
    strict = rows[:, None] > rows[None, :]
    st_off = kc[:, None] * DV + vc[None, :]
    st_mask = kmask[:, None] & vmask[None, :]
    S = tl.load(s0_ptr + (s * H + h) * DK * DV + st_off, mask=st_mask, other=0.0)
    first = tl.load(first_ptr + s).to(tl.int64)
    count = tl.load(count_ptr + s)
    full = tl.load(full_ptr + s)
    for c in range(0, count):
        tok = (first + c) * C + rows  # the chunk's rows in the padded buffer
        k_off = (tok[:, None] * H + h) * DK + kc[None, :]
        v_off = (tok[:, None] * H + h) * DV + vc[None, :]
        q = tl.load(q_ptr + k_off, mask=kmask[None, :], other=0.0) * scale
        k = tl.load(k_ptr + k_off, mask=kmask[None, :], other=0.0)
        v = tl.load(v_ptr + v_off, mask=vmask[None, :], other=0.0)
        gc = tl.cumsum(tl.load(g_ptr + k_off, mask=kmask[None, :], other=0.0), 0)  # [C, BK]
        beta = tl.load(b_ptr + tok * H + h)
        kk, qk = _channel_pairs(q_ptr, k_ptr, g_ptr, beta, tok, h, H, DK, scale, rows, C, BK, BD)
        inv = unit_lower_inverse(tl.where(strict, -kk, 0.0), rows, C)  # (I - L)^-1
        egc = tl.exp(gc)
        u = tl.dot(inv, v * beta[:, None], input_precision=PRECISION)
        w = tl.dot(inv, k * beta[:, None] * egc, input_precision=PRECISION)
        v_new = u - tl.dot(w, S, input_precision=PRECISION)
        o = tl.dot(q * egc, S, input_precision=PRECISION)
        o += tl.dot(tl.where(lower, qk, 0.0), v_new, input_precision=PRECISION)
        tl.store(out_ptr + v_off, o, mask=vmask[None, :])
        if c < full:
            last = tl.sum(tl.where((rows == C - 1)[:, None], gc, 0.0), axis=0)  # exact: one nonzero term
            k_tail = k * tl.exp(last[None, :] - gc)
            S = S * tl.exp(last)[:, None] + tl.dot(tl.trans(k_tail), v_new, input_precision=PRECISION)
            if keep != 0:
                tl.store(snap_ptr + ((first + c) * H + h) * DK * DV + st_off, S, mask=st_mask)
    tl.store(s_out_ptr + (s * H + h) * DK * DV + st_off, S, mask=st_mask)


def launch_kda(
    bufs: dict[str, torch.Tensor],
    state0: torch.Tensor,
    index: list[torch.Tensor],
    out: torch.Tensor,
    state: torch.Tensor,
    snaps: torch.Tensor,
    scale: float,
    keep: bool,
) -> None:
    """Run the KDA kernel over the assembled, chunk-padded buffers (q, k, g [rows, H, dk], v [rows, H, dv],
    beta [rows, H]): outputs into `out`, each sequence's final state into `state`, and with `keep` the
    state after each complete chunk into `snaps` (the scalar kernel's launch contract)."""
    nseq, h, dk, dv = state0.shape
    bv = min(BLOCK_V, max(16, triton.next_power_of_2(dv)))
    bk = max(16, triton.next_power_of_2(dk))
    grid = (nseq, h, triton.cdiv(dv, bv))
    _kda_kernel[grid](
        bufs["q"], bufs["k"], bufs["v"], bufs["g"], bufs["beta"], state0, index[0], index[1], index[2],
        out, state, snaps, h, dk, dv, scale, int(keep),
        C=CHUNK, BK=bk, BV=bv, BD=min(CHANNEL_BLOCK, bk), num_warps=NUM_WARPS,
    )  # fmt: skip
