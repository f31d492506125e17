"""Kimi Linear (Moonshot) on rz's op set: Kimi Delta Attention (KDA) layers, NoPE MLA full-attention layers
and a DeepSeek-style MoE; a packed forward and HF checkpoint load.

A KDA layer is Gated DeltaNet with a per-channel decay: separate q/k/v projections each through a short
causal conv (+ SiLU), l2-normalized q and k, a decay per head and key channel (g = -exp(A_log) *
softplus(f_b(f_a(x)) + dt_bias)), beta = sigmoid(b_proj(x)), the delta rule, and an output RMSNorm gated by
sigmoid(g_b(g_a(x))). It runs on the aligned delta rule's fixed chunk grid (rz_kernels.delta_rule with g
[T, H, dk]), so a token gets the same bits in the learner's packed forward, a prefill cut anywhere and a
decode step. The MLA layers are rz's (model/mla.py) with no rotary embedding (Kimi Linear's MLA is NoPE);
the MoE is rz's DeepSeek MoE (sigmoid routing with a correction bias, shared experts) with Moonshot's
expert names (w1 gate, w3 up, w2 down).

Parameter names are the on-disk ones transformers writes for `KimiLinearForCausalLM` (its conversion
mapping's source side: `self_attn.{q,k,v}_conv1d`, `self_attn.A_log`, `block_sparse_moe.experts.N.w1`, ...),
so a checkpoint loads by name and saves back to the same file. The per-sequence machinery (packed,
standalone and engine-paged forwards) is the hybrid one of Qwen3.5 (model/qwen3_5.py); the engine's cache is
this model's own kind (model/kimi_linear_cache.py).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from rz_agents.model.deepseek_moe import DeepseekMoE
from rz_agents.model.kimi_linear_cache import KimiLinearCache, kimi_bytes_per_page
from rz_agents.model.kimi_linear_config import KimiLinearConfig
from rz_agents.model.layers import MLP, RMSNorm
from rz_agents.model.mla import LatentAttention
from rz_agents.model.qwen3_5 import Qwen35ForCausalLM, _Batch
from rz_kernels import get_ops
from rz_kernels.attention import verify_attention
from rz_kernels.delta_rule import l2_normalize
from rz_kernels.elementwise import aligned_unary
from rz_kernels.gemm import verify_weights


def sigmoid_gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """`weight * rms_norm(x) * sigmoid(gate)` all in fp32, cast back to x's dtype once (the rounding steps
    of transformers' `KimiLinearRMSNormGated`). Per row / per element: a row's bits never depend on the
    other rows of the call."""
    h = x.float()
    h = h * aligned_unary(torch.rsqrt, h.pow(2).mean(-1, keepdim=True) + eps)
    h = weight.float() * h
    return (h * aligned_unary(torch.sigmoid, gate.float())).to(x.dtype)


class _PositionLimit:
    """What the hybrid batch asks of a rotary table when the model has none (NoPE): the position bound."""

    def __init__(self, max_positions: int) -> None:
        self.max_positions = max_positions

    def check_top(self, top: int | None) -> None:
        if top is not None and top >= self.max_positions:
            raise ValueError(f"position {top} exceeds max_position_embeddings {self.max_positions}")


class _KimiBatch(_Batch):
    """The hybrid batch plus what rz's MLA and MoE read from a forward's context: `store` (this call's K/V
    into the engine's pages or a packed buffer), the attention plan, and no fused projections."""

    fused = False

    @property
    def attention_plan(self):
        return self.plan

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.view is not None:  # the engine's pages: write this call's K/V, attend through the table
            cache = self.view.cache
            k_buf, v_buf = cache.k[layer], cache.v[layer]
            with torch.no_grad():
                k_buf[self.write_page, :, self.write_offset] = k.detach()
                v_buf[self.write_page, :, self.write_offset] = v.detach()
            return k_buf, v_buf
        shape = (*self.buf_shape, k.shape[-1])
        k_buf = torch.zeros(shape, dtype=k.dtype, device=k.device)
        v_buf = torch.zeros(shape, dtype=v.dtype, device=v.device)
        k_buf[self.seq_ids, :, self.positions] = k
        v_buf[self.seq_ids, :, self.positions] = v
        if self.states is not None:  # earlier positions from each sequence's cache; then keep the new ones
            kept = []
            for s, (old, n) in enumerate(zip(self.cached(layer), self.seq_lens, strict=True)):
                if old is not None:
                    k_buf[s, :, : old[0].shape[1]], v_buf[s, :, : old[1].shape[1]] = old
                a = self.starts[s]
                kept.append((k_buf[s, :, : a + n].detach().clone(), v_buf[s, :, : a + n].detach().clone()))
            self.keep(layer, kept)
        return k_buf, v_buf


class NoPELatentAttention(LatentAttention):
    """rz's MLA with no rotary embedding: Kimi Linear's MLA layers carry position through the KDA layers."""

    def _rotate(self, x: torch.Tensor, ctx) -> torch.Tensor:
        return x

    def forward(self, x: torch.Tensor, batch: _KimiBatch) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x, batch, self.index)


