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

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

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

    `tokens`: the chunk's inputs token-major per slot, k, v, g, beta [slots, C, H, ...]: the caches' own
    k, v, g, beta are views of them (their first `count` rows). `holders[slot]`: the caches holding such
    views; when the slot starts a new chunk (`restart_slot`) those still alive get copies instead.
    """

    heads: int
    t: dict[str, torch.Tensor]
    tokens: dict[str, torch.Tensor]
    frontier: list[int]
    generation: list[int]
    holders: list[list[weakref.ref]]

    def pairs(self, slot: int) -> slice:
        return slice(slot * self.heads, (slot + 1) * self.heads)

    def inputs(self, slot: int, count: int) -> tuple[torch.Tensor, ...]:
        """A slot's first `count` tokens' k, v, g, beta ([count, H, ...] views)."""
        return tuple(self.tokens[n][slot, :count] for n in TOKEN_FIELDS)


@dataclass
class ChunkRows:
    """One sequence's view of its chunk's rows: `count` rows of `slot` in `store`, valid while the slot's
    generation is `generation`. `entering` and `keys` are the state and k tensors of the cache the rows
    belong to (a cache whose state or inputs were replaced does not use them)."""

    store: RowStore
    slot: int
    generation: int
    count: int
    entering: torch.Tensor
    keys: torch.Tensor

    def valid(self) -> bool:
        return self.store.generation[self.slot] == self.generation

    def owns_slot(self) -> bool:
        """Whether a step may write this sequence's next row in place (no other cache continued it)."""
        return self.valid() and self.store.frontier[self.slot] == self.count


def new_store(heads: int, shape: tuple, sources: list[dict[str, torch.Tensor]], inputs: list[tuple]):
    """A store with a slot per source, in order: each slot's tensors copied from its source ([H, C, ...] per
    name, `RowStore.t`'s names; a name it lacks: zero rows; "state" required) and its tokens from `inputs`
    (k, v, g, beta [count, H, ...]), its rows from `count` on zeroed. `shape`: (C, dk, dv, per-channel
    decay, solve block, device)."""
    slots = len(sources)
    c, dk, dv, channel, _, device = shape
    t = empty_parts(slots * heads, *shape)
    widths = ((dk,), (dv,), (dk,) if channel else (), ())
    tokens = {
        n: torch.zeros(slots, c, heads, *w, device=device) for n, w in zip(TOKEN_FIELDS, widths, strict=True)
    }
    counts = [len(x[0]) for x in inputs]
    for s, src in enumerate(sources):
        pairs = slice(s * heads, (s + 1) * heads)
        for name, x in t.items():
            if name in src:
                x[pairs] = src[name]
                if name != "state":
                    x[pairs, counts[s] :] = 0.0
        for name, x in zip(TOKEN_FIELDS, inputs[s], strict=True):
            tokens[name][s, : counts[s]] = x
    return RowStore(heads, t, tokens, counts, [0] * slots, [[] for _ in range(slots)])


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


def build_store(rows: list[ChunkRows | None], states: list[torch.Tensor], inputs: list[tuple], shape):
    """A fresh store for a step's sequences, in order: each one's valid rows copied (None: it starts a
    chunk, zero rows), its entering state `states[s]` and chunk inputs `inputs[s]`. `shape` as
    `new_store`'s."""
    heads = states[0].shape[0]
    sources = []
    for r, state in zip(rows, states, strict=True):
        src = {} if r is None else {n: x[r.store.pairs(r.slot)] for n, x in r.store.t.items()}
        sources.append({**src, "state": state})
    return new_store(heads, shape, sources, inputs)


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


_zero_tiles: dict[tuple, torch.Tensor] = {}


def row_product(rows: torch.Tensor, rhs: torch.Tensor, full: int, used: int | None = None) -> torch.Tensor:
    """rows [N, m, K] (or [N, K]: one row) @ rhs [N, K, M] -> [N, m, M] (or [N, M]), each row computed as a
    row of the chunk's [N, full, K] x rhs product computes it: the rows lead a zero-padded tile of TILE_ROWS
    (or more) rows, so BLAS runs the kernel it runs for the chunk's product (see the module docstring).

    `used`: every row is zero after its first `used` entries (a row of the chunk's lower-triangular
    factors), so where the product may run over those alone it does: a BLAS that sums K in order adds only
    exact zero terms after them (empirical too: the check verifies it, `decode_step`'s `truncate`)."""
    one = rows.dim() == 2
    if one:
        rows = rows.unsqueeze(1)
    n, m, k = rows.shape
    cols = rhs.shape[-1]
    blas = full * k * cols >= SMALL_BMM  # the chunk's product runs on BLAS (else torch's own loop)
    if used is not None and used < k and (not blas or full * used * cols >= SMALL_BMM):
        rows, rhs, k = rows[..., :used], rhs[:, :used], used
    tile = TILE_ROWS
    while tile < m:
        tile *= 2
    while blas and tile * k * cols < SMALL_BMM and tile < full:
        tile *= 2
    key = (tile - m, k, rows.dtype, rows.device)
    zeros = _zero_tiles.get(key)
    if zeros is None or zeros.shape[0] < n:
        zeros = _zero_tiles[key] = rows.new_zeros(n, tile - m, k)
    out = torch.bmm(torch.cat([rows, zeros[:n]], 1), rhs)
    return out[:, 0] if one else out[:, :m]


