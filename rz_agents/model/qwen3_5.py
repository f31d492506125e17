"""The Qwen3.5 text decoder (hybrid linear attention) on rz's op set: a packed forward and HF checkpoint load.

Three of every four layers are Gated DeltaNet (linear attention: a short causal conv over q/k/v, the gated
delta rule, a gated RMSNorm); the rest are full attention with an output gate, q/k norms and partial RoPE
(only the first `rotary_dim` dimensions of a head rotate). All norms but the gated one are zero-centred
(scale 1 + weight). Parameter names are transformers' (`Qwen3_5ForCausalLM`), so a checkpoint it writes
loads by name.

With `kernels="aligned"` every op is batch-invariant: linears and full attention are the aligned op set's,
the delta rule runs on one chunk grid anchored at each sequence's start (rz_kernels.delta_rule), the conv and
norms are per token / per row. The model implements the forward contract (tokens, positions, seq ids, a
cache): the learner packs it as any family, and the engine keeps its per-sequence recurrent state in the
model's own paged cache (model/qwen3_5_cache.py), so a token gets the same bits in the learner's packed
forward, a prefill cut anywhere, a decode step and after preemption or prefix reuse.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from rz_agents.model.forward_inputs import Segment, refuse_images
from rz_agents.model.kv_cache import PAGE_SIZE, CacheView
from rz_agents.model.qwen3_5_cache import SNAPSHOT_EVERY, HybridCache, hybrid_bytes_per_page
from rz_agents.model.qwen3_5_config import Qwen35Config
from rz_agents.model.qwen3_5_moe import Qwen35SparseMoE
from rz_agents.model.qwen3_5_snapshots import plan_snapshots
from rz_agents.model.transformer import flat_stream, in_token_shape
from rz_kernels import OpSet, RopeTable, get_ops
from rz_kernels.attention import KEY_BLOCK, verify_attention
from rz_kernels.delta_rule import DeltaRuleCache, l2_normalize
from rz_kernels.elementwise import aligned_unary
from rz_kernels.gated_norm import zero_centered_rms_norm
from rz_kernels.gemm import verify_weights


class CenteredRMSNorm(nn.Module):
    """RMSNorm whose weight is stored centred on zero (scale 1 + weight), as Qwen3.5's."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return zero_centered_rms_norm(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor, ops: OpSet) -> torch.Tensor:
        return ops.gated_rms_norm(x, gate, self.weight, self.eps)


@dataclass
class SequenceState:
    """One sequence's cache between standalone forwards (``forward(..., seq_lens=, states=)``; the engine
    keeps its sequences' state in pages instead: model/qwen3_5_cache.py): per layer, the conv window and
    delta-rule cache (Gated DeltaNet) or the keys and values (attention)."""

    position: int = 0  # tokens seen so far
    layers: dict[int, tuple] = field(default_factory=dict)


