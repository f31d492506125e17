"""One-token decode on the delta rule's chunk grid that computes only the new token's row of its chunk.

rz_kernels.delta_rule computes a chunk as CHUNK x CHUNK lower-triangular arithmetic: row i of every matrix
(the decay factors, L = -strict(beta k k^T * decay), its inverse T by doubling on SOLVE_BLOCK diagonal blocks
and block substitution, u = T (beta v), w = T (beta k exp(gc)), v' = u - w S, the output
(q exp(gc)) S + (q k^T * decay) v') is a function of rows <= i, the rows after it entering through exact
zero coefficients. So a token at offset r of its chunk needs only row r of each, given the rows < r its
chunk's earlier tokens computed. `RowStore` keeps those rows for a batch of sequences, and `decode_step`
computes row r with the same operations in the same order as the chunk:

- elementwise products, sums and masks are correctly rounded whatever the tensor's size, transcendentals go
  through `aligned_unary` (the vector path for every element); the cumulative log decay continues the
  chunk's cumsum (a sequential sum in float64, rounded to fp32 at each row) from its running float64 sum;
- each matrix product keeps the chunk's K, N and operand layouts (transposed views where the chunk has
  them) and runs on a small tile of rows, the token's rows first and zeros after (`row_product`), instead of
  the chunk's CHUNK (or SOLVE_BLOCK) rows. That BLAS computes a row the same way at any row count from a few
  rows up is empirical (MKL here: from 4 rows; its 1-3 row paths sum in another order), as is the cumsum's
  float64 running sum, so rz_kernels.delta_rule verifies this module against the chunk path, bit for bit at
  every offset, before it decodes a shape this way (`verify_rows` there), and otherwise recomputes the chunk;
- KDA's per-channel pair terms are sums over the key channels of elementwise products (no GEMM), reduced
  over the same contiguous last dim.

When a token completes its chunk the state advances exactly as the chunk path advances it (the same full
products over the chunk's rows), and the sequence's next token starts a new chunk in the same slot.

A step writes the new rows in place, so a batch that decodes step after step copies nothing: a slot is
written only at its frontier (the row count of the newest cache that continues it) and a slot starting a
new chunk bumps its generation, so every earlier `ChunkRows` keeps seeing exactly its own rows or knows it
expired. A cache continued twice (two branches), a batch whose members changed, or rows from another
store are first copied into a fresh store (`build_store`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rz_kernels.elementwise import aligned_unary

TILE_ROWS = 4  # rows of the smallest product tile (MKL's 1-3 row GEMMs round differently)
# torch's CPU bmm runs a product of fewer multiply-adds (rows x K x N) than this in its own loop, not BLAS:
# a tile is grown (doubling) until it reaches BLAS wherever the chunk's product does.
SMALL_BMM = 400
TOKEN_FIELDS = ("k", "v", "g", "beta")


@dataclass
class RowStore:
    """The current chunk's rows of a batch of sequences (slots), head-major, [slots x H, C, ...] fp32.

    `t`: k [., C, dk]; gc [., C] (or [., C, dk], KDA), the cumulative log decay, and acc (same shape,
    float64) its running float64 sum; vb = v beta and v_new (v') [., C, dv]; kbg = k beta exp(gc)
    [., C, dk]; low (L), inv (T = (I - L)^-1) and subst [., C, C] (row r of solve block i >= 1:
    L[r, :i bs] T[:i bs, :i bs]); powers [., C, levels, bs] (row r's rows of L_i^(2^l), l = 1..levels, of
    its diagonal block i); state [., dk, dv], the state entering the chunk. Rows at and after a slot's
    frontier are zeros.
    """

    heads: int
    t: dict[str, torch.Tensor]
    frontier: list[int]
    generation: list[int]

    def pairs(self, slot: int) -> slice:
        return slice(slot * self.heads, (slot + 1) * self.heads)


@dataclass
class ChunkRows:
    """One sequence's view of its chunk's rows: `count` rows of `slot` in `store`, valid while the slot's
    generation is `generation`; `tokens` ([C, H, *] k, v, g, beta, the cache's fields are their first
    `count` rows; None: not made yet) with `token_frontier` (a one-element list shared by the caches that
    view the same buffers). `entering` and `keys` are the state and k tensors of the cache the rows belong
    to (a cache whose state or inputs were replaced does not use them)."""

    store: RowStore
    slot: int
    generation: int
    count: int
    entering: torch.Tensor
    keys: torch.Tensor
    tokens: dict[str, torch.Tensor] | None = None
    token_frontier: list[int] | None = None

    def valid(self) -> bool:
        return self.store.generation[self.slot] == self.generation

    def owns_slot(self) -> bool:
        """Whether a step may write this sequence's next row in place (no other cache continued it)."""
        return self.valid() and self.store.frontier[self.slot] == self.count


def new_store(heads: int, shape: tuple, sources: list[dict[str, torch.Tensor]], counts: list[int]):
    """A store with a slot per source, in order: each slot's tensors copied from its source ([H, C, ...] per
    name, `RowStore.t`'s names; a name it lacks: zero rows; "state" required), its rows from `counts[s]` on
    zeroed. `shape`: (C, dk, dv, per-channel decay, solve block, device)."""
    slots = len(sources)
    t = empty_parts(slots * heads, *shape)
    for s, src in enumerate(sources):
        pairs = slice(s * heads, (s + 1) * heads)
        for name, x in t.items():
            if name in src:
                x[pairs] = src[name]
                if name != "state":
                    x[pairs, counts[s] :] = 0.0
    return RowStore(heads, t, list(counts), [0] * slots)


def empty_parts(
    n: int, c: int, dk: int, dv: int, channel: bool, block: int, device
) -> dict[str, torch.Tensor]:
    """Zero rows for `n` pairs (the row path's tensors, `RowStore.t`'s names, state included)."""
    f = torch.float32
    z = lambda *s, dtype=f: torch.zeros(n, *s, dtype=dtype, device=device)  # noqa: E731
    decay = (dk,) if channel else ()
    levels = (block - 1).bit_length() - 1
    return {
        "k": z(c, dk), "gc": z(c, *decay), "acc": z(c, *decay, dtype=torch.float64), "vb": z(c, dv),
        "kbg": z(c, dk), "low": z(c, c), "inv": z(c, c), "subst": z(c, c), "powers": z(c, levels, block),
        "v_new": z(c, dv), "state": z(dk, dv),
    }  # fmt: skip


def build_store(rows: list[ChunkRows | None], states: list[torch.Tensor], counts: list[int], shape):
    """A fresh store for a step's sequences, in order: each one's valid rows copied (None: it starts a
    chunk, zero rows), its entering state `states[s]`. `shape` as `new_store`'s."""
    heads = states[0].shape[0]
    sources = []
    for r, state in zip(rows, states, strict=True):
        src = {} if r is None else {n: x[r.store.pairs(r.slot)] for n, x in r.store.t.items()}
        sources.append({**src, "state": state})
    return new_store(heads, shape, sources, counts)


def in_place_store(rows: list[ChunkRows | None]) -> RowStore | None:
    """The store a step can continue in place: every sequence's rows in one store, in slot order, filling
    it, each owning its slot; else None."""
    if any(r is None for r in rows):
        return None
    store = rows[0].store
    if len(store.frontier) != len(rows):
        return None
    for s, r in enumerate(rows):
        if r.store is not store or r.slot != s or not r.owns_slot():
            return None
    return store


def row_product(rows: torch.Tensor, rhs: torch.Tensor, full: int) -> torch.Tensor:
    """rows [N, m, K] @ rhs [N, K, M] -> [N, m, M], each row computed as a row of the chunk's [N, full, K] x
    rhs product computes it: the rows lead a zero-padded tile of TILE_ROWS (or more) rows, so BLAS runs the
    kernel it runs for the chunk's product (see the module docstring)."""
    n, m, k = rows.shape
    cols = rhs.shape[-1]
    tile = TILE_ROWS
    while tile < m:
        tile *= 2
    if full * k * cols >= SMALL_BMM:
        while tile * k * cols < SMALL_BMM and tile < full:
            tile *= 2
    padded = rows.new_zeros(n, tile, k)
    padded[:, :m] = rows
    return torch.bmm(padded, rhs)[:, :m]


def _pair_terms(t: dict, q, kb, decay, lower, strict, channel: bool):
    """Row r of L (strictly lower) and of the intra-chunk q k^T * decay (lower), each [N, C], as the chunk's
    `_prepare` (a product with k^T times the decay) or `_prepare_channel_decay` (a sum over channels)."""
    c = t["k"].shape[1]
    both = torch.stack([kb, q], 1)  # [N, 2, dk]: one pass over k for both
    if channel:  # (a_r * k_j) * decay_rj summed over the last dim, as `_channel_pairs`
        pairs = (both.unsqueeze(2) * t["k"].unsqueeze(1) * decay.unsqueeze(1)).sum(-1)
    else:
        pairs = row_product(both, t["k"].transpose(1, 2), c) * decay.unsqueeze(1)
    neg = -pairs[:, 0].masked_fill(~strict, 0.0)
    intra = pairs[:, 1].masked_fill(~lower, 0.0)
    return neg, intra


def _solve_row(t: dict, at: torch.Tensor, r: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """Row r of T = (I - L)^-1 as `_unit_lower_inverse` computes it (doubling inside the row's diagonal
    block, then block substitution from the rows of the blocks before it); writes the row's powers, its
    substitution product and its T row into `t`. Returns the T rows [N, C]."""
    powers = t["powers"]
    levels, bs = powers.shape[2], powers.shape[3]
    blk = torch.div(r, bs, rounding_mode="floor")
    idx = blk[:, None] * bs + torch.arange(bs, device=r.device)  # [N, bs]: the block's rows (and columns)
    row = neg.gather(1, idx)  # the row's part of its diagonal block of L
    block = t["low"][at[:, None], idx].gather(2, idx[:, None, :].expand(-1, bs, -1))
    eye = torch.eye(bs, dtype=neg.dtype, device=neg.device)[r - blk * bs]
    inv, power, prev = row + eye, row, block  # as `_doubling_inverse`: inv = L + I, power = L
    for level in range(levels):
        power = row_product(power.unsqueeze(1), prev, bs)[:, 0]  # row of power @ power
        powers[at, r, level] = power
        prev = powers[at[:, None], idx, level]
        inv = inv + row_product(inv.unsqueeze(1), prev, bs)[:, 0]  # row of inv @ (I + power)
    out = neg.new_zeros(neg.shape)
    out.scatter_(1, idx, inv)
    for b in sorted(set(blk.tolist()) - {0}):  # block substitution, per block index (its product shapes)
        sel = (blk == b).nonzero().flatten()
        w = b * bs
        done = t["inv"][sel, :w, :w].contiguous()  # T[:w, :w], the blocks before
        t["subst"][sel, r[sel], :w] = row_product(neg[sel, None, :w], done, bs)[:, 0]
        below = t["subst"][sel, w : w + bs, :w].contiguous()  # the block's substitution rows so far
        out[sel, :w] = row_product(inv[sel, None], below, bs)[:, 0]
    t["inv"][at, r] = out
    return out


def decode_step(q, k, v, g, beta, store: RowStore, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per pair (N = slots x heads, the store's order): q, k [N, dk], v [N, dv], g [N] (or [N, dk],
    KDA), beta [N] (fp32, q already scaled) at chunk offsets r [N]; writes row r into the store. Returns the
    outputs [N, dv] and which pairs completed their chunk (bool [N]); for those, the store's state has
    advanced past the chunk (`advance`) and their rows are still the completed chunk's."""
    t = store.t
    n, c = t["k"].shape[:2]
    channel = g.dim() == 2
    at = torch.arange(n, device=q.device)
    t["k"][at, r] = k
    # the chunk's cumsum: a float64 running sum, each row rounded to fp32
    acc = t["acc"][at, (r - 1).clamp(min=0)].masked_fill((r == 0).view(-1, *([1] * (g.dim() - 1))), 0.0)
    acc = acc + g.double()
    t["acc"][at, r] = acc
    gr = acc.float()
    t["gc"][at, r] = gr
    cols = torch.arange(c, device=q.device)
    lower, strict = cols <= r[:, None], cols < r[:, None]
    mask = lower.unsqueeze(-1) if channel else lower
    diff = (gr.unsqueeze(1) - t["gc"]).masked_fill(~mask, 0.0)  # gc_r - gc_j, j <= r
    decay = aligned_unary(torch.exp, diff).masked_fill(~mask, 0.0)
    egc = aligned_unary(torch.exp, gr)
    egc = egc if channel else egc.unsqueeze(-1)
    kb = k * beta.unsqueeze(-1)
    t["vb"][at, r] = v * beta.unsqueeze(-1)
    t["kbg"][at, r] = kb * egc
    neg, intra = _pair_terms(t, q, kb, decay, lower, strict, channel)
    t["low"][at, r] = neg
    t_row = _solve_row(t, at, r, neg)
    u = row_product(t_row.unsqueeze(1), t["vb"], c)[:, 0]
    w = row_product(t_row.unsqueeze(1), t["kbg"], c)[:, 0]
    by_state = row_product(torch.stack([w, q * egc], 1), t["state"], c)  # w S and (q exp(gc)) S, one pass
    v_new = u - by_state[:, 0]
    t["v_new"][at, r] = v_new
    out = by_state[:, 1] + row_product(intra.unsqueeze(1), t["v_new"], c)[:, 0]
    return out, r == c - 1


def advance(store: RowStore, done: torch.Tensor) -> torch.Tensor:
    """The states after the completed chunks of the pairs in `done` (bool [N]), as the chunk path's phase 2
    computes them; written into the store's state, and returned [n, dk, dv]."""
    t = store.t
    channel = t["gc"].dim() == 3
    gc = t["gc"][done]
    last = gc[:, -1:]
    tail = aligned_unary(torch.exp, last - gc)
    k_tail = t["k"][done] * (tail if channel else tail.unsqueeze(-1))
    decay_last = aligned_unary(torch.exp, last)
    decay_last = decay_last.transpose(1, 2) if channel else decay_last.unsqueeze(-1)
    new = t["state"][done] * decay_last + torch.bmm(k_tail.transpose(1, 2), t["v_new"][done])
    t["state"][done] = new
    return new


def restart_slot(store: RowStore, slot: int) -> None:
    """Empty a slot whose chunk completed, for the sequence's next chunk (earlier views of it expire)."""
    pairs = store.pairs(slot)
    for name, x in store.t.items():
        if name != "state":
            x[pairs] = 0.0
    store.frontier[slot] = 0
    store.generation[slot] += 1


def chunk_parts(steps: dict, pairs: slice, state: torch.Tensor) -> dict[str, torch.Tensor]:
    """A sequence's row tensors (`RowStore.t`'s names) from the chunk path's tensors of its incomplete chunk,
    whose pairs (chunk x head, in grid order) are `pairs`, and the state entering it [H, dk, dv]. `steps`:
    k, v, g, beta, low, inv [n, C, ...]; v_new (a list of [., C, dv] in grid order); powers (per level,
    [n * C / bs, bs, bs]) and subst (per solve block i >= 1, [n, bs, i * bs]) as `_unit_lower_inverse`
    keeps them. gc, acc, vb and kbg are recomputed as the chunk computes them; rows after the chunk's
    tokens are not zeroed here."""
    k, v, g, beta = (steps[n][pairs] for n in TOKEN_FIELDS)
    h, c = k.shape[:2]
    gc = g.cumsum(1)
    egc = aligned_unary(torch.exp, gc)
    kb = k * beta.unsqueeze(-1)
    parts = {n: steps[n][pairs] for n in ("low", "inv")}
    parts["v_new"] = _grid_slice(steps["v_new"], pairs)
    bs = steps["powers"][0].shape[-1]
    parts["powers"] = torch.stack([p.view(-1, c, bs)[pairs] for p in steps["powers"]], 2)
    subst = k.new_zeros(h, c, c)
    for i, part in enumerate(steps["subst"], start=1):
        subst[:, i * bs : (i + 1) * bs, : i * bs] = part[pairs]
    kbg = kb * (egc if g.dim() == 3 else egc.unsqueeze(-1))
    parts.update(k=k, gc=gc, acc=g.double().cumsum(1), vb=v * beta.unsqueeze(-1), kbg=kbg, subst=subst)
    parts["state"] = state
    return parts


def _grid_slice(parts: list[torch.Tensor], pairs: slice) -> torch.Tensor:
    """Rows `pairs` of the concatenation of `parts` (without concatenating them)."""
    start = 0
    for part in parts:
        n = part.shape[0]
        if start <= pairs.start and pairs.stop <= start + n:
            return part[pairs.start - start : pairs.stop - start]
        start += n
    raise ValueError(f"pairs {pairs} cross the parts' boundaries")
