"""The gated delta rule (Gated DeltaNet, Qwen3.5's linear attention) on one chunk grid anchored at each
sequence's start, so every token gets the same bits in a packed training forward, a chunked prefill cut at
any offset, any batch, and one-token decode.

Per head, with the state S [dk, dv] and log-decay g_t <= 0, the recurrence is
    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T,    o_t = S_t^T q_t * scale.
The chunked form (as transformers' `torch_chunk_gated_delta_rule`, and flash-linear-attention) splits a
sequence into chunks of CHUNK tokens: inside a chunk the tokens interact through CHUNK x CHUNK matrices, the
state carries from chunk to chunk. It rounds differently from the recurrence, and, computed per call from
the call's first token (as the reference does), a prefill cut at another offset, or a decode, rounds
differently again. Here the grid is fixed instead: chunk c of a sequence always holds its tokens
[c * CHUNK, (c + 1) * CHUNK), and

- the state entering chunk c is updated only when chunk c is complete (a call that ends inside a chunk
  keeps that chunk's inputs in the `DeltaRuleCache`, and the next call recomputes the chunk from its start);
- every chunk, complete or not, is computed zero-padded to CHUNK rows with the same fixed-shape batched
  GEMMs: a row's result is a sum over the rows before it; the padding rows (and, in a complete chunk, the
  rows after it) enter only through exact zero coefficients (everything is lower triangular), so a token's
  output does not depend on whether the tokens after it exist yet;
- the lower-triangular solve (I - L)^-1 is fixed-shape GEMMs of lower-triangular factors (diagonal blocks
  by doubling, (I - L)^-1 = (I + L)(I + L^2)(I + L^4)... as L is nilpotent, then block forward
  substitution), so it too keeps row i a function of rows <= i alone;
- transcendentals run on the vector path for every element (`aligned_unary`), whatever the tensor size.

All arithmetic is fp32 (inputs of other dtypes are upcast, outputs cast back), as the reference does. That
a batched GEMM gives one matrix the same bits whatever the batch count is a property of the BLAS that the
aligned linear layers rely on too (fp32 `bmm`, see gemm.py); the tests check it for these shapes.
The backward is autograd through the same forward (gradients are not part of the bit-identity contract).

Kimi Delta Attention (KDA) is the same recurrence with a per-channel (diagonal) decay: g_t [H, dk] and
S_t = Diag(exp(g_t)) S_{t-1} + ...; pass g as [T, H, dk] instead of [T, H]. It runs on the same grid and the
same phase-2 walk; only the chunk's decay factors become per channel (`_prepare_channel_decay`: the
CHUNK x CHUNK interactions are elementwise products summed over dk, each entry a function of its own two
rows only, so the row argument above holds unchanged).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from rz_kernels.elementwise import aligned_unary

CHUNK = 64
SOLVE_BLOCK = 16  # rows per diagonal block of the triangular solve (CHUNK is a multiple)


@dataclass
class DeltaRuleCache:
    """One sequence's delta-rule state between calls (fp32).

    `state` [H, dk, dv] is the state entering the sequence's current chunk; `k`, `v`, `g`, `beta`
    ([n, H, dk], [n, H, dv], [n, H] (or [n, H, dk]: a per-channel decay, KDA), [n, H]) are that chunk's
    inputs so far (n < CHUNK tokens), kept so the next call recomputes the chunk from its start on the same
    grid. `completed` (a returned cache's) holds
    the state after each chunk the call completed, in order: the snapshots a paged cache keeps per chunk
    (page), so a prefix of whole chunks can be reused with its state.
    """

    state: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    completed: list[torch.Tensor] = field(default_factory=list)

    @property
    def pending(self) -> int:
        """Tokens of the current, incomplete chunk."""
        return self.k.shape[0]

    @staticmethod
    def empty(
        heads: int, dk: int, dv: int, device: torch.device | str = "cpu", channel_decay: bool = False
    ) -> DeltaRuleCache:
        """The cache of a sequence before its first token (zero state, no pending tokens); with
        `channel_decay` its g holds a decay per key channel (KDA)."""
        f = torch.float32
        return DeltaRuleCache(
            torch.zeros(heads, dk, dv, dtype=f, device=device),
            torch.zeros(0, heads, dk, dtype=f, device=device),
            torch.zeros(0, heads, dv, dtype=f, device=device),
            torch.zeros(0, heads, *((dk,) if channel_decay else ()), dtype=f, device=device),
            torch.zeros(0, heads, dtype=f, device=device),
        )


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (the reference's `l2norm`), per row, in x's dtype."""
    inv = aligned_unary(torch.rsqrt, (x * x).sum(-1, keepdim=True) + eps)
    return x * inv


def _doubling_inverse(low: torch.Tensor) -> torch.Tensor:
    """(I - L)^-1 of strictly lower [N, B, B] matrices as (I + L)(I + L^2)(I + L^4)... (L^B = 0)."""
    b = low.shape[-1]
    inv = low + torch.eye(b, dtype=low.dtype, device=low.device)
    power = low
    for _ in range((b - 1).bit_length() - 1):
        power = torch.bmm(power, power)
        inv = inv + torch.bmm(inv, power)  # inv @ (I + power)
    return inv


def _unit_lower_inverse(low: torch.Tensor) -> torch.Tensor:
    """(I - L)^-1 of strictly lower [N, C, C] matrices, by blocks of SOLVE_BLOCK rows: each diagonal block
    by doubling, then block row i = D_i (L[i, :i] T[:i, :i]) (block forward substitution). Every product
    is a fixed-shape GEMM of lower-triangular factors, so row r of the result depends on rows <= r of L
    only, through exact zeros elsewhere; and it costs a fraction of the doubling over the whole chunk."""
    n, c, _ = low.shape
    bs = SOLVE_BLOCK
    nb = c // bs
    diag = torch.stack([low[:, i * bs : (i + 1) * bs, i * bs : (i + 1) * bs] for i in range(nb)], 1)
    d = _doubling_inverse(diag.reshape(n * nb, bs, bs)).view(n, nb, bs, bs)
    rows = [d[:, 0]]  # block rows of T, each [N, bs, (i + 1) * bs]
    for i in range(1, nb):
        done = torch.cat([F.pad(r, (0, i * bs - r.shape[-1])) for r in rows], 1)  # T[:i*bs, :i*bs]
        left = torch.bmm(d[:, i], torch.bmm(low[:, i * bs : (i + 1) * bs, : i * bs], done))
        rows.append(torch.cat([left, d[:, i]], -1))
    return torch.cat([F.pad(r, (0, c - r.shape[-1])) for r in rows], 1)


def _prepare(q, k, v, g, beta):
    """Everything of a chunk that does not need the incoming state: [N, C, *] -> the phase-2 operands."""
    c = q.shape[1]
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    gc = g.cumsum(-1)  # [N, C]
    diff = (gc.unsqueeze(-1) - gc.unsqueeze(-2)).masked_fill(~lower, 0.0)
    decay = aligned_unary(torch.exp, diff).masked_fill(~lower, 0.0)  # exp(gc_i - gc_j), j <= i
    egc = aligned_unary(torch.exp, gc)
    kb = k * beta.unsqueeze(-1)
    vb = v * beta.unsqueeze(-1)
    strict = lower & ~torch.eye(c, dtype=torch.bool, device=q.device)
    neg = -(torch.bmm(kb, k.transpose(1, 2)) * decay).masked_fill(~strict, 0.0)  # L, strictly lower
    inv = _unit_lower_inverse(neg)  # (I - L)^-1
    u = torch.bmm(inv, vb)  # [N, C, dv]
    w = torch.bmm(inv, kb * egc.unsqueeze(-1))  # [N, C, dk]
    intra = (torch.bmm(q, k.transpose(1, 2)) * decay).masked_fill(~lower, 0.0)
    qg = q * egc.unsqueeze(-1)
    last = gc[:, -1:]
    k_tail = k * aligned_unary(torch.exp, last - gc).unsqueeze(-1)  # k_j exp(gc_last - gc_j)
    return u, w, intra, qg, k_tail, aligned_unary(torch.exp, last).unsqueeze(-1)


CHANNEL_SLICE = 64  # (chunk, head) pairs per slice of the per-channel [C, C, dk] products (bounds memory)


def _channel_pairs(a: torch.Tensor, b: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """sum_d a[n, i, d] b[n, j, d] decay[n, i, j, d] -> [N, C, C]: every entry reduces its own dk products
    in one fixed order (a contiguous last-dim sum), so it depends on rows i and j alone."""
    return (a.unsqueeze(2) * b.unsqueeze(1) * decay).sum(-1)


def _prepare_channel_decay(q, k, v, g, beta):
    """`_prepare` with a per-channel log decay g [N, C, dk] (KDA): the same phase-2 operands, the state's
    decay per key channel. The [N, C, C, dk] decay factors are built CHANNEL_SLICE chunks at a time."""
    n, c, _ = q.shape
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    strict = lower & ~torch.eye(c, dtype=torch.bool, device=q.device)
    gc = g.cumsum(1)  # [N, C, dk]
    kb = k * beta.unsqueeze(-1)
    vb = v * beta.unsqueeze(-1)
    neg_parts, intra_parts = [], []
    for lo in range(0, n, CHANNEL_SLICE):
        s = slice(lo, lo + CHANNEL_SLICE)
        diff = (gc[s].unsqueeze(2) - gc[s].unsqueeze(1)).masked_fill(~lower.unsqueeze(-1), 0.0)
        decay = aligned_unary(torch.exp, diff).masked_fill(~lower.unsqueeze(-1), 0.0)  # exp(gc_i - gc_j)
        neg_parts.append(-_channel_pairs(kb[s], k[s], decay).masked_fill(~strict, 0.0))
        intra_parts.append(_channel_pairs(q[s], k[s], decay).masked_fill(~lower, 0.0))
    inv = _unit_lower_inverse(torch.cat(neg_parts))  # (I - L)^-1
    egc = aligned_unary(torch.exp, gc)
    u = torch.bmm(inv, vb)
    w = torch.bmm(inv, kb * egc)
    qg = q * egc
    last = gc[:, -1:]  # [N, 1, dk]
    k_tail = k * aligned_unary(torch.exp, last - gc)
    return u, w, torch.cat(intra_parts), qg, k_tail, aligned_unary(torch.exp, last).transpose(1, 2)


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
) -> tuple[torch.Tensor, list[DeltaRuleCache] | None]:
    """The gated delta rule over packed sequences on the fixed chunk grid (see the module docstring).

    q, k [T, H, dk] (already l2-normalized if the model wants it), v [T, H, dv], g (log decay) [T, H]
    (Gated DeltaNet) or [T, H, dk] (KDA's per-channel decay), beta [T, H]; the T tokens are `seq_lens[0]`
    tokens of sequence 0, then sequence 1's, and so on. `caches[i]` holds sequence i's earlier tokens
    (None: it starts here). Returns the outputs [T, H, dv] in q's dtype and, with `keep_caches`, each
    sequence's cache after these tokens.
    """
    t, h, dk = q.shape
    dv = v.shape[-1]
    if sum(seq_lens) != t:
        raise ValueError(f"seq_lens add up to {sum(seq_lens)} tokens, the inputs have {t}")
    if caches is not None and len(caches) != len(seq_lens):
        raise ValueError(f"{len(caches)} caches for {len(seq_lens)} sequences")
    scale = dk**-0.5 if scale is None else scale
    out_dtype = q.dtype
    f = torch.float32
    q, k, v, g, beta = (x.to(f) for x in (q, k, v, g, beta))
    q = q * scale
    dev = q.device

    # Each sequence's tokens on its grid: the pending tokens of its current chunk, then the new ones.
    caches = list(caches) if caches is not None else [None] * len(seq_lens)
    channel = g.dim() == 3
    caches = [c if c is not None else DeltaRuleCache.empty(h, dk, dv, dev, channel) for c in caches]
    pieces: dict[str, list[torch.Tensor]] = {"q": [], "k": [], "v": [], "g": [], "beta": []}
    chunk_seq: list[int] = []  # sequence of each chunk
    chunk_pos: list[int] = []  # index of the chunk among its sequence's chunks in this call
    out_rows: list[torch.Tensor] = []  # flat row (chunk * C + offset) of each new token
    start = 0
    for s, (n, cache) in enumerate(zip(seq_lens, caches, strict=True)):
        p = cache.pending
        span = p + n
        nchunks = -(-span // CHUNK) if span else 0
        pad = nchunks * CHUNK - span
        base = len(chunk_seq) * CHUNK
        for name, old, new in (
            ("q", torch.zeros(p, h, dk, dtype=f, device=dev), q[start : start + n]),
            ("k", cache.k, k[start : start + n]),
            ("v", cache.v, v[start : start + n]),
            ("g", cache.g, g[start : start + n]),
            ("beta", cache.beta, beta[start : start + n]),
        ):
            zeros = new.new_zeros((pad, *new.shape[1:]))
            pieces[name].append(torch.cat([old, new, zeros]))
        chunk_seq += [s] * nchunks
        chunk_pos += list(range(nchunks))
        out_rows.append(torch.arange(base + p, base + span, device=dev))
        start += n
    nc = len(chunk_seq)
    if nc == 0:
        return q.new_zeros(0, h, dv).to(out_dtype), caches if keep_caches else None

    def heads_first(x: torch.Tensor) -> torch.Tensor:  # [nc * C, H, ...] -> [nc * H, C, ...]
        x = x.view(nc, CHUNK, h, *x.shape[2:]).transpose(1, 2)
        return x.reshape(nc * h, CHUNK, *x.shape[3:])

    cq, ck, cv = (heads_first(torch.cat(pieces[n])) for n in ("q", "k", "v"))
    cg, cb = (heads_first(torch.cat(pieces[n])) for n in ("g", "beta"))
    prepare = _prepare_channel_decay if channel else _prepare
    u, w, intra, qg, k_tail, decay_last = prepare(cq, ck, cv, cg, cb)

    # Phase 2: walk the chunks in order, all sequences' chunk j together, carrying each sequence's state.
    state = torch.stack([c.state for c in caches])  # [S, H, dk, dv]
    states = list(state.unbind(0))
    completed: list[list[torch.Tensor]] = [[] for _ in caches]
    out = torch.empty(nc, h, CHUNK, dv, dtype=f, device=dev)
    pending_at_end = [(c.pending + n) % CHUNK for c, n in zip(caches, seq_lens, strict=True)]
    full = [
        (j + 1) * CHUNK <= caches[s].pending + seq_lens[s] for s, j in zip(chunk_seq, chunk_pos, strict=True)
    ]
    by_pos: dict[int, list[int]] = {}
    for i, j in enumerate(chunk_pos):
        by_pos.setdefault(j, []).append(i)
    for j in sorted(by_pos):
        idx = by_pos[j]
        sel = torch.tensor(idx, device=dev)
        rows = (sel.unsqueeze(1) * h + torch.arange(h, device=dev)).reshape(-1)  # [n * H]
        st = torch.stack([states[chunk_seq[i]] for i in idx]).reshape(len(idx) * h, dk, dv)
        v_new = u[rows] - torch.bmm(w[rows], st)
        o = torch.bmm(qg[rows], st) + torch.bmm(intra[rows], v_new)
        out[sel] = o.view(len(idx), h, CHUNK, dv)
        done = [a for a, i in enumerate(idx) if full[i]]
        if done:
            di = torch.tensor(done, device=dev)
            r = (di.unsqueeze(1) * h + torch.arange(h, device=dev)).reshape(-1)
            new = st[r] * decay_last[rows[r]] + torch.bmm(k_tail[rows[r]].transpose(1, 2), v_new[r])
            for a, ns in zip(done, new.view(len(done), h, dk, dv).unbind(0), strict=True):
                states[chunk_seq[idx[a]]] = ns
                completed[chunk_seq[idx[a]]].append(ns.detach())

    flat = out.transpose(1, 2).reshape(nc * CHUNK, h, dv)
    result = flat[torch.cat(out_rows)].to(out_dtype)
    if not keep_caches:
        return result, None
    new_caches = []
    for s, (cache, pend) in enumerate(zip(caches, pending_at_end, strict=True)):
        seq_k, seq_v, seq_g, seq_b = (pieces[n][s] for n in ("k", "v", "g", "beta"))
        span = cache.pending + seq_lens[s]
        keep = slice(span - pend, span)
        new_caches.append(
            DeltaRuleCache(
                states[s].detach(),
                seq_k[keep].detach(),
                seq_v[keep].detach(),
                seq_g[keep].detach(),
                seq_b[keep].detach(),
                completed[s],
            )
        )
    return result, new_caches