class KimiDeltaAttention(nn.Module):
    """KDA (see the module docstring), with the on-disk parameter names."""

    def __init__(self, cfg: KimiLinearConfig) -> None:
        super().__init__()
        self.h, self.d = cfg.linear_num_heads, cfg.linear_head_dim
        dim, hidden, kernel = cfg.linear_dim, cfg.hidden_size, cfg.linear_conv_kernel_dim
        self.eps = cfg.rms_norm_eps
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(hidden, dim, bias=False) for _ in range(3))
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (
            nn.Conv1d(dim, dim, kernel, groups=dim, bias=False, padding=kernel - 1) for _ in range(3)
        )
        self.A_log = nn.Parameter(torch.zeros(1, 1, self.h, 1))
        self.dt_bias = nn.Parameter(torch.zeros(dim))
        self.f_a_proj = nn.Linear(hidden, self.d, bias=False)
        self.f_b_proj = nn.Linear(self.d, dim, bias=False)
        self.b_proj = nn.Linear(hidden, self.h, bias=False)
        self.g_a_proj = nn.Linear(hidden, self.d, bias=False)
        self.g_b_proj = nn.Linear(self.d, dim, bias=False)
        self.o_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.o_proj = nn.Linear(dim, hidden, bias=False)

    def _conv_weight(self) -> torch.Tensor:
        """The three depthwise convs as one [3 * dim, K] weight (a per-channel op: concatenating is exact)."""
        return torch.cat([c.weight for c in (self.q_conv1d, self.k_conv1d, self.v_conv1d)])

    def _heads(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (l2-normalized in fp32, as the reference kernel does) and v, each [T, H, d], of the convs'
        output."""
        t = mixed.shape[0]
        q, k, v = (x.reshape(t, self.h, self.d) for x in mixed.split(self.h * self.d, dim=-1))
        return l2_normalize(q.float()), l2_normalize(k.float()), v

    def _decay(self, x: torch.Tensor, ops) -> torch.Tensor:
        """The per-channel log decay g [T, H, d] = -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias), fp32."""
        f = ops.linear(ops.linear(x, self.f_a_proj.weight), self.f_b_proj.weight).float()
        f = (f + self.dt_bias.float()).view(x.shape[0], self.h, self.d)
        rate = aligned_unary(torch.exp, self.A_log.float().view(self.h, 1))
        # softplus as the reference writes it, log(1 + exp(f)) (not log1p): its rounding is the definition
        soft = torch.where(f > 20.0, f, aligned_unary(torch.log, 1.0 + aligned_unary(torch.exp, f)))
        return -rate * soft

    def forward(self, x: torch.Tensor, batch: _KimiBatch) -> torch.Tensor:
        ops, t = batch.ops, x.shape[0]
        weight = self._conv_weight()

        def pending_kv(conv_in, lens, windows):  # a paged cache's pending chunk tokens, recomputed
            mixed, _ = ops.causal_conv1d(conv_in, weight, lens, windows)
            return self._heads(mixed)[1:]

        windows, entering = batch.recurrent_inputs(self.index, weight.shape[-1], pending_kv)
        keep = batch.keeps_state
        proj = torch.cat([ops.linear(x, p.weight) for p in (self.q_proj, self.k_proj, self.v_proj)], -1)
        mixed, windows = ops.causal_conv1d(
            proj, weight, batch.seq_lens, windows, keep_windows=batch.states is not None
        )
        q, k, v = self._heads(mixed)
        g = self._decay(x, ops)
        beta = aligned_unary(torch.sigmoid, ops.linear(x, self.b_proj.weight))
        # (the paged cache rebuilds its DeltaRuleCaches from pages every call: no rows kept for the row path)
        core, caches = ops.delta_rule(
            q, k, v, g, beta, batch.seq_lens, entering, keep_caches=keep, keep_rows=batch.view is None
        )
        if batch.view is not None:
            batch.write_recurrent(self.index, proj, (g, beta), caches)
        elif keep:
            batch.keep(self.index, list(zip(windows, caches, strict=True)))
        gate = ops.linear(ops.linear(x, self.g_a_proj.weight), self.g_b_proj.weight)
        core = core.to(x.dtype).reshape(t * self.h, self.d)
        out = sigmoid_gated_rms_norm(core, gate.reshape(t * self.h, self.d), self.o_norm.weight, self.eps)
        return ops.linear(out.reshape(t, self.h * self.d), self.o_proj.weight)


class KimiExpert(nn.Module):
    """One routed expert with Moonshot's names (w1 gate, w3 up, w2 down); `gate_proj`/`up_proj`/`down_proj`
    name the same linears for the shared MoE code."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, intermediate, bias=False)
        self.w2 = nn.Linear(intermediate, hidden, bias=False)
        self.w3 = nn.Linear(hidden, intermediate, bias=False)

    gate_proj = property(lambda self: self.w1)
    up_proj = property(lambda self: self.w3)
    down_proj = property(lambda self: self.w2)

    def run(self, x: torch.Tensor, ops, fused: bool = False) -> torch.Tensor:
        h = ops.silu_mul(ops.linear(x, self.w1.weight), ops.linear(x, self.w3.weight))
        return ops.linear(h, self.w2.weight)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: KimiLinearConfig, index: int) -> None:
        super().__init__()
        self.kind = cfg.layer_types[index]
        self.self_attn = (
            KimiDeltaAttention(cfg) if self.kind == "linear_attention" else NoPELatentAttention(cfg)
        )
        self.self_attn.index = index
        if cfg.mlp_layer_types[index] == "dense":
            self.block_sparse_moe = MLP(cfg.hidden_size, cfg.intermediate_size)
        else:
            self.block_sparse_moe = DeepseekMoE(cfg, expert=KimiExpert)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, batch: _KimiBatch) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x, batch.ops), batch)
        return x + self.block_sparse_moe(self.post_attention_layernorm(x, batch.ops), batch)


