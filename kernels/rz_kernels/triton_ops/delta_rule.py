"""The gated delta rule in Triton on the CPU kernel's fixed chunk grid (the op set's `delta_rule`).

The grid, the cache and the interface are rz_kernels.delta_rule's: chunk c of a sequence always holds its
tokens [c * CHUNK, (c + 1) * CHUNK); a call that ends inside a chunk keeps the chunk's inputs in the
`DeltaRuleCache` and the next call recomputes the chunk from its start; the state entering a chunk is updated
only when the chunk is complete. Every chunk is computed zero-padded to CHUNK rows with the same fixed-shape
tile products, all lower triangular, so a row's result is a function of the rows at or before it (the rows
after it, and the padding, enter through exact zero coefficients): a token gets the same bits in the
learner's packed forward, a prefill cut at any offset, any batch and a one-token decode.

One program per (sequence, head, block of value columns) walks its sequence's chunks in order, holding the
state [dk, BLOCK_V] (the delta rule is independent per value column). Per chunk, as the CPU kernel:
L = -strict_lower(beta k k^T * decay), (I - L)^-1 by forward substitution (row by row, in a runtime
loop), u = (I - L)^-1 (beta v), w = (I - L)^-1 (beta k exp(gc)), v' = u - w S,
o = (q exp(gc)) S + (q k^T * decay) v', and, for a complete chunk, S <- exp(gc_last) S + (k exp(gc_last -
gc))^T v'. All products are fp32 `tl.dot`s (PRECISION). The interpreter's result is close to the CPU
kernel's, not equal (the CPU solves by blocked doubling, its GEMMs are BLAS's); the contract, as for the
other Triton ops, is that the engine's and the learner's uses of this kernel agree bit for bit.
With g [T, H, dk] (Kimi Delta Attention's per-channel decay) the same assembly runs the KDA kernel
(triton_ops/kda.py) on the same grid and cache contract.
Backward: autograd through the torch form.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from rz_kernels.delta_rule import CHUNK, DeltaRuleCache
from rz_kernels.delta_rule import gated_delta_rule as torch_gated_delta_rule
from rz_kernels.triton_ops.kda import launch_kda
from rz_kernels.triton_ops.recompute import with_reference_backward
from rz_kernels.triton_ops.unit_lower import unit_lower_inverse

# Value columns per program (the state block held is [dk, BLOCK_V] fp32).
BLOCK_V = 32
# fp32 products on the tensor cores with three TF32 passes (close to fp32; plain "ieee" fp32 dots of these
# tiles compile to FMA code that spilled ~67k registers and took 5 min to compile for sm_90a). The
# interpreter computes every dot in exact fp32 order whatever this says.
PRECISION: tl.constexpr = tl.constexpr("tf32x3")
NUM_WARPS = 8


@triton.jit(do_not_specialize=["keep"])
def _delta_rule_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, s0_ptr, first_ptr, count_ptr, full_ptr,
    out_ptr, s_out_ptr, snap_ptr, H, DK, DV, scale, keep,
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
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
        g = tl.load(g_ptr + tok * H + h)
        beta = tl.load(b_ptr + tok * H + h)
        gc = tl.cumsum(g, 0)
        decay = tl.where(lower, tl.exp(tl.where(lower, gc[:, None] - gc[None, :], 0.0)), 0.0)
        egc = tl.exp(gc)
        kb = k * beta[:, None]
        kk = tl.dot(kb, tl.trans(k), input_precision=PRECISION)
        low = tl.where(strict, -(kk * decay), 0.0)
        inv = unit_lower_inverse(low, rows, C)  # (I - L)^-1 by forward substitution
        u = tl.dot(inv, v * beta[:, None], input_precision=PRECISION)
        w = tl.dot(inv, kb * egc[:, None], input_precision=PRECISION)
        v_new = u - tl.dot(w, S, input_precision=PRECISION)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        intra = tl.where(lower, qk * decay, 0.0)
        o = tl.dot(q * egc[:, None], S, input_precision=PRECISION)
        o += tl.dot(intra, v_new, input_precision=PRECISION)
        tl.store(out_ptr + v_off, o, mask=vmask[None, :])
        if c < full:
            last = tl.sum(tl.where(rows == C - 1, gc, 0.0), axis=0)  # exact: one nonzero term
            k_tail = k * tl.exp(last - gc)[:, None]
            S = S * tl.exp(last) + tl.dot(tl.trans(k_tail), v_new, input_precision=PRECISION)
            if keep != 0:
                tl.store(snap_ptr + ((first + c) * H + h) * DK * DV + st_off, S, mask=st_mask)
    tl.store(s_out_ptr + (s * H + h) * DK * DV + st_off, S, mask=st_mask)


def _assemble(xs, seq_lens, caches, h, dk, dv):
    """Each sequence's pending chunk tokens then its new ones, zero-padded to whole chunks (as the CPU
    kernel lays them out): the padded buffers and per sequence its first chunk, chunk count, full chunks."""
    q, k, v, g, beta = xs
    dev, f = q.device, torch.float32
    pieces: dict[str, list[torch.Tensor]] = {n: [] for n in ("q", "k", "v", "g", "beta")}
    first, count, full = [], [], []
    start = nchunks_total = 0
    for n, cache in zip(seq_lens, caches, strict=True):
        p = cache.pending
        span = p + n
        nchunks = -(-span // CHUNK)
        pad = nchunks * CHUNK - span
        for name, old, new in (
            ("q", torch.zeros(p, h, dk, dtype=f, device=dev), q[start : start + n]),
            ("k", cache.k, k[start : start + n]),
            ("v", cache.v, v[start : start + n]),
            ("g", cache.g, g[start : start + n]),
            ("beta", cache.beta, beta[start : start + n]),
        ):
            pieces[name].append(torch.cat([old, new, new.new_zeros((pad, *new.shape[1:]))]))
        first.append(nchunks_total)
        count.append(nchunks)
        full.append(span // CHUNK)
        nchunks_total += nchunks
        start += n
    bufs = {n: torch.cat(p).contiguous() for n, p in pieces.items()}
    # three tensors, not rows of one: a row's pointer alignment would change the binary with the count
    index = [torch.tensor(x, dtype=torch.int32).to(dev) for x in (first, count, full)]
    return bufs, pieces, (first, count), index, nchunks_total


def _forward(q, k, v, g, beta, seq_lens, caches, scale, keep_caches):
    t, h, dk = q.shape
    dv = v.shape[-1]
    f = torch.float32
    xs = tuple(x.to(f) for x in (q, k, v, g, beta))
    dev = q.device
    channel = g.dim() == 3  # KDA: a log decay per key channel
    caches = [c if c is not None else DeltaRuleCache.empty(h, dk, dv, dev, channel) for c in caches]
    bufs, pieces, (first, count), index, nc = _assemble(xs, seq_lens, caches, h, dk, dv)
    nseq = len(seq_lens)
    out = torch.empty(nc * CHUNK, h, dv, dtype=f, device=dev)
    state0 = torch.stack([c.state for c in caches]).contiguous() if nseq else q.new_zeros(0, h, dk, dv)
    state = torch.empty_like(state0)
    snaps = torch.empty(nc if keep_caches else 1, h, dk, dv, dtype=f, device=dev)
    if nc and channel:
        launch_kda(bufs, state0, index, out, state, snaps, scale, keep_caches)
    elif nc:
        bv = min(BLOCK_V, max(16, triton.next_power_of_2(dv)))
        grid = (nseq, h, triton.cdiv(dv, bv))
        _delta_rule_kernel[grid](
            bufs["q"], bufs["k"], bufs["v"], bufs["g"], bufs["beta"], state0, index[0], index[1], index[2],
            out, state, snaps, h, dk, dv, scale, int(keep_caches),
            C=CHUNK, BK=max(16, triton.next_power_of_2(dk)), BV=bv, num_warps=NUM_WARPS,
        )  # fmt: skip
    rows, base = [], 0
    for n, cache, cnt in zip(seq_lens, caches, count, strict=True):
        rows.append(torch.arange(base + cache.pending, base + cache.pending + n))
        base += cnt * CHUNK
    result = out[torch.cat(rows).to(dev)] if rows else out[:0]
    if not keep_caches:
        return result.to(q.dtype), None
    new_caches = []
    for s, (n, cache) in enumerate(zip(seq_lens, caches, strict=True)):
        span = cache.pending + n
        keep = slice(span - span % CHUNK, span)
        seq = [pieces[name][s][keep] for name in ("k", "v", "g", "beta")]
        done = list(snaps[first[s] : first[s] + span // CHUNK].unbind(0))
        new_caches.append(DeltaRuleCache(state[s], *seq, done))
    return result.to(q.dtype), new_caches


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    seq_lens: Sequence[int],
    caches: Sequence[DeltaRuleCache | None] | None = None,
    scale: float | None = None,
    keep_caches: bool = False,
    keep_rows: bool = False,
) -> tuple[torch.Tensor, list[DeltaRuleCache] | None]:
    """The gated delta rule over packed sequences on the fixed chunk grid; the interface of
    rz_kernels.delta_rule.gated_delta_rule (q, k [T, H, dk], v [T, H, dv], g [T, H] or, KDA's per-channel
    decay, [T, H, dk], beta [T, H]). A decode recomputes its chunk here (no row path: `keep_rows` is
    accepted and ignored, the caches keep no rows)."""
    t, h, dk = q.shape
    if sum(seq_lens) != t:
        raise ValueError(f"seq_lens add up to {sum(seq_lens)} tokens, the inputs have {t}")
    if caches is not None and len(caches) != len(seq_lens):
        raise ValueError(f"{len(caches)} caches for {len(seq_lens)} sequences")
    if tuple(g.shape) not in ((t, h), (t, h, dk)):
        raise ValueError(f"g has shape {tuple(g.shape)}; expected ({t}, {h}) or, a decay per key channel "
                         f"(KDA), ({t}, {h}, {dk})")  # fmt: skip
    lens = list(seq_lens)
    entering = list(caches) if caches is not None else [None] * len(lens)
    scale = dk**-0.5 if scale is None else scale
    inputs = (q, k, v, g, beta)
    if keep_caches or not (torch.is_grad_enabled() and any(x.requires_grad for x in inputs)):
        return _forward(*inputs, lens, entering, scale, keep_caches)

    def fast(*xs):
        return _forward(*xs, lens, entering, scale, False)[0]

    def reference(*xs):
        return torch_gated_delta_rule(*xs, lens, entering, scale=scale)[0]

    return with_reference_backward(fast, reference, inputs), None