class _Batch:
    """What every layer of one forward shares: op set, sequences, positions, attention plan, and where the
    per-sequence state lives: nowhere (the learner's packed forward: every sequence starts at position 0),
    ``states`` (standalone calls) or the engine's paged ``HybridCache`` (``view``).

    ``seq_lens``/``starts`` (host) give each sequence's tokens in this call (contiguous in the stream, in
    position order) and its first position; ``rows`` (host) its row of the view's page table."""

    def __init__(
        self,
        model: Qwen35ForCausalLM,
        positions: torch.Tensor,
        seq_index: torch.Tensor,
        seq_lens: Sequence[int],
        starts: Sequence[int],
        states: Sequence[SequenceState] | None = None,
        view: CacheView | None = None,
        rows: Sequence[int] | None = None,
    ) -> None:
        cfg = model.config
        self.ops: OpSet = model.ops_for(positions.device)
        self.seq_lens, self.starts = list(seq_lens), list(starts)
        self.states = list(states) if states is not None else None
        self.view, self.rows = view, list(rows) if rows is not None else None
        self.positions, self.seq_ids = positions, seq_index
        self.rope_positions = positions  # the RoPE rows each token rotates by (forward's text_rope_positions)
        top = max((a + n for a, n in zip(self.starts, self.seq_lens, strict=True)), default=1) - 1
        model.rope.check_top(top)
        self.rope = model.rope
        table = None
        if view is not None:
            table = view.page_table
            self.write_page = table[seq_index, torch.div(positions, PAGE_SIZE, rounding_mode="floor")]
            self.write_offset = positions % PAGE_SIZE
            self._plan_snapshots(view.cache, table)
        else:
            self.buf_shape = (
                len(self.seq_lens),
                cfg.num_key_value_heads,
                -(-(top + 1) // KEY_BLOCK) * KEY_BLOCK,
            )
        self.plan = self.ops.plan_attention(
            seq_index, positions, cfg.num_attention_heads, cfg.num_key_value_heads, page_table=table,
            max_position=top, decode_positions=view.decode_positions if view is not None else None,
        )  # fmt: skip

    def _plan_snapshots(self, cache, table: torch.Tensor) -> None:
        """Which snapshot each sequence resumes from and which snapshots this forward keeps (once for every
        layer: model/qwen3_5_snapshots.py). Pages this forward starts filling lose their old snapshots."""
        cache.slots.forget(set(self.write_page[self.write_offset == 0].tolist()))
        host = table.tolist()
        self.snap_sources, self.snap_targets = plan_snapshots(
            cache.slots, [host[r] for r in self.rows], self.starts, self.seq_lens, cache.snapshot_every,
            PAGE_SIZE,
        )  # fmt: skip

    fused = False  # (the MoE block's context: this family stacks no projections)

    @property
    def keeps_state(self) -> bool:
        return self.states is not None or self.view is not None

    def cached(self, layer: int) -> list[tuple | None]:
        """Each sequence's cache of `layer` in a standalone call (None: nothing cached, or no states)."""
        if self.states is None:
            return [None] * len(self.seq_lens)
        return [st.layers.get(layer) for st in self.states]

    def keep(self, layer: int, values: Sequence[tuple]) -> None:
        if self.states is not None:
            for st, value in zip(self.states, values, strict=True):
                st.layers[layer] = value

    def recurrent_inputs(self, layer: int, kernel: int, heads) -> tuple[list, list]:
        """Each sequence's conv window and DeltaRuleCache entering this call (None: it starts here).

        From the view's pages: the window is the conv inputs of the K - 1 positions before the call, the
        state the latest snapshot planned for the sequence (or zero at its start), and the k and v of every
        token after that snapshot are recomputed from their conv inputs by ``heads`` (the layer's conv + head
        split + l2 norm: per-token arithmetic, so the same bits as when they were first computed; g and beta
        are kept): the delta rule recomputes those chunks' states, bit for bit."""
        if self.view is None:
            cached = self.cached(layer)
            return [c[0] if c else None for c in cached], [c[1] if c else None for c in cached]
        cache, table = self.view.cache, self.view.page_table

        def read(buf, r: int, lo: int, hi: int) -> torch.Tensor:  # positions lo..hi-1 of a row (0 before 0)
            pos = torch.arange(lo, hi, device=table.device)
            rows = buf[table[r, pos.clamp(min=0) // PAGE_SIZE], pos.clamp(min=0) % PAGE_SIZE]
            keep = (pos >= 0).view(-1, *([1] * (rows.dim() - 1)))  # (KDA's g is [n, heads, dk])
            return torch.where(keep, rows, torch.zeros_like(rows))

        conv_in = cache.conv_in[layer]
        windows, entering, pending = [], [], []
        for a, r, (j, slot) in zip(self.starts, self.rows, self.snap_sources, strict=True):
            if a == 0:
                windows.append(None)
                entering.append(None)
                continue
            windows.append(read(conv_in, r, a - kernel + 1, a))
            state = cache.state[layer][slot] if slot is not None else torch.zeros_like(cache.state[layer][0])
            lo = (j + 1) * PAGE_SIZE  # the first token after the snapshot: recomputed from here
            g, beta = read(cache.dr_g[layer], r, lo, a), read(cache.dr_beta[layer], r, lo, a)
            entering.append((state.clone(), g, beta))
            if a > lo:
                pending.append(
                    (len(entering) - 1, read(conv_in, r, lo, a), read(conv_in, r, lo - kernel + 1, lo))
                )
        kv = {}
        if pending:
            k, v = heads(
                torch.cat([x for _, x, _ in pending]),
                [x.shape[0] for _, x, _ in pending],
                [w for _, _, w in pending],
            )
            sizes = [x.shape[0] for _, x, _ in pending]
            kv = {
                i: pair
                for (i, _, _), pair in zip(
                    pending, zip(k.split(sizes), v.split(sizes), strict=True), strict=True
                )
            }
        caches = []
        for i, e in enumerate(entering):
            if e is None:
                caches.append(None)
                continue
            state, g, beta = e
            k, v = kv.get(i, (None, None))
            if k is None:
                h, dk, dv = state.shape
                k, v = state.new_zeros(0, h, dk), state.new_zeros(0, h, dv)
            caches.append(DeltaRuleCache(state, k.float(), v.float(), g, beta))
        return windows, caches

    @torch.no_grad()
    def write_recurrent(
        self, layer: int, conv_in: torch.Tensor, inputs: Sequence[torch.Tensor], caches
    ) -> None:
        """Into the view's pages: this call's per-position conv inputs and delta-rule g and beta, and the
        state after each chunk it completed whose snapshot the plan keeps (in the slot planned for it)."""
        cache = self.view.cache
        page, off = self.write_page, self.write_offset
        cache.conv_in[layer][page, off] = conv_in.detach()
        for buf, x in zip((cache.dr_g, cache.dr_beta), inputs, strict=True):
            buf[layer][page, off] = x.detach().float()
        for (j, _), keep, dr in zip(self.snap_sources, self.snap_targets, caches, strict=True):
            for c, snapshot in enumerate(dr.completed, start=j + 1):  # (the first completed chunk is j + 1)
                if c in keep:
                    cache.state[layer][keep[c]] = snapshot


class FullAttention(nn.Module):
    """Gated full attention: q_proj gives each head's query and its output gate; partial RoPE."""

    def __init__(self, cfg: Qwen35Config) -> None:
        super().__init__()
        d, h, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.num_heads, self.num_kv_heads = d, h, hkv
        self.rotary_dim = cfg.rotary_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, h * d * 2, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, hkv * d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, hkv * d, bias=bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=bias)
        self.q_norm = CenteredRMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = CenteredRMSNorm(d, cfg.rms_norm_eps)

    def _rotate(self, x: torch.Tensor, batch: _Batch) -> torch.Tensor:
        r = self.rotary_dim
        return torch.cat([batch.ops.rope(batch.rope, x[..., :r], batch.rope_positions), x[..., r:]], dim=-1)

    def forward(self, x: torch.Tensor, batch: _Batch) -> torch.Tensor:
        ops, t, d = batch.ops, x.shape[0], self.head_dim
        qg = ops.linear(x, self.q_proj.weight, self.q_proj.bias).view(t, self.num_heads, 2 * d)
        q, gate = qg[..., :d], qg[..., d:].reshape(t, -1)
        k = ops.linear(x, self.k_proj.weight, self.k_proj.bias).view(t, self.num_kv_heads, d)
        v = ops.linear(x, self.v_proj.weight, self.v_proj.bias).view(t, self.num_kv_heads, d)
        q = self._rotate(self.q_norm(q), batch)
        k = self._rotate(self.k_norm(k), batch)
        if batch.view is not None:  # the engine's pages: write this call's K/V, attend through the table
            cache = batch.view.cache
            k_buf, v_buf = cache.k[self.index], cache.v[self.index]
            with torch.no_grad():
                k_buf[batch.write_page, :, batch.write_offset] = k.detach()
                v_buf[batch.write_page, :, batch.write_offset] = v.detach()
            return self._output(ops.attention(q, k_buf, v_buf, batch.plan, 1.0 / math.sqrt(d)), gate, ops)
        shape = (*batch.buf_shape, d)
        k_buf = torch.zeros(shape, dtype=k.dtype, device=k.device)
        v_buf = torch.zeros(shape, dtype=v.dtype, device=v.device)
        k_buf[batch.seq_ids, :, batch.positions] = k
        v_buf[batch.seq_ids, :, batch.positions] = v
        if batch.states is not None:  # earlier positions from each sequence's cache; then keep the new ones
            kept = []
            for s, (old, n) in enumerate(zip(batch.cached(self.index), batch.seq_lens, strict=True)):
                if old is not None:
                    k_buf[s, :, : old[0].shape[1]], v_buf[s, :, : old[1].shape[1]] = old
                a = batch.starts[s]
                kept.append((k_buf[s, :, : a + n].detach().clone(), v_buf[s, :, : a + n].detach().clone()))
            batch.keep(self.index, kept)
        return self._output(ops.attention(q, k_buf, v_buf, batch.plan, 1.0 / math.sqrt(d)), gate, ops)

    def _output(self, out: torch.Tensor, gate: torch.Tensor, ops: OpSet) -> torch.Tensor:
        out = out.reshape(out.shape[0], -1) * aligned_unary(torch.sigmoid, gate)
        return ops.linear(out, self.o_proj.weight, self.o_proj.bias)


class GatedDeltaNet(nn.Module):
    """Linear attention: conv over q/k/v, the gated delta rule, a gated RMSNorm (transformers' names)."""

    def __init__(self, cfg: Qwen35Config) -> None:
        super().__init__()
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        key_dim, value_dim = self.hk * self.dk, self.hv * self.dv
        self.key_dim, self.value_dim = key_dim, value_dim
        conv_dim = 2 * key_dim + value_dim
        self.conv1d = nn.Conv1d(
            conv_dim, conv_dim, cfg.linear_conv_kernel_dim, groups=conv_dim, bias=False,
            padding=cfg.linear_conv_kernel_dim - 1,
        )  # fmt: skip
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(value_dim, cfg.hidden_size, bias=False)
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, self.hv, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, self.hv, bias=False)

    def _heads(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k ([T, hv, dk], repeated to the value heads and l2-normalized) and v [T, hv, dv] of the conv's
        output."""
        t = mixed.shape[0]
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k = q.reshape(t, self.hk, self.dk), k.reshape(t, self.hk, self.dk)
        v = v.reshape(t, self.hv, self.dv)
        if self.hv != self.hk:
            q = q.repeat_interleave(self.hv // self.hk, dim=1)
            k = k.repeat_interleave(self.hv // self.hk, dim=1)
        return l2_normalize(q), l2_normalize(k), v

    def forward(self, x: torch.Tensor, batch: _Batch) -> torch.Tensor:
        ops, t = batch.ops, x.shape[0]

        def pending_kv(conv_in, lens, windows):  # a paged cache's pending chunk tokens, recomputed
            mixed, _ = ops.causal_conv1d(conv_in, self.conv1d.weight, lens, windows)
            return self._heads(mixed)[1:]

        windows, entering = batch.recurrent_inputs(self.index, self.conv1d.weight.shape[-1], pending_kv)
        keep = batch.keeps_state
        proj = ops.linear(x, self.in_proj_qkv.weight)
        mixed, windows = ops.causal_conv1d(
            proj, self.conv1d.weight, batch.seq_lens, windows, keep_windows=batch.states is not None
        )
        q, k, v = self._heads(mixed)
        z = ops.linear(x, self.in_proj_z.weight).reshape(t * self.hv, self.dv)
        beta = aligned_unary(torch.sigmoid, ops.linear(x, self.in_proj_b.weight))
        a = ops.linear(x, self.in_proj_a.weight).float() + self.dt_bias
        # g = -exp(A_log) * softplus(a + dt_bias): the per-token log decay, in fp32 as the reference
        g = -aligned_unary(torch.exp, self.A_log.float()) * aligned_unary(F.softplus, a)
        # (the paged cache rebuilds its DeltaRuleCaches from pages every call: no rows kept for the row path)
        core, caches = ops.delta_rule(
            q, k, v, g, beta, batch.seq_lens, entering, keep_caches=keep, keep_rows=batch.view is None
        )
        if batch.view is not None:
            batch.write_recurrent(self.index, proj, (g, beta), caches)
        elif keep:
            batch.keep(self.index, list(zip(windows, caches, strict=True)))
        core = self.norm(core.reshape(t * self.hv, self.dv), z, ops).reshape(t, self.value_dim)
        return ops.linear(core, self.out_proj.weight)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor, batch: _Batch) -> torch.Tensor:
        ops = batch.ops
        h = ops.silu_mul(ops.linear(x, self.gate_proj.weight), ops.linear(x, self.up_proj.weight))
        return ops.linear(h, self.down_proj.weight)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen35Config, index: int) -> None:
        super().__init__()
        self.kind = cfg.layer_types[index]
        if self.kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = FullAttention(cfg)
        (self.linear_attn if self.kind == "linear_attention" else self.self_attn).index = index
        self.mlp = Qwen35SparseMoE(cfg) if cfg.num_experts else MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = CenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = CenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, batch: _Batch) -> torch.Tensor:
        mixer = self.linear_attn if self.kind == "linear_attention" else self.self_attn
        x = x + mixer(self.input_layernorm(x), batch)
        return x + self.mlp(self.post_attention_layernorm(x), batch)


class _Stack(nn.Module):
    def __init__(self, cfg: Qwen35Config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = CenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen35ForCausalLM(nn.Module):
    """Qwen3.5 causal LM on the forward contract every family implements (model/transformer.py): `forward`
    gives final hidden states, `logits` the LM head; the engine's paged cache is the model's own kind
    (``new_kv_cache``: K/V pages plus the Gated DeltaNet layers' recurrent state, model/qwen3_5_cache.py)."""

    takes_images = False  # (the vision-language model: Qwen35VLForConditionalGeneration, qwen3_5_vl.py)
    fused_projections = False  # no stacked q/k/v GEMMs for this family yet (``fuse_projections``: a no-op)
    # what one forward's layers share, and the engine cache's kind (a hybrid family built on this class,
    # Kimi Linear, brings its own)
    batch_type: type = _Batch
    cache_type: type = HybridCache
    snapshot_every = SNAPSHOT_EVERY  # the engine cache's pages per delta-rule state snapshot slot

    def __init__(
        self, config: Qwen35Config, kernels: str = "aligned", stack: nn.Module | None = None
    ) -> None:
        """``stack``: the ``model.`` module when it is more than the decoder (a vision-language model's tower
        and ``language_model``: model/qwen3_5_vl.py); ``decoder`` names the decoder within it."""
        super().__init__()
        get_ops(kernels)  # reject an unknown name now
        self.config = config
        self.model = _Stack(config) if stack is None else stack
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.decoder.embed_tokens.weight
        self.kernels = kernels
        self.rope = RopeTable(config.rotary_dim, config.rope_theta, config.max_position_embeddings)
        self.to(config.torch_dtype)

    # ---- the op set -------------------------------------------------------------------------------------
    def ops_for(self, device: torch.device | str) -> OpSet:
        return get_ops(self.kernels, device)

    @property
    def ops(self) -> OpSet:
        return self.ops_for(self.device)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def set_kernels(self, kernels: str) -> None:
        """Switch op set in place (same weights)."""
        get_ops(kernels)
        self.kernels = kernels

    def fuse_projections(self, enabled: bool = True) -> None:
        """The contract's projection fusion (``Transformer.fuse_projections``): not done for this family yet,
        every GEMM stays separate (the same bits either way)."""

    def verify_kernels(self) -> None:
        """The aligned CPU kernels' start-up guards for this model's GEMM and attention shapes (as
        ``Transformer.verify_kernels``)."""
        if self.kernels != "aligned" or self.device.type != "cpu":
            return
        verify_weights(m.weight for m in self.modules() if isinstance(m, nn.Linear))
        cfg = self.config
        verify_attention(cfg.num_attention_heads // cfg.num_key_value_heads, cfg.head_dim)

    # ---- the forward contract ---------------------------------------------------------------------------
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        seq_ids: torch.Tensor | None = None,
        kv_cache: CacheView | None = None,
        max_position: int | None = None,
        num_sequences: int | None = None,
        seq_lens: Sequence[int] | None = None,
        states: Sequence[SequenceState] | None = None,
        rope_positions: torch.Tensor | None = None,
        images: object | None = None,
        image_slots: torch.Tensor | None = None,
        text_rope_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final hidden states [T, hidden] (or [B, S, hidden] for a padded [B, S] batch).

        The contract's call (``Transformer.forward``): tokens, positions, seq_ids and, in the engine, a
        ``kv_cache`` view of ``new_kv_cache``'s pages; each sequence's tokens are contiguous in the stream and
        in position order. Without a cache every sequence starts at position 0 (the learner's packed
        forward; its ``packed_inputs`` pass ``seq_lens``, so nothing is read back from the device). With one,
        a sequence continues from its pages (a prefill chunk or a decode token). ``max_position`` and
        ``num_sequences`` are accepted for the contract (the model knows them from ``seq_lens``).

        Standalone calls pass ``seq_lens`` (and ``states``, each sequence's ``SequenceState``, updated in
        place) without positions.
        """
        shape = tokens.shape
        if positions is None:
            batch, tokens = self._standalone_batch(tokens, seq_lens, states)
        else:
            if states is not None:
                raise ValueError("states go with seq_lens and no positions (a standalone call)")
            tokens, positions, seq_ids = flat_stream(tokens, positions, seq_ids)
            batch = self._contract_batch(positions, seq_ids, kv_cache, seq_lens)
        x = self._embed(tokens, shape, batch, rope_positions, images, image_slots, text_rope_positions)
        recompute = self.config.activation_checkpointing and torch.is_grad_enabled() and not batch.keeps_state
        for layer in self.decoder.layers:
            x = checkpoint(layer, x, batch, use_reentrant=False) if recompute else layer(x, batch)
        if states is not None:
            for st, n in zip(states, batch.seq_lens, strict=True):
                st.position += n
        return in_token_shape(self.decoder.norm(x), shape)

    def _embed(self, tokens, shape, batch: _Batch, rope_positions, images, image_slots, text_rope_positions):
        """The stream's input embeddings; sets the rotation rows on ``batch`` (a text model: each token's
        position, or ``text_rope_positions`` in the engine's decode step, equal to them here). A text model
        refuses image inputs (a vision-language one overrides this: model/qwen3_5_vl.py)."""
        if any(v is not None for v in (rope_positions, images, image_slots)):
            raise ValueError(f"{type(self).__name__} takes no rope_positions or image inputs (a text model)")
        if text_rope_positions is not None:
            if text_rope_positions.shape != tokens.shape:
                raise ValueError(f"text_rope_positions must be [{tokens.shape[0]}] (one per token)")
            batch.rope_positions = text_rope_positions
        return self.decoder.embed_tokens(tokens)

    def _standalone_batch(self, tokens, seq_lens, states) -> tuple[_Batch, torch.Tensor]:
        if seq_lens is None:
            raise ValueError("a forward without positions needs seq_lens")
        if tokens.dim() != 1 or sum(seq_lens) != tokens.shape[0]:
            raise ValueError(
                f"tokens {tuple(tokens.shape)} must be [T] with T = sum(seq_lens) = {sum(seq_lens)}"
            )
        if states is not None and len(states) != len(seq_lens):
            raise ValueError(f"{len(states)} states for {len(seq_lens)} sequences")
        starts = [st.position for st in states] if states is not None else [0] * len(seq_lens)
        positions, index = _host_stream(starts, seq_lens)
        dev = tokens.device
        batch = self.batch_type(self, positions.to(dev), index.to(dev), seq_lens, starts, states=states)
        return batch, tokens

    def _contract_batch(self, positions, seq_ids, kv_cache, seq_lens) -> _Batch:
        if kv_cache is not None and not isinstance(kv_cache.cache, self.cache_type):
            raise TypeError(
                f"kv_cache must view a {self.cache_type.__name__} (new_kv_cache), "
                f"got {type(kv_cache.cache).__name__}"
            )
        n_tok = positions.shape[0]
        if kv_cache is not None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            # the recurrent layers index their pages by host positions: a replayed graph would keep the
            # captured ones (the engine's capture failure is logged and decode runs eagerly, same bits)
            raise RuntimeError("a Qwen3.5 cached forward cannot be captured in a CUDA graph yet")
        if kv_cache is not None and kv_cache.decode_positions is not None:
            # a decode step: token i is row i's one token, at decode_positions[i] (no read-back)
            starts = list(kv_cache.decode_positions)
            if len(starts) != n_tok:
                raise ValueError(f"decode step: {n_tok} tokens for {len(starts)} decode positions")
            return self.batch_type(
                self, positions, seq_ids, [1] * n_tok, starts, view=kv_cache, rows=range(n_tok)
            )
        if seq_lens is not None:  # the learner's packed forward: sequences 0.. in order, from position 0
            if kv_cache is not None or sum(seq_lens) != n_tok:
                raise ValueError(f"seq_lens ({sum(seq_lens)} tokens) describe a packed forward of {n_tok}")
            return self.batch_type(self, positions, seq_ids, seq_lens, [0] * len(seq_lens))
        # otherwise the sequences are read from the stream (one read-back)
        rows, starts, lens = _runs(seq_ids.tolist(), positions.tolist())
        if kv_cache is not None:
            return self.batch_type(self, positions, seq_ids, lens, starts, view=kv_cache, rows=rows)
        if any(starts):
            raise ValueError("without a kv_cache every sequence must start at position 0")
        _, index = _host_stream(starts, lens)
        return self.batch_type(self, positions, index.to(positions.device), lens, starts)

    def scored_sequence(self, tokens: list[int], images: list[bytes] | None, loss_mask: list) -> object:
        """What the packer takes for a trajectory: its tokens (a text model: images refused)."""
        if images:
            raise ValueError("trajectories carry images but the model has no vision tower")
        return tokens

    def packed_inputs(self, sequences: Sequence, ids: list[torch.Tensor]) -> dict:
        """The packed forward's extra input: each sequence's length (the linear-attention layers start each
        sequence's state at its first token), known on the host."""
        if any(getattr(s, "pixel_values", None) is not None or getattr(s, "images", None) for s in sequences):
            raise ValueError(f"{type(self).__name__} takes no images (it is a text model)")
        return {"seq_lens": [int(i.numel()) for i in ids]}

    def extra_inputs(self, segments: list[Segment]) -> dict:
        """Transformer.extra_inputs: none (a text model; an engine chunk's start comes with its cache)."""
        return refuse_images(type(self).__name__, segments)

    def image_positions(self, prompt: list[int], grids: torch.Tensor):
        raise ValueError("images need a vision-language model (Qwen3-VL); this model has none")

    def image_row_bytes(self) -> int:
        return 0

    def token_names(self) -> dict[int, str]:
        return {}

    # ---- the engine's cache -----------------------------------------------------------------------------
    def kv_page_bytes(self) -> int:
        """Bytes of one cache page (64 positions, every layer, its share of the state snapshots included)."""
        return hybrid_bytes_per_page(self.config, self.lm_head.weight.dtype, self.snapshot_every)

    def new_kv_cache(self, num_pages: int, device: torch.device | str) -> HybridCache:
        """The engine's paged cache of this model (K/V and recurrent state: model/qwen3_5_cache.py)."""
        return HybridCache(
            self.config, num_pages, dtype=self.lm_head.weight.dtype, device=device,
            snapshot_every=self.snapshot_every,
        )  # fmt: skip

    # ---- weights ----------------------------------------------------------------------------------------
    def get_input_embeddings(self) -> nn.Embedding:
        return self.decoder.embed_tokens

    @property
    def decoder(self) -> nn.Module:
        """The decoder's embedding, layers and final norm."""
        return self.model

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, seed: int | None = None) -> None:
        """Random weights: matrices and conv N(0, std), norms at their identity (zero-centred ones 0, the
        gated one 1), decay A = 1..16 (A_log = log A) and dt_bias 1, as transformers initialises them."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        for name, p in self.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.fill_(1.0)
            elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.zero_()
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(1, 16, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())

    def hf_config(self) -> dict:
        """This model's config.json (`save_hf_checkpoint` writes it, Qwen3_5ForCausalLM reads it)."""
        return {**self.config.to_hf(), "dtype": str(self.lm_head.weight.dtype).removeprefix("torch.")}

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head in the op set's GEMM, as fp32 [T, vocab]."""
        return self.ops_for(hidden.device).linear(hidden, self.lm_head.weight).float()


def _host_stream(starts: Sequence[int], seq_lens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, sequence index) [T] of sequences continuing at ``starts`` with ``seq_lens`` tokens."""
    positions = torch.cat([torch.arange(a, a + n) for a, n in zip(starts, seq_lens, strict=True)] or
                          [torch.zeros(0, dtype=torch.long)])  # fmt: skip
    index = torch.repeat_interleave(
        torch.arange(len(seq_lens)), torch.tensor(list(seq_lens), dtype=torch.long)
    )
    return positions, index


def _runs(seq_ids: list[int], positions: list[int]) -> tuple[list[int], list[int], list[int]]:
    """(row, first position, length) of each sequence of a stream: its tokens must be one contiguous run in
    position order (ValueError otherwise)."""
    rows: list[int] = []
    starts: list[int] = []
    lens: list[int] = []
    for sid, pos in zip(seq_ids, positions, strict=True):
        if rows and rows[-1] == sid:
            if pos != starts[-1] + lens[-1]:
                raise ValueError(
                    f"sequence {sid}: position {pos} does not follow {starts[-1] + lens[-1] - 1}"
                )
            lens[-1] += 1
            continue
        if sid in rows:
            raise ValueError(f"sequence {sid}'s tokens are not contiguous in the stream")
        rows.append(sid)
        starts.append(pos)
        lens.append(1)
    return rows, starts, lens


def load_qwen3_5(
    ckpt_dir: str | os.PathLike, kernels: str = "aligned", dtype: torch.dtype | None = None
) -> Qwen35ForCausalLM:
    """A Qwen3.5 text model from a transformers checkpoint directory (config.json + safetensors), every
    tensor by name; a missing or unexpected tensor is an error naming it (multi-token-prediction `mtp.*`
    tensors and a vision-language checkpoint's `model.visual.*` are skipped, as transformers skips them)."""
    from rz_agents.model.safetensors_dir import load_state

    config = Qwen35Config.from_checkpoint(ckpt_dir)
    if dtype is not None:
        config.dtype = str(dtype).removeprefix("torch.")
    with torch.device("meta"):
        model = Qwen35ForCausalLM(config, kernels)
    state = {}
    for name, tensor in load_state(ckpt_dir).items():
        if name.startswith(("mtp.", "model.visual.")):
            continue
        state[name.replace("model.language_model.", "model.", 1)] = tensor
    if config.tie_word_embeddings:
        state.setdefault("lm_head.weight", state.get("model.embed_tokens.weight"))
    expected = dict(model.named_parameters(remove_duplicate=False))
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{ckpt_dir}: checkpoint does not match the model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    model.load_state_dict(
        {k: (v.to(dtype) if dtype is not None else v) for k, v in state.items()}, strict=True, assign=True
    )
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.rope = RopeTable(config.rotary_dim, config.rope_theta, config.max_position_embeddings)
    return model