class _Stack(nn.Module):
    def __init__(self, cfg: KimiLinearConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class KimiLinearForCausalLM(Qwen35ForCausalLM):
    """Kimi Linear causal LM on the forward contract (model/transformer.py): the hybrid forward of
    Qwen3.5's class (packed, standalone and paged calls) over this family's layers, and its own engine
    cache (``new_kv_cache``: MLA K/V pages plus the KDA layers' recurrent state)."""

    batch_type = _KimiBatch
    cache_type = KimiLinearCache

    def __init__(self, config: KimiLinearConfig, kernels: str = "aligned") -> None:
        nn.Module.__init__(self)
        get_ops(kernels)  # reject an unknown name now
        self.config = config
        self.model = _Stack(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.kernels = kernels
        self.rope = _PositionLimit(config.max_position_embeddings)
        self.to(config.torch_dtype)

    def verify_kernels(self) -> None:
        """The aligned CPU kernels' start-up guards for this model's GEMM and attention shapes."""
        if self.kernels != "aligned" or self.device.type != "cpu":
            return
        verify_weights(m.weight for m in self.modules() if isinstance(m, nn.Linear))
        verify_attention(1, self.config.head_dim)

    def kv_page_bytes(self) -> int:
        """Bytes of one cache page (64 positions, every layer, recurrent state included)."""
        return kimi_bytes_per_page(self.config, self.lm_head.weight.dtype, self.snapshot_every)

    def new_kv_cache(self, num_pages: int, device: torch.device | str) -> KimiLinearCache:
        """The engine's paged cache of this model (model/kimi_linear_cache.py)."""
        return KimiLinearCache(
            self.config, num_pages, dtype=self.lm_head.weight.dtype, device=device,
            snapshot_every=self.snapshot_every,
        )  # fmt: skip

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, seed: int | None = None) -> None:
        """Random weights: matrices and convs N(0, std), norms 1, router correction bias 0, decay
        A = 1..16 (A_log = log A) and dt_bias 0."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(1, 16, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)
        for name, b in self.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.zero_()

    def hf_config(self) -> dict:
        """This model's config.json (`save_hf_checkpoint` writes it, KimiLinearForCausalLM reads it)."""
        return {**self.config.to_hf(), "dtype": str(self.lm_head.weight.dtype).removeprefix("torch.")}


def load_kimi_linear(
    ckpt_dir: str | os.PathLike, kernels: str = "aligned", dtype: torch.dtype | None = None
) -> KimiLinearForCausalLM:
    """A Kimi Linear model from a checkpoint directory (config.json + safetensors), every tensor by name (a
    dense layer's MLP may be stored as `mlp.` or, as transformers writes it, `block_sparse_moe.`), cast to
    the model's dtype (the router's correction bias stays fp32); a missing, unexpected or misshapen tensor
    is an error naming it."""
    from rz_agents.model.safetensors_dir import copy_by_name, load_state

    config = KimiLinearConfig.from_checkpoint(ckpt_dir)
    if dtype is not None:
        config.dtype = str(dtype).removeprefix("torch.")
    with torch.device("meta"):
        model = KimiLinearForCausalLM(config, kernels)
    model.to_empty(device="cpu")
    state = {name.replace(".mlp.", ".block_sparse_moe.", 1): t for name, t in load_state(ckpt_dir).items()}
    expected = set(model.state_dict())
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight  # (to_empty gave each its own tensor)
        state.pop("lm_head.weight", None)
        expected.discard("lm_head.weight")
    copy_by_name(model.state_dict(keep_vars=True), state, expected, ckpt_dir, config.model_type)
    return model
