"""DeepSeek-V4 attention on rz's op set: one shared K=V head with a per-head sink over a sliding window, plus
compressed K/V entries (parameter names are the checkpoint's: `attn.wq_a`, `attn.compressor.wkv`, ...).

- sliding_attention: the window of the last `sliding_window` positions only.
- heavily_compressed_attention (HCA): + every compressed entry the query may see; an entry pools
  `hca_rate` tokens (softmax gates with a learned per-slot bias), so entry w is visible from position
  (w + 1) * rate - 1 on.
- compressed_sparse_attention (CSA): entries pool 2 x `csa_rate` tokens (the previous window's first half of
  the projection and this window's second half, stride `csa_rate`); a lightning indexer (its own compressor at
  `index_head_dim`) scores the visible entries per query and the attention reads only its top `index_topk`.

Queries come from a low-rank projection (wq_a -> q_norm -> wq_b, then an unweighted per-head RMSNorm); RoPE
rotates the last `qk_rope_head_dim` channels (interleaved pairs; the "main" base on sliding layers, the
"compress" base, possibly YaRN, on compressed ones); the output's rope channels are rotated back by the
query's angle; the output projection is grouped (wo_a per head group, then wo_b).

The compressor, the indexer's scores and the top-k selection are the op set's V4 forms (rz_kernels:
window_pool, sparse_select, sink_attention): aligned, each a per-row computation with fixed-length
reductions and a stable selection, so the learner's packed forward, a forward over any other batch and one
over any prefix select the same blocks and attend with the same bits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from rz_agents.model.deepseek_v4_config import DeepseekV4Config
from rz_agents.model.deepseek_v4_decode import PagedDecode
from rz_agents.model.deepseek_v4_layers import InterleavedRope, unweighted_rms_norm
from rz_agents.model.layers import RMSNorm, _linear
from rz_kernels import OpSet, sink_attention, sparse_select, window_pool

# Compressed entries are summed this many at a time (then the blocks in a fixed tree) by the aligned HCA.
ENTRY_BLOCK = 64


@dataclass(frozen=True)
class SparseForms:
    """The V4-specific kernels of one op set."""

    pool: Callable
    scores: Callable
    top_k: Callable
    attention: Callable


ALIGNED_FORMS = SparseForms(
    window_pool.aligned_pool,
    sparse_select.aligned_scores,
    sparse_select.aligned_top_k,
    sink_attention.aligned_sink_attention,
)
STANDARD_FORMS = SparseForms(
    window_pool.standard_pool,
    sparse_select.standard_scores,
    sparse_select.standard_top_k,
    sink_attention.standard_sink_attention,
)


def sparse_forms(ops: OpSet) -> SparseForms:
    """The standard op set's stock forms, the Triton op set's kernels, else the aligned (CPU) ones."""
    if ops.name == "triton":  # imported here: the Triton op set is only importable where triton is
        from rz_kernels.triton_ops import sink_attention as t_sink
        from rz_kernels.triton_ops import sparse_select as t_select
        from rz_kernels.triton_ops import window_pool as t_pool

        return SparseForms(t_pool.aligned_pool, t_select.aligned_scores, t_select.aligned_top_k,
                           t_sink.aligned_sink_attention)  # fmt: skip
    return STANDARD_FORMS if ops.name == "standard" else ALIGNED_FORMS


@dataclass
class SequenceState:
    """One sequence's cache between forwards (standalone; the engine keeps it in pages instead and builds one
    per call: model/deepseek_v4_cache.py): per layer, the rows a later token may still read (the attention's
    K=V for the sliding window, the compressors' projections of the windows not pooled yet), for positions
    `start`..`position - 1` (with `keep_all`, every position fed since `start`), and
    every compressed entry pooled so far (`entries`). Its size is bounded by the window and the rates, plus
    one entry per `rate` tokens."""

    position: int = 0  # tokens seen so far
    start: int = 0  # the first position `rows` still holds
    rows: dict[str, torch.Tensor] = field(default_factory=dict)
    entries: dict[str, torch.Tensor] = field(default_factory=dict)
    keep_all: bool = False  # keep the rows of every position fed, not only those later tokens read (pages)


@dataclass(frozen=True)
class Reach:
    """How far back a later token reads: the sliding window and the compression rates (CSA's windows also
    read the window before)."""

    window: int
    csa_rate: int
    hca_rate: int

    def first_needed(self, position: int) -> int:
        """The first position a call starting at `position` reads rows of."""
        csa = (position // self.csa_rate - 1) * self.csa_rate
        hca = (position // self.hca_rate) * self.hca_rate
        return max(0, min(position - self.window + 1, csa, hca))


class Layout:
    """Where each token sits: row indices by (sequence, position), the sliding window's slots, and each
    compression rate's windows. Rows are the cached ones of every sequence (with `states`: positions below
    each state's position, sequence by sequence), then the call's tokens in stream order. Built once per
    forward."""

    def __init__(
        self,
        positions: torch.Tensor,
        seq_ids: torch.Tensor,
        num_sequences: int,
        top: int,
        states: list[SequenceState] | None = None,
        reach: Reach | None = None,
    ) -> None:
        device = positions.device
        self.positions, self.seq_ids = positions, seq_ids
        runs = [int((seq_ids == s).sum()) for s in range(len(states))] if states is not None else None
        self.runs = runs
        # (a state without tokens in this call still has its rows addressed)
        self.length = max([top + 1] + [st.position for st in states or []])
        self.states = states
        index = torch.full((num_sequences, self.length), -1, dtype=torch.long, device=device)
        cached = 0
        self.keep_from: list[int] = []  # per state: the first position its rows keep after this call
        for s, st in enumerate(states or []):
            held = st.position - st.start
            index[s, st.start : st.position] = torch.arange(cached, cached + held, device=device)
            cached += held
            end = st.position + runs[s]
            keep = st.start if st.keep_all else reach.first_needed(end) if reach is not None else 0
            self.keep_from.append(keep)
        index[seq_ids, positions] = cached + torch.arange(positions.numel(), device=device)
        self.index = index
        if device.type == "cpu" and positions.numel():
            # (a GPU caller's stream is the packer's: trusted)
            top_of = torch.full((num_sequences,), -1, dtype=torch.long).scatter_reduce(
                0, seq_ids, positions, "amax"
            )
            needed = torch.arange(self.length).unsqueeze(0) <= top_of.unsqueeze(1)
            if states is not None:  # positions before a state's `start` are dropped on purpose
                starts = torch.tensor([st.start for st in states])
                needed &= torch.arange(self.length).unsqueeze(0) >= starts.unsqueeze(1)
            if bool((needed & (index < 0)).any()):
                raise ValueError(
                    "each sequence's positions must run from 0 (or its state's position) without gaps"
                )
        self._windows: dict[int, tuple[torch.Tensor, int]] = {}
        self._slides: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.angles: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def rows(self, key: str, new: torch.Tensor) -> torch.Tensor:
        """The row space of a per-token tensor: the states' cached rows of `key`, then `new` [T, ...] (the
        call's tokens); the states keep their sequences' rows for the next call."""
        if self.states is None:
            return new
        cached = [st.rows.get(key, new[:0]) for st in self.states]
        for s, st in enumerate(self.states):
            held = torch.cat([cached[s], new[self.seq_ids == s]]).detach()
            st.rows[key] = held[self.keep_from[s] - st.start :]
        return torch.cat([*cached, new])

    def done_windows(self, rate: int) -> list[int]:
        """Per sequence, how many windows of `rate` its state has pooled already (0 without states)."""
        return [st.position // rate for st in self.states] if self.states is not None else []

    def entries(self, key: str, computed: torch.Tensor, first: int, rate: int) -> torch.Tensor:
        """Every sequence's entries [S, NW, D]: the states' pooled ones, then `computed` (windows `first` on);
        the states keep their complete windows' entries."""
        s, nw = computed.shape[0], self.length // rate
        out = torch.cat([computed.new_zeros(s, first, computed.shape[-1]), computed], dim=1)
        for i, st in enumerate(self.states or []):
            done = st.position // rate
            if done:
                out[i, :done] = st.entries[key][:done]
            total = (st.position + self.runs[i]) // rate
            st.entries[key] = out[i, :total].detach().clone()
        return out[:, :nw]

    def slide(self, window: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(flat index [T, W] of each query's window slots, oldest first (0 where empty), ok [T, W])."""
        if window not in self._slides:
            pos = (
                self.positions.unsqueeze(1)
                - (window - 1)
                + torch.arange(window, device=self.positions.device)
            )
            ok = pos >= 0
            idx = self.index[self.seq_ids.unsqueeze(1), pos.clamp(min=0)]
            self._slides[window] = (torch.where(ok, idx, torch.zeros_like(idx)), ok)
        return self._slides[window]

    def windows(self, rate: int, first: int = 0) -> tuple[torch.Tensor, int]:
        """(row index [S, NW - first, rate] of the tokens of each sequence's windows `first`..NW-1 (0 where
        absent), NW: the complete windows of the longest sequence)."""
        if (rate, first) not in self._windows:
            nw = self.length // rate
            tok = self.index[:, first * rate : nw * rate].reshape(self.index.shape[0], nw - first, rate)
            self._windows[(rate, first)] = (tok.clamp(min=0), nw)
        return self._windows[(rate, first)]

    def visible(self, rate: int, nw: int) -> torch.Tensor:
        """[T, NW] whether each query may see each entry (its window ends at or before the query)."""
        limit = torch.div(self.positions + 1, rate, rounding_mode="floor")
        return torch.arange(nw, device=self.positions.device).unsqueeze(0) < limit.unsqueeze(1)


class Compressor(nn.Module):
    """Pools windows of `rate` tokens into entries of `dim` channels (`overlap`: CSA's two-window pooling,
    its projections twice as wide), RMS-normed and rotated at the window's first position."""

    def __init__(self, hidden: int, dim: int, rate: int, overlap: bool, eps: float, key: str) -> None:
        super().__init__()
        self.key = key
        width = 2 * dim if overlap else dim
        self.ape = nn.Parameter(torch.zeros(rate, width))
        self.wkv = _linear(hidden, width)
        self.wgate = _linear(hidden, width)
        self.norm = RMSNorm(dim, eps)
        self.dim, self.rate, self.overlap = dim, rate, overlap

    def forward(self, x: torch.Tensor, layout: Layout, rope: InterleavedRope, ops: OpSet) -> torch.Tensor:
        """Entries [S, NW, dim] of every sequence's complete windows (later ones are never visible). With
        states only the windows no state has pooled yet are computed (each entry is its window's alone)."""
        done = layout.done_windows(self.rate)
        first = min(done, default=0)
        lead = 1 if self.overlap and first else 0  # CSA's first new window reads the window before it
        tok, nw = layout.windows(self.rate, first - lead)
        s, d, r = tok.shape[0], self.dim, self.rate
        kv = layout.rows(self.key + ".kv", ops.linear(x, self.wkv.weight))[tok]  # [S, NW, r, width]
        gate = (
            layout.rows(self.key + ".gate", ops.linear(x, self.wgate.weight))[tok].float() + self.ape.float()
        )
        if self.overlap:  # slots: the previous window's first half, then this window's second half
            prev_kv = torch.cat([torch.zeros_like(kv[:, :1, :, :d]), kv[:, :-1, :, :d]], dim=1)
            prev_gate = torch.cat(
                [torch.full_like(gate[:, :1, :, :d], float("-inf")), gate[:, :-1, :, :d]], 1
            )
            kv = torch.cat([prev_kv, kv[..., d:]], dim=2)
            gate = torch.cat([prev_gate, gate[..., d:]], dim=2)
        slots = kv.shape[2]
        count = nw - first + lead
        positions = (torch.arange(first - lead, nw, device=x.device) * r).repeat(s)
        pooled = self._pool(kv.reshape(s * count, slots, d), gate.reshape(s * count, slots, d), positions,
                            rope, ops).view(s, count, d)[:, lead:]  # fmt: skip
        return pooled if layout.states is None else layout.entries(self.key + ".entries", pooled, first, r)

    def decode(self, x: torch.Tensor, step: PagedDecode, rope: InterleavedRope, ops: OpSet) -> None:
        """A decode step's part (one token per row): the token's projections go to its page, and the window
        holding it (with CSA's window before) is pooled into that window's entry slot (final at the window's
        last token: model/deepseek_v4_decode.py)."""
        step.write_row(self.key + ".kv", ops.linear(x, self.wkv.weight))
        step.write_row(self.key + ".gate", ops.linear(x, self.wgate.weight))
        d, r, lead = self.dim, self.rate, int(self.overlap)
        window = torch.div(step.positions, r, rounding_mode="floor")
        kv, _ = step.read_rows(self.key + ".kv", (window - lead) * r, (1 + lead) * r)  # [B, (1+lead)r, width]
        gate, _ = step.read_rows(self.key + ".gate", (window - lead) * r, (1 + lead) * r)
        gate = gate.float() + self.ape.float().repeat(1 + lead, 1)
        if self.overlap:  # as in forward: the window before's first half (none before window 0), then its own
            first = (window == 0).view(-1, 1, 1)
            prev_kv = kv[:, :r, :d].masked_fill(first, 0)
            prev_gate = gate[:, :r, :d].masked_fill(first, float("-inf"))
            kv = torch.cat([prev_kv, kv[:, r:, d:]], dim=1)
            gate = torch.cat([prev_gate, gate[:, r:, d:]], dim=1)
        step.write_entry(self.key + ".entries", self._pool(kv, gate, window * r, rope, ops), r)

    def _pool(self, kv, gate, positions: torch.Tensor, rope: InterleavedRope, ops: OpSet) -> torch.Tensor:
        """Entries [N, dim] of windows kv / gate [N, slots, dim] starting at `positions` [N]: pooled, normed,
        rotated at the window's first position."""
        pooled = self.norm(sparse_forms(ops).pool(kv, gate), ops)
        cos, sin = rope.angles(positions)
        return rope.rotate(pooled, cos, sin)


class Indexer(nn.Module):
    """The lightning indexer: its own compressor at `index_head_dim`, query heads from the low-rank query,
    per-head weights; picks each query's top `index_topk` visible entries."""

    def __init__(self, cfg: DeepseekV4Config, layer: int) -> None:
        super().__init__()
        c, heads = cfg.index_head_dim, cfg.index_n_heads
        self.compressor = Compressor(
            cfg.hidden_size, c, cfg.csa_rate, True, cfg.rms_norm_eps, f"{layer}.indexer"
        )
        self.weights_proj = _linear(cfg.hidden_size, heads)
        self.wq_b = _linear(cfg.q_lora_rank, heads * c)
        self.heads, self.dim, self.top_k, self.rate = heads, c, cfg.index_topk, cfg.csa_rate

    def forward(
        self, x: torch.Tensor, q_low: torch.Tensor, layout: Layout, rope: InterleavedRope, ops: OpSet
    ) -> torch.Tensor:
        """Selected entry indices [T, index_topk] (-1: none), best first."""
        entries = self.compressor(x, layout, rope, ops)  # [S, NW, c]
        visible = layout.visible(self.rate, entries.shape[1])
        return self._select(x, q_low, entries[layout.seq_ids], visible, layout.angles, rope, ops)

    def decode(
        self, x: torch.Tensor, q_low: torch.Tensor, step: PagedDecode, rope: InterleavedRope, ops: OpSet
    ) -> torch.Tensor:
        """A decode step's selections [B, index_topk] over a fixed candidate set (every entry slot up to the
        step's bound; the ones not visible yet score -inf and are never selected)."""
        self.compressor.decode(x, step, rope, ops)
        keys, visible = step.entries(self.compressor.key + ".entries", self.rate)
        return self._select(x, q_low, keys, visible, step.angles, rope, ops)

    def _select(self, x, q_low, keys, visible, angles, rope: InterleavedRope, ops: OpSet) -> torch.Tensor:
        """Top `index_topk` of each query's keys [T, NW, c] (the visible [T, NW] ones), best first."""
        forms = sparse_forms(ops)
        t = x.shape[0]
        q = ops.linear(q_low, self.wq_b.weight).view(t, self.heads, self.dim)
        q = rope.rotate(q, *angles["compress"])
        weights = ops.linear(x, self.weights_proj.weight).float() * self.heads**-0.5
        scores = forms.scores(q, keys, weights, visible, self.dim**-0.5)
        return forms.top_k(scores, self.top_k)


class Attention(nn.Module):
    def __init__(self, cfg: DeepseekV4Config, layer: int) -> None:
        super().__init__()
        h, d, hidden = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
        self.kind = cfg.layer_types[layer]
        self.rate = cfg.rate(layer)
        self.rope_kind = "main" if self.rate == 0 else "compress"
        self.heads, self.head_dim, self.window = h, d, cfg.sliding_window
        self.groups, self.group_rank = cfg.o_groups, cfg.o_lora_rank
        self.eps = cfg.rms_norm_eps
        self.attn_sink = nn.Parameter(torch.zeros(h))
        self.wq_a = _linear(hidden, cfg.q_lora_rank)
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.wq_b = _linear(cfg.q_lora_rank, h * d)
        self.wkv = _linear(hidden, d)
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.wo_a = _linear(h * d // cfg.o_groups, cfg.o_groups * cfg.o_lora_rank)
        self.wo_b = _linear(cfg.o_groups * cfg.o_lora_rank, hidden)
        if self.rate:
            overlap = self.kind == "compressed_sparse_attention"
            self.compressor = Compressor(
                hidden, d, self.rate, overlap, cfg.rms_norm_eps, f"{layer}.compressor"
            )
        if self.kind == "compressed_sparse_attention":
            self.indexer = Indexer(cfg, layer)
        self.key = f"{layer}.kv"
        self.scale = d**-0.5

    def forward(
        self, x: torch.Tensor, layout: Layout, ropes: dict[str, InterleavedRope], ops: OpSet, trace=None
    ):
        t, h, d = x.shape[0], self.heads, self.head_dim
        rope = ropes[self.rope_kind]
        cos, sin = layout.angles[self.rope_kind]
        q_low = self.q_norm(ops.linear(x, self.wq_a.weight), ops)
        q = unweighted_rms_norm(ops.linear(q_low, self.wq_b.weight).view(t, h, d), self.eps)
        q = rope.rotate(q, cos, sin)
        kv = rope.rotate(self.norm(ops.linear(x, self.wkv.weight), ops), cos, sin)  # [T, D]
        keys = self._paged_keys if isinstance(layout, PagedDecode) else self._keys
        slide, slide_ok, comp, comp_ok, block = keys(x, q_low, kv, layout, rope, ops, trace)
        out = sparse_forms(ops).attention(
            q, slide, slide_ok, comp, comp_ok, self.attn_sink, self.scale, block
        )
        out = rope.rotate(out, cos, -sin)  # K = V carried the keys' rotation: undo it at the query's angle
        grouped = out.reshape(t, self.groups, -1)
        r = self.group_rank
        parts = [ops.linear(grouped[:, g], self.wo_a.weight[g * r : (g + 1) * r]) for g in range(self.groups)]
        return ops.linear(torch.cat(parts, dim=-1), self.wo_b.weight)

    def _keys(self, x, q_low, kv, layout: Layout, rope: InterleavedRope, ops: OpSet, trace) -> tuple:
        """(window keys [T, W, D], their mask, compressed keys [T, C, D], their mask, the compressed group's
        summation block) of each query, from the layout's rows and this call's entries."""
        t, d = x.shape[0], self.head_dim
        kv = layout.rows(self.key, kv)  # [rows, D]: cached positions too
        slots, slot_ok = layout.slide(self.window)
        comp, comp_ok, block = kv.new_zeros(t, 0, d), slot_ok.new_zeros(t, 0), None
        if self.rate:
            entries = self.compressor(x, layout, rope, ops)  # [S, NW, D]
            if self.kind == "compressed_sparse_attention":
                chosen = self.indexer(x, q_low, layout, rope, ops)  # [T, k]
                if trace is not None:
                    trace.append(("indexer", chosen))
                if entries.shape[1] == 0:  # no complete window yet: every pick is -1 (masked); gather a zero
                    entries = entries.new_zeros(entries.shape[0], 1, d)
                comp = entries[layout.seq_ids.unsqueeze(1), chosen.clamp(min=0)]
                comp_ok = chosen >= 0
            else:
                comp, comp_ok, block = (
                    entries[layout.seq_ids],
                    layout.visible(self.rate, entries.shape[1]),
                    ENTRY_BLOCK,
                )
        return kv[slots], slot_ok, comp, comp_ok, block

    def _paged_keys(self, x, q_low, kv, step: PagedDecode, rope: InterleavedRope, ops: OpSet, trace) -> tuple:
        """``_keys`` of a decode step, read from the pages in shapes fixed by (batch, bound)
        (model/deepseek_v4_decode.py): the token's K=V written, then its window read; the compressor's window
        pooled, then every entry slot up to the bound read, masked, and on CSA the indexer's picks of them."""
        step.write_row(self.key, kv)
        slide, slide_ok = step.window(self.key, self.window)
        t = x.shape[0]
        comp, comp_ok, block = kv.new_zeros(t, 0, self.head_dim), slide_ok.new_zeros(t, 0), None
        if self.rate:
            self.compressor.decode(x, step, rope, ops)
            key = self.compressor.key + ".entries"
            if self.kind == "compressed_sparse_attention":
                chosen = self.indexer.decode(x, q_low, step, rope, ops)  # [B, k]
                if trace is not None:
                    trace.append(("indexer", chosen))
                comp, comp_ok = step.entries(key, self.rate, picks=chosen)  # only the picks: [B, k, D]
            else:
                (comp, comp_ok), block = step.entries(key, self.rate), ENTRY_BLOCK  # every slot: [B, N, D]
        return slide, slide_ok, comp, comp_ok, block


def rope_pair(cfg: DeepseekV4Config) -> dict[str, InterleavedRope]:
    """The sliding layers' ("main") and the compressed branches' ("compress") rotations."""
    dim = cfg.qk_rope_head_dim
    return {
        "main": InterleavedRope(dim, cfg.rope_theta),
        "compress": InterleavedRope(
            dim, cfg.compress_rope_theta, cfg.compress_rope, cfg.max_position_embeddings
        ),
    }


__all__ = ["Attention", "Compressor", "Indexer", "Layout", "SequenceState", "rope_pair", "sparse_forms"]