class _Rows:
    """Row r of each pair's chunk in the store's [N, C, ...] tensors: flat indices (one op a write) and the
    pairs' current solve blocks (slices when they share one, the common lock-step batch; else gathers)."""

    def __init__(self, store: RowStore, counts: list[int], block: int) -> None:
        self.t = store.t
        self.n, self.c = self.t["k"].shape[:2]
        self.bs = block
        self.r_host = [r for r in counts for _ in range(store.heads)]
        device = self.t["k"].device
        self.r = torch.tensor(self.r_host, device=device)
        self.flat = torch.arange(self.n, device=device) * self.c + self.r
        blocks = {r // block for r in counts}
        self.one_block = blocks.pop() if len(blocks) == 1 else None
        if self.one_block is None:
            self.blk = torch.div(self.r, block, rounding_mode="floor")
            start = self.flat - self.r + self.blk * block
            self.block_rows = (start[:, None] + torch.arange(block, device=device)).flatten()

    def put(self, name: str, x: torch.Tensor) -> None:
        t = self.t[name]
        t.view(self.n * self.c, *t.shape[2:]).index_copy_(0, self.flat, x)

    def block_rows_of(self, t: torch.Tensor) -> torch.Tensor:
        """Each pair's rows of its current solve block of t [N, C, ...] -> [N, bs, ...] (contiguous)."""
        if self.one_block is not None:
            lo = self.one_block * self.bs
            return t[:, lo : lo + self.bs].contiguous()
        flat = t.view(self.n * self.c, *t.shape[2:]).index_select(0, self.block_rows)
        return flat.view(self.n, self.bs, *t.shape[2:])

    def block_cols_of(self, x: torch.Tensor) -> torch.Tensor:
        """Each pair's columns of its current solve block of x [N, ..., C] -> [N, ..., bs] (contiguous)."""
        if self.one_block is not None:
            lo = self.one_block * self.bs
            return x[..., lo : lo + self.bs].contiguous()
        x = x.reshape(*x.shape[:-1], self.c // self.bs, self.bs)
        at = self.blk.view(-1, *([1] * (x.dim() - 1))).expand(*x.shape[:-2], 1, self.bs)
        return x.gather(-2, at).squeeze(-2)

    def spread(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, bs] placed at each pair's current solve block's columns of a zero [N, C]."""
        if self.one_block is not None:
            lo = self.one_block * self.bs
            return F.pad(x, (lo, self.c - lo - self.bs))
        out = x.new_zeros(self.n, self.c // self.bs, self.bs)
        out.scatter_(1, self.blk.view(-1, 1, 1).expand(-1, 1, self.bs), x.unsqueeze(1))
        return out.view(self.n, self.c)


def _pair_terms(rows: _Rows, q, kb, decay, not_lower, not_strict, channel: bool):
    """Row r of L (strictly lower) and of the intra-chunk q k^T * decay (lower), each [N, C] (zero from
    column `used` on), as the chunk's `_prepare` (a product with k^T times the decay) or
    `_prepare_channel_decay` (a sum over channels); `decay` [N, used(, dk)] holds the row's first columns."""
    keys, used = rows.t["k"], decay.shape[1]
    both = torch.stack([kb, q], 1)  # [N, 2, dk]: one pass over k for both
    if channel:  # (a_r * k_j) * decay_rj summed over the last dim, as `_channel_pairs`
        pairs = (both.unsqueeze(2) * keys[:, :used].unsqueeze(1)).mul_(decay.unsqueeze(1)).sum(-1)
    else:  # (the product keeps all C columns: BLAS computes narrower outputs another way)
        pairs = row_product(both, keys.transpose(1, 2), rows.c)[..., :used] * decay.unsqueeze(1)
    if used < rows.c:
        pairs = F.pad(pairs, (0, rows.c - used))
    neg = -pairs[:, 0].masked_fill(not_strict, 0.0)
    intra = pairs[:, 1].masked_fill(not_lower, 0.0)
    return neg, intra


_eyes: dict[tuple, torch.Tensor] = {}


def _solve_row(rows: _Rows, neg: torch.Tensor) -> torch.Tensor:
    """Row r of T = (I - L)^-1 as `_unit_lower_inverse` computes it (doubling inside the row's diagonal
    block, then block substitution from the rows of the blocks before it); writes the row's powers, its
    substitution product and its T row into the store. Returns the T rows [N, C]."""
    t, n, c, bs = rows.t, rows.n, rows.c, rows.bs
    levels = t["powers"].shape[2]
    key = (bs, neg.device)
    if key not in _eyes:
        _eyes[key] = torch.eye(bs, dtype=neg.dtype, device=neg.device)
    row = rows.block_cols_of(neg)  # the row's part of its diagonal block of L
    inv = row + _eyes[key][rows.r % bs]  # as `_doubling_inverse`: inv = L + I, power = L
    power, prev = row, rows.block_cols_of(rows.block_rows_of(t["low"]))  # the diagonal block of L
    for level in range(levels):
        power = row_product(power, prev, bs)  # row of power @ power
        t["powers"].view(n * c, levels, bs)[:, level].index_copy_(0, rows.flat, power)
        prev = rows.block_rows_of(t["powers"][:, :, level])
        inv = inv + row_product(inv, prev, bs)  # row of inv @ (I + power)
    out = rows.spread(inv)
    blocks = sorted({r // bs for r in rows.r_host})
    for b in blocks:  # block substitution, per block index (its product shapes); block 0 has none
        if b == 0:
            continue
        sel = (
            slice(None)
            if len(blocks) == 1
            else torch.tensor([r // bs == b for r in rows.r_host]).nonzero()[:, 0]
        )
        w = b * bs
        done = t["inv"][sel, :w, :w].contiguous()  # T[:w, :w], the blocks before
        t["subst"].view(n * c, c)[rows.flat[sel], :w] = row_product(neg[sel, :w], done, bs)
        below = t["subst"][sel, w : w + bs, :w].contiguous()  # the block's substitution rows so far
        out[sel, :w] = row_product(inv[sel], below, bs)
    rows.put("inv", out)
    return out


def decode_step(q, k, v, g, beta, store: RowStore, counts: list[int], truncate: bool = False) -> torch.Tensor:
    """One token per sequence of the store (its slots in order; N = slots x heads pairs): q, k [N, dk],
    v [N, dv], g [N] (or [N, dk], KDA), beta [N] (fp32, q already scaled), at chunk offsets `counts` (per
    sequence); writes the token's row into the store. Returns the outputs [N, dv]. A sequence whose chunk
    this completes is advanced by `advance`. `truncate`: products over the chunk's rows run over the rows up
    to the furthest token's alone (`row_product`'s `used`), the elementwise terms over those columns."""
    rows = _Rows(store, counts, store.t["powers"].shape[-1])
    t, c = rows.t, rows.c
    used = max(counts) + 1 if truncate else c
    channel = g.dim() == 2
    rows.put("k", k)
    # the chunk's cumsum: a float64 running sum, each row rounded to fp32
    acc = g.double()
    if any(rows.r_host):
        prev = t["acc"].view(rows.n * c, *g.shape[1:]).index_select(0, (rows.flat - 1).clamp(min=0))
        acc = prev.masked_fill((rows.r == 0).view(-1, *([1] * (g.dim() - 1))), 0.0) + acc
    rows.put("acc", acc)
    gr = acc.float()
    rows.put("gc", gr)
    cols = torch.arange(c, device=q.device)
    not_lower, not_strict = cols > rows.r[:, None], cols >= rows.r[:, None]
    mask = not_lower[:, :used]
    mask = mask.unsqueeze(-1) if channel else mask
    diff = (gr.unsqueeze(1) - t["gc"][:, :used]).masked_fill_(mask, 0.0)  # gc_r - gc_j, j <= r
    decay = aligned_unary(torch.exp, diff).masked_fill_(mask, 0.0)
    egc = aligned_unary(torch.exp, gr)
    egc = egc if channel else egc.unsqueeze(-1)
    kb = k * beta.unsqueeze(-1)
    rows.put("vb", v * beta.unsqueeze(-1))
    rows.put("kbg", kb * egc)
    neg, intra = _pair_terms(rows, q, kb, decay, not_lower, not_strict, channel)
    rows.put("low", neg)
    t_row = _solve_row(rows, neg)
    u, w = row_product(t_row, t["vb"], c, used), row_product(t_row, t["kbg"], c, used)
    by_state = row_product(torch.stack([w, q * egc], 1), t["state"], c)  # w S and (q exp(gc)) S, one pass
    v_new = u - by_state[:, 0]
    rows.put("v_new", v_new)
    return by_state[:, 1] + row_product(intra, t["v_new"], c, used)


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


def append_tokens(store: RowStore, counts: list[int], inputs: tuple[torch.Tensor, ...]) -> None:
    """Write each slot's token (k, v, g, beta [slots, H, ...]) at its row `counts[s]` of `store.tokens`."""
    c = store.tokens["k"].shape[1]
    at = torch.tensor([s * c + n for s, n in enumerate(counts)], device=inputs[0].device)
    for name, x in zip(TOKEN_FIELDS, inputs, strict=True):
        buf = store.tokens[name]
        buf.view(-1, *buf.shape[2:]).index_copy_(0, at, x)


def hold(store: RowStore, slot: int, cache) -> None:
    """Note that `cache`'s chunk inputs are views of the slot's token rows (see `restart_slot`)."""
    store.holders[slot].append(weakref.ref(cache))


def restart_slot(store: RowStore, slot: int) -> None:
    """Empty a slot whose chunk completed, for the sequence's next chunk: earlier views of its rows expire,
    and the caches still alive that view its token rows get copies of them."""
    for ref in store.holders[slot]:
        cache = ref()
        if cache is not None:
            for name in TOKEN_FIELDS:
                setattr(cache, name, getattr(cache, name).clone())
    store.holders[slot] = []
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
