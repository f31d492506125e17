"""Multi-head latent attention (MLA, DeepSeek-V2/V3) on the op set, with HF DeepseekV3's parameter names.

Queries come from a low-rank projection (q_a_proj -> RMSNorm -> q_b_proj; or one q_proj without a q rank),
keys and values from a shared compressed latent (the first kv_lora_rank columns of kv_a_proj_with_mqa, RMS-
normed, expanded per head by kv_b_proj) plus one rotary key part shared by all heads (the last
qk_rope_head_dim columns). Each head's q/k are [no-RoPE part | RoPE part]; DeepSeek checkpoints store the
RoPE part's pairs interleaved, which a fixed column permutation turns into the rotate-half layout RoPE runs
on.

What the paged cache holds: the *expanded* K and V per head, at `config.head_dim` (mla_head_dim: the q/k
head dim and the value head dim padded with zeros to one power of two). That reuses the aligned attention
kernels of both op sets unchanged (the same fixed key blocks, the same page layout, the same plan for
prefill, chunked prefill, decode and the training forward), so engine and trainer agree bit for bit by the
same argument as for the other families; zero padding changes no value (q.k gains 0*0 terms, the padded V
columns come out as exact zeros and are dropped). The price is memory: per token and layer 2 x heads x
head_dim values instead of the latent's kv_lora_rank + qk_rope_head_dim (DeepSeek-V3: 65,536 vs 576), so
this serves small and mid-size MLA models; a latent cache needs an attention kernel that expands (or absorbs
kv_b_proj into) the latent per key block, which neither op set has yet.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from rz_agents.model.config import ModelConfig
from rz_agents.model.layers import RMSNorm, _linear
from rz_agents.model.rope_scaling import softmax_scale_factor

# HF builds the low-rank norms with their default eps (not rms_norm_eps).
LATENT_NORM_EPS = 1e-6


class LatentAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        heads, hidden = cfg.num_attention_heads, cfg.hidden_size
        self.num_heads = heads
        self.nope, self.rope_dim, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.qk_dim = self.nope + self.rope_dim
        self.head_dim = cfg.head_dim  # the padded attention / cache head dim
        self.kv_rank = cfg.kv_lora_rank
        if cfg.q_lora_rank is None:
            self.q_proj = _linear(hidden, heads * self.qk_dim)
        else:
            self.q_a_proj = _linear(hidden, cfg.q_lora_rank, cfg.attention_bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = _linear(cfg.q_lora_rank, heads * self.qk_dim)
        self.low_rank_q = cfg.q_lora_rank is not None
        self.kv_a_proj_with_mqa = _linear(hidden, self.kv_rank + self.rope_dim, cfg.attention_bias)
        self.kv_a_layernorm = RMSNorm(self.kv_rank, LATENT_NORM_EPS)
        self.kv_b_proj = _linear(self.kv_rank, heads * (self.nope + self.v_dim))
        self.o_proj = _linear(heads * self.v_dim, hidden, cfg.attention_bias)
        self.scale = softmax_scale_factor(cfg) / math.sqrt(self.qk_dim)
        # interleaved pairs (x0, x1), (x2, x3), ... -> [x0, x2, ... | x1, x3, ...] (rotate-half layout)
        r = self.rope_dim
        # (a plain CPU tensor, not a buffer: real even when the model is built on the meta device)
        cpu = torch.device("cpu")
        evens, odds = torch.arange(0, r, 2, device=cpu), torch.arange(1, r, 2, device=cpu)
        self.rope_perm = torch.cat([evens, odds]) if cfg.rope_interleave else None
        self._perm_on: dict[torch.device, torch.Tensor] = {}

    def _queries(self, x: torch.Tensor, ops) -> torch.Tensor:
        if not self.low_rank_q:
            return ops.linear(x, self.q_proj.weight, self.q_proj.bias)
        q_a = ops.linear(x, self.q_a_proj.weight, self.q_a_proj.bias)
        return ops.linear(self.q_a_layernorm(q_a, ops), self.q_b_proj.weight)

    def _rotate(self, x: torch.Tensor, ctx) -> torch.Tensor:
        if self.rope_perm is not None:
            perm = self._perm_on.get(x.device)
            if perm is None:  # copied to a device once (no host-device copy per layer call)
                perm = self._perm_on[x.device] = self.rope_perm.to(x.device)
            x = x[..., perm]
        return ctx.ops.rope(ctx.rope, x.contiguous(), ctx.rope_positions)

    def forward(self, x: torch.Tensor, ctx, layer: int) -> torch.Tensor:
        ops = ctx.ops
        t, heads = x.shape[0], self.num_heads
        q = self._queries(x, ops).view(t, heads, self.qk_dim)
        kv_a = ops.linear(x, self.kv_a_proj_with_mqa.weight, self.kv_a_proj_with_mqa.bias)
        latent = self.kv_a_layernorm(kv_a[:, : self.kv_rank].contiguous(), ops)
        k_rot = self._rotate(kv_a[:, self.kv_rank :].reshape(t, 1, self.rope_dim), ctx)
        q_rot = self._rotate(q[..., self.nope :], ctx)
        kv = ops.linear(latent, self.kv_b_proj.weight).view(t, heads, self.nope + self.v_dim)
        pad = self.head_dim - self.qk_dim
        zeros = x.new_zeros(t, heads, pad)
        q = torch.cat([q[..., : self.nope], q_rot, zeros], dim=-1)
        k = torch.cat([kv[..., : self.nope], k_rot.expand(t, heads, self.rope_dim), zeros], dim=-1)
        v = F.pad(kv[..., self.nope :], (0, self.head_dim - self.v_dim))
        k_buf, v_buf = ctx.store(layer, k, v)
        out = ops.attention(q, k_buf, v_buf, ctx.attention_plan, self.scale)
        out = out[..., : self.v_dim].reshape(t, heads * self.v_dim)
        return ops.linear(out, self.o_proj.weight, self.o_proj.bias)
