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

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from rz_kernels.delta_rule_rows import (
    TOKEN_FIELDS,
    ChunkRows,
    advance,
    append_tokens,
    build_store,
    chunk_parts,
    decode_step,
    hold,
    in_place_store,
    new_store,
    restart_slot,
)
from rz_kernels.elementwise import aligned_unary

log = logging.getLogger(__name__)

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
    rows: ChunkRows | None = None

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


def _doubling_inverse(low: torch.Tensor, powers: list[torch.Tensor] | None = None) -> torch.Tensor:
    """(I - L)^-1 of strictly lower [N, B, B] matrices as (I + L)(I + L^2)(I + L^4)... (L^B = 0); `powers`,
    when given, receives L^2, L^4, ... (the row path continues from them)."""
    b = low.shape[-1]
    inv = low + torch.eye(b, dtype=low.dtype, device=low.device)
    power = low
    for _ in range((b - 1).bit_length() - 1):
        power = torch.bmm(power, power)
        inv = inv + torch.bmm(inv, power)  # inv @ (I + power)
        if powers is not None:
            powers.append(power)
    return inv


def _unit_lower_inverse(low: torch.Tensor, steps: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """(I - L)^-1 of strictly lower [N, C, C] matrices, by blocks of SOLVE_BLOCK rows: each diagonal block
    by doubling, then block row i = D_i (L[i, :i] T[:i, :i]) (block forward substitution). Every product
    is a fixed-shape GEMM of lower-triangular factors, so row r of the result depends on rows <= r of L
    only, through exact zeros elsewhere; and it costs a fraction of the doubling over the whole chunk.
    `steps`, when given, receives the intermediates the row path (delta_rule_rows) continues from:
    "powers" (the diagonal blocks' L^2, L^4, ..., each [N * C / bs, bs, bs]) and "subst" (the block rows
    L[i, :i] T[:i, :i], [N, bs, i * bs] for i = 1, 2, ...)."""
    n, c, _ = low.shape
    bs = SOLVE_BLOCK
    nb = c // bs
    diag = torch.stack([low[:, i * bs : (i + 1) * bs, i * bs : (i + 1) * bs] for i in range(nb)], 1)
    powers: list[torch.Tensor] | None = [] if steps is not None else None
    d = _doubling_inverse(diag.reshape(n * nb, bs, bs), powers).view(n, nb, bs, bs)
    rows = [d[:, 0]]  # block rows of T, each [N, bs, (i + 1) * bs]
    inner = []
    for i in range(1, nb):
        done = torch.cat([F.pad(r, (0, i * bs - r.shape[-1])) for r in rows], 1)  # T[:i*bs, :i*bs]
        subst = torch.bmm(low[:, i * bs : (i + 1) * bs, : i * bs], done)
        left = torch.bmm(d[:, i], subst)
        rows.append(torch.cat([left, d[:, i]], -1))
        inner.append(subst.detach())
    if steps is not None:
        steps["powers"], steps["subst"] = [p.detach() for p in powers], inner
    return torch.cat([F.pad(r, (0, c - r.shape[-1])) for r in rows], 1)


def _prepare(q, k, v, g, beta, steps=None):
    """Everything of a chunk that does not need the incoming state: [N, C, *] -> the phase-2 operands
    (`steps`, when given, also receives L as "low", (I - L)^-1 as "inv" and the solve's intermediates)."""
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
    inv = _unit_lower_inverse(neg, steps)  # (I - L)^-1
    _keep_solve(steps, neg, inv)
    u = torch.bmm(inv, vb)  # [N, C, dv]
    w = torch.bmm(inv, kb * egc.unsqueeze(-1))  # [N, C, dk]
    intra = (torch.bmm(q, k.transpose(1, 2)) * decay).masked_fill(~lower, 0.0)
    qg = q * egc.unsqueeze(-1)
    last = gc[:, -1:]
    k_tail = k * aligned_unary(torch.exp, last - gc).unsqueeze(-1)  # k_j exp(gc_last - gc_j)
    return u, w, intra, qg, k_tail, aligned_unary(torch.exp, last).unsqueeze(-1)


def _keep_solve(steps: dict[str, torch.Tensor] | None, low: torch.Tensor, inv: torch.Tensor) -> None:
    if steps is not None:
        steps["low"], steps["inv"] = low.detach(), inv.detach()


CHANNEL_SLICE = 64  # (chunk, head) pairs per slice of the per-channel [C, C, dk] products (bounds memory)


def _channel_pairs(a: torch.Tensor, b: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """sum_d a[n, i, d] b[n, j, d] decay[n, i, j, d] -> [N, C, C]: every entry reduces its own dk products
    in one fixed order (a contiguous last-dim sum), so it depends on rows i and j alone."""
    return (a.unsqueeze(2) * b.unsqueeze(1) * decay).sum(-1)


def _prepare_channel_decay(q, k, v, g, beta, steps=None):
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
    neg = torch.cat(neg_parts)
    inv = _unit_lower_inverse(neg, steps)  # (I - L)^-1
    _keep_solve(steps, neg, inv)
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
    keep_rows: bool = True,
    row_decode: bool = True,
) -> tuple[torch.Tensor, list[DeltaRuleCache] | None]:
    """The gated delta rule over packed sequences on the fixed chunk grid (see the module docstring).

    q, k [T, H, dk] (already l2-normalized if the model wants it), v [T, H, dv], g (log decay) [T, H]
    (Gated DeltaNet) or [T, H, dk] (KDA's per-channel decay), beta [T, H]; the T tokens are `seq_lens[0]`
    tokens of sequence 0, then sequence 1's, and so on. `caches[i]` holds sequence i's earlier tokens
    (None: it starts here). Returns the outputs [T, H, dv] in q's dtype and, with `keep_caches`, each
    sequence's cache after these tokens.

    A sequence that brings one token and a cache with its chunk's rows (`DeltaRuleCache.rows`: what
    `keep_caches` returns, or none needed at a chunk's first token) is decoded by computing only that
    token's row of the chunk (delta_rule_rows): the same bits as recomputing the chunk, once the row path
    is verified for the shape on this machine (`verify_rows`). `keep_rows=False` returns caches without
    rows after a chunk-path call (a caller that rebuilds its caches each call, as the engine's paged cache
    does, would throw them away); `row_decode=False` recomputes every chunk and keeps no rows (the form
    before the row path).
    """
    mode = "verified" if row_decode else "off"
    return _gated_delta_rule(q, k, v, g, beta, seq_lens, caches, scale, keep_caches, mode, keep_rows)


def _gated_delta_rule(q, k, v, g, beta, seq_lens, caches, scale, keep_caches, mode: str, keep_rows=True):
    """`gated_delta_rule` with the row path's mode: "verified" (in the form `_row_form` verified for the
    shape, if any), one of ROW_FORMS (that form without the check: the check itself, tests) or "off"."""
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
    xs = (q, k, v, g, beta)
    channel = g.dim() == 3
    caches = list(caches) if caches is not None else [None] * len(seq_lens)
    caches = [c if c is not None else DeltaRuleCache.empty(h, dk, dv, q.device, channel) for c in caches]
    by_row = [_row_ready(n, c) for n, c in zip(seq_lens, caches, strict=True)]
    form = mode if mode in ROW_FORMS else None
    rows = mode != "off" and (any(by_row) or (keep_caches and keep_rows))
    if rows and mode == "verified":
        form = _row_form(xs)
        rows = form is not None
    if not rows or (torch.is_grad_enabled() and any(x.requires_grad for x in xs)):
        by_row = [False] * len(seq_lens)  # (decode runs without autograd; a backward goes through chunks)
    if not any(by_row):
        out, new = _chunked(xs, seq_lens, caches, keep_caches, rows and keep_rows)
        return out.to(out_dtype), new
    if all(by_row):  # a decode step: one token per sequence, in order
        out, new = _decoded(xs, caches, keep_caches, form == "truncated")
        return out.to(out_dtype), new
    starts = list(itertools.accumulate(seq_lens, initial=0))
    fast = [s for s, ok in enumerate(by_row) if ok]
    rest = [s for s, ok in enumerate(by_row) if not ok]
    out = q.new_empty(t, h, dv)
    new_caches: list[DeltaRuleCache | None] = [None] * len(seq_lens)
    at = torch.tensor([starts[s] for s in fast], device=q.device)
    part = tuple(x[at] for x in xs)
    out[at], done = _decoded(part, [caches[s] for s in fast], keep_caches, form == "truncated")
    for s, c in zip(fast, done or [], strict=False):
        new_caches[s] = c
    if rest:
        at = torch.cat([torch.arange(starts[s], starts[s] + seq_lens[s]) for s in rest]).to(q.device)
        lens, sub = [seq_lens[s] for s in rest], [caches[s] for s in rest]
        out[at], done = _chunked(tuple(x[at] for x in xs), lens, sub, keep_caches, keep_rows)
        for s, c in zip(rest, done or [], strict=False):
            new_caches[s] = c
    return out.to(out_dtype), new_caches if keep_caches else None


def _row_ready(n: int, cache: DeltaRuleCache) -> bool:
    """Whether a sequence's next `n` tokens can take the row path: one token, and its chunk's rows kept
    for exactly this cache (or none needed: the token starts a chunk)."""
    if n != 1:
        return False
    rows = cache.rows
    if rows is None:
        return cache.pending == 0
    return (
        rows.valid() and rows.count == cache.pending and rows.entering is cache.state and rows.keys is cache.k
    )


def _decoded(xs, caches: list[DeltaRuleCache], keep: bool, truncate: bool):
    """One token per sequence (xs [B, H, *] fp32) by the row path (`truncate`: its "truncated" form):
    outputs [B, H, dv] and, with `keep`, the caches after it. A batch that continues its store writes the
    new rows in place; otherwise (or without `keep`) the rows are first copied into a fresh store."""
    q, k, v, g, beta = xs
    b, h, dk = q.shape
    dv = v.shape[-1]
    counts = [c.pending for c in caches]
    store = in_place_store([c.rows for c in caches]) if keep else None
    if store is None:
        shape = (CHUNK, dk, dv, g.dim() == 3, SOLVE_BLOCK, q.device)
        inputs = [tuple(getattr(c, n) for n in TOKEN_FIELDS) for c in caches]
        store = build_store([c.rows for c in caches], [c.state for c in caches], inputs, shape)
    out = decode_step(*(x.flatten(0, 1) for x in xs), store, counts, truncate).view(b, h, dv)
    if not keep:
        return out, None
    append_tokens(store, counts, xs[1:])
    ended = [s for s, n in enumerate(counts) if n + 1 == CHUNK]
    advanced = None
    if ended:
        done = torch.tensor([n + 1 == CHUNK for n in counts for _ in range(h)], device=q.device)
        advanced = advance(store, done).view(len(ended), h, dk, dv)
    new_caches = []
    for s, (c, count) in enumerate(zip(caches, counts, strict=True)):
        store.frontier[s] = count + 1
        if s in ended:  # the chunk is complete: the state moves on, the slot starts the next chunk
            restart_slot(store, s)
            state = advanced[ended.index(s)]
            new = DeltaRuleCache(state, *store.inputs(s, 0), [state])
            new.rows = ChunkRows(store, s, store.generation[s], 0, state, new.k)
        else:
            new = DeltaRuleCache(c.state, *store.inputs(s, count + 1))
            new.rows = ChunkRows(store, s, store.generation[s], count + 1, c.state, new.k)
            hold(store, s, new)
        new_caches.append(new)
    return out, new_caches


def _chunked(xs, seq_lens, caches: list[DeltaRuleCache], keep_caches: bool, rows: bool):
    """The chunk path: every chunk a call touches, recomputed from its start on the grid (fp32 outputs
    [T, H, dv]); with `keep_caches` and `rows`, the caches keep their incomplete chunk's rows."""
    q, k, v, g, beta = xs
    t, h, dk = q.shape
    dv = v.shape[-1]
    dev = q.device
    plan = _GridPlan.build(seq_lens, [c.pending for c in caches], t)
    nc = len(plan.chunks)
    if nc == 0:
        return q.new_zeros(0, h, dv), caches if keep_caches else None

    def on_grid(x: torch.Tensor, old: list[torch.Tensor] | None, rows: torch.Tensor) -> torch.Tensor:
        src = torch.cat([x, *(old or []), x.new_zeros(1, *x.shape[1:])])
        return src[rows.to(dev)]

    grid = {
        "q": on_grid(q, None, plan.q_index),
        "k": on_grid(k, [c.k for c in caches], plan.index),
        "v": on_grid(v, [c.v for c in caches], plan.index),
        "g": on_grid(g, [c.g for c in caches], plan.index),
        "beta": on_grid(beta, [c.beta for c in caches], plan.index),
    }

    def heads_first(x: torch.Tensor) -> torch.Tensor:  # [nc * C, H, ...] -> [nc * H, C, ...]
        x = x.view(nc, CHUNK, h, *x.shape[2:]).transpose(1, 2)
        return x.reshape(nc * h, CHUNK, *x.shape[3:])

    chunks = {n: heads_first(grid[n]) for n in grid}
    prepare = _prepare_channel_decay if g.dim() == 3 else _prepare
    steps: dict[str, torch.Tensor] | None = {} if keep_caches and rows else None
    operands = prepare(*(chunks[n] for n in ("q", "k", "v", "g", "beta")), steps)
    states = [c.state for c in caches]
    completed: list[list[torch.Tensor]] = [[] for _ in caches]
    v_news: list[torch.Tensor] | None = [] if steps is not None else None
    out = _walk_chunks(plan, operands, states, completed, h, v_news)
    flat = out.view(nc, h, CHUNK, dv).transpose(1, 2).reshape(nc * CHUNK, h, dv)
    result = flat[plan.out_rows.to(dev)]
    if not keep_caches:
        return result, None
    if steps is not None:
        steps.update({n: chunks[n].detach() for n in TOKEN_FIELDS}, v_new=v_news)
    new_caches = []
    for s, keep in enumerate(plan.pending_rows):
        fields = (grid[n][keep].detach() for n in ("k", "v", "g", "beta"))
        new_caches.append(DeltaRuleCache(states[s].detach(), *fields, completed[s]))
    if steps is not None:
        _keep_rows(new_caches, steps, plan.pending_rows, h)
    return result, new_caches


def _keep_rows(caches: list[DeltaRuleCache], steps: dict, pending_rows: list[slice], h: int) -> None:
    """Give each returned cache its chunk's rows for the row path: one store, a slot per sequence in call
    order, from the chunk path's tensors of the sequences' incomplete chunks (zero rows for the others)."""
    c0 = caches[0]
    shape = (CHUNK, c0.k.shape[-1], c0.v.shape[-1], c0.g.dim() == 3, SOLVE_BLOCK, c0.state.device)
    sources = []
    for cache, keep in zip(caches, pending_rows, strict=True):
        slot = keep.start // CHUNK
        pairs = slice(slot * h, (slot + 1) * h)
        sources.append(chunk_parts(steps, pairs, cache.state) if cache.pending else {"state": cache.state})
    store = new_store(h, shape, sources, [tuple(getattr(c, n) for n in TOKEN_FIELDS) for c in caches])
    for s, cache in enumerate(caches):
        cache.rows = ChunkRows(store, s, 0, cache.pending, cache.state, cache.k)


# The row path's forms, in the order the check tries them: "truncated" runs the products over a chunk's rows
# on the rows written so far alone, "full" over all CHUNK rows (see delta_rule_rows.row_product).
ROW_FORMS = ("truncated", "full")
_row_verdicts: dict[tuple, str | None] = {}


def _row_form(xs: tuple[torch.Tensor, ...]) -> str | None:
    """The row path's form that gives the chunk path's bits for this shape (dk, dv, decay kind) at this
    thread count and device, or None: checked once (`verify_rows`), remembered for the process."""
    q, _, v, g, _ = xs
    key = (q.shape[-1], v.shape[-1], g.dim() == 3, torch.get_num_threads(), q.device.type)
    if key not in _row_verdicts:
        form = next((f for f in ROW_FORMS if verify_rows(*key[:3], device=q.device, form=f)), None)
        _row_verdicts[key] = form
        if form is None:
            log.warning("delta rule row path differs from the chunk path for %s: decoding by chunks", key)
    return _row_verdicts[key]


def verify_rows(
    dk: int, dv: int, channel: bool, device: torch.device | str = "cpu", form: str = ROW_FORMS[0]
) -> bool:
    """Run the row path (in `form`) against the chunk path on random inputs, bit for bit: one sequence
    decoded token by token through a whole chunk (every offset and solve block; the products over 1..CHUNK
    rows), then beside a second one whose rows a 23-token prefill kept (copied into a new store; two
    offsets, so two solve blocks, in each step) until that one completes its chunk too."""
    h, cut = 2, 23
    steps_a = 2 * CHUNK - cut  # a: all of chunk 0, then chunk 1 beside b until b's chunk 0 ends
    gen = torch.Generator().manual_seed(0)

    def draw(n: int):
        q = l2_normalize(torch.randn(n, h, dk, generator=gen))
        k = l2_normalize(torch.randn(n, h, dk, generator=gen))
        v = torch.randn(n, h, dv, generator=gen)
        g = -0.3 * torch.rand(n, h, *((dk,) if channel else ()), generator=gen)
        return tuple(x.to(device) for x in (q, k, v, g, torch.rand(n, h, generator=gen)))

    a, b = draw(steps_a), draw(CHUNK)
    refs = [_gated_delta_rule(*x, [len(x[0])], None, None, False, "off")[0] for x in (a, b)]
    _, (cache_b,) = _gated_delta_rule(*(x[:cut] for x in b), [cut], None, None, True, form)
    cache_a = None
    for i in range(steps_a):
        j = cut + i - CHUNK  # b's token beside a's (from a's second chunk on)
        both = i >= CHUNK
        xs = [
            torch.cat([x[i : i + 1], y[j : j + 1]]) if both else x[i : i + 1]
            for x, y in zip(a, b, strict=True)
        ]
        out, new = _gated_delta_rule(*xs, [1] * (1 + both), [cache_a, cache_b][: 1 + both], None, True, form)
        if not torch.equal(out[0], refs[0][i]) or (both and not torch.equal(out[1], refs[1][j])):
            return False
        cache_a, cache_b = new[0], new[-1] if both else cache_b
    return True


@dataclass
class _GridPlan:
    """Where each sequence's tokens sit on the chunk grid of one call.

    Chunks are ordered by their index within their sequence (all sequences' chunk 0, then chunk 1, ...),
    complete chunks before an incomplete one, so the chunks phase 2 handles together, and among them those
    whose state it carries on, are contiguous: slices and splits, whose backward is a concatenation,
    instead of index selections that each write a full-size gradient. `index` maps each grid row to a row
    of [new tokens; the caches' pending tokens; a zero row] (k, v, g, beta), `q_index` to a row of
    [new tokens; a zero row] (the pending tokens' queries are zeros: their outputs are not asked for).
    """

    chunks: list[tuple[int, bool, int]]  # (index within its sequence, incomplete, sequence), grid order
    index: torch.Tensor
    q_index: torch.Tensor
    out_rows: torch.Tensor  # flat grid row (chunk * C + offset) of each new token, in input order
    pending_rows: list[slice]  # per sequence: the grid rows of its tokens in its incomplete last chunk

    @staticmethod
    def build(seq_lens: Sequence[int], pendings: Sequence[int], t: int) -> _GridPlan:
        zero_row = t + sum(pendings)
        chunks, spans, rows, q_rows = [], [], [], []
        start, cached = 0, t
        for s, (n, p) in enumerate(zip(seq_lens, pendings, strict=True)):
            span = p + n
            nchunks = -(-span // CHUNK) if span else 0
            pad = nchunks * CHUNK - span
            new_rows = torch.arange(start, start + n)
            rows.append(torch.cat([torch.arange(cached, cached + p), new_rows, torch.full((pad,), zero_row)]))
            q_rows.append(torch.cat([torch.full((p,), t), new_rows, torch.full((pad,), t)]))
            chunks += [(j, (j + 1) * CHUNK > span, s) for j in range(nchunks)]
            spans.append((p, span))
            start += n
            cached += p
        chunks.sort()
        slot = {(s, j): i for i, (j, _, s) in enumerate(chunks)}
        order = [(s, j) for j, _, s in chunks]
        index = torch.cat([rows[s][j * CHUNK : (j + 1) * CHUNK] for s, j in order] or [torch.zeros(0)])
        q_index = torch.cat([q_rows[s][j * CHUNK : (j + 1) * CHUNK] for s, j in order] or [torch.zeros(0)])
        out_rows, pending_rows = [], []
        for s, (p, span) in enumerate(spans):
            for j in range(p // CHUNK, -(-span // CHUNK)):
                lo, hi = max(p - j * CHUNK, 0), min(span - j * CHUNK, CHUNK)
                out_rows.append(torch.arange(slot[s, j] * CHUNK + lo, slot[s, j] * CHUNK + hi))
            last = slot.get((s, span // CHUNK))  # the incomplete chunk the sequence ends in, if any
            at = 0 if last is None else last * CHUNK
            pending_rows.append(slice(at, at + span % CHUNK))
        return _GridPlan(
            chunks, index.long(), q_index.long(), torch.cat(out_rows or [torch.zeros(0)]).long(), pending_rows
        )


def _walk_chunks(
    plan: _GridPlan,
    operands: tuple[torch.Tensor, ...],
    states: list[torch.Tensor],
    completed: list[list[torch.Tensor]],
    h: int,
    v_news: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Phase 2: walk the chunks in order, all sequences' chunk j together, carrying each sequence's state
    (``states`` [H, dk, dv] per sequence, replaced in place; each completed chunk's state appended to its
    sequence's ``completed``; `v_news`, when given, receives each group's v'). Returns the outputs
    [nc * H, C, dv] in grid order."""
    by_pos: dict[int, list[tuple[bool, int]]] = {}
    for j, incomplete, s in plan.chunks:
        by_pos.setdefault(j, []).append((incomplete, s))
    sizes = [len(by_pos[j]) * h for j in sorted(by_pos)]
    u, w, intra, qg, k_tail, decay_last = (x.split(sizes) for x in operands)
    outs = []
    for gi, j in enumerate(sorted(by_pos)):
        group = by_pos[j]
        st = torch.stack([states[s] for _, s in group])
        st = st.reshape(len(group) * h, *st.shape[2:])
        v_new = u[gi] - torch.bmm(w[gi], st)
        if v_news is not None:
            v_news.append(v_new.detach())
        outs.append(torch.bmm(qg[gi], st) + torch.bmm(intra[gi], v_new))
        done = sum(not incomplete for incomplete, _ in group) * h  # complete chunks come first
        if done:
            kt = k_tail[gi][:done].transpose(1, 2)
            new = st[:done] * decay_last[gi][:done] + torch.bmm(kt, v_new[:done])
            for (_, s), ns in zip(group, new.view(done // h, h, *new.shape[1:]).unbind(0), strict=False):
                states[s] = ns
                completed[s].append(ns.detach())
    return torch.cat(outs)
