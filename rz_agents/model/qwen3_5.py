"""The Qwen3.5 text decoder (hybrid linear attention) on rz's op set: a packed forward and HF checkpoint load.

Three of every four layers are Gated DeltaNet (linear attention: a short causal conv over q/k/v, the gated
delta rule, a gated RMSNorm); the rest are full attention with an output gate, q/k norms and partial RoPE
(only the first `rotary_dim` dimensions of a head rotate). All norms but the gated one are zero-centred
(scale 1 + weight). Parameter names are transformers' (`Qwen3_5ForCausalLM`), so a checkpoint it writes
loads by name.

With `kernels="aligned"` every op is batch-invariant: linears and full attention are the aligned op set's,
the delta rule runs on one chunk grid anchored at each sequence's start (rz_kernels.delta_rule), the conv and
norms are per token / per row. This file is standalone for now: the engine integration (recurrent state
beside the paged K/V) comes through the policy contract.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from rz_agents.model.qwen3_5_config import Qwen35Config
from rz_kernels import OpSet, RopeTable, get_ops
from rz_kernels.attention import KEY_BLOCK
from rz_kernels.delta_rule import l2_normalize
from rz_kernels.elementwise import aligned_unary
from rz_kernels.gated_norm import zero_centered_rms_norm


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
    """One sequence's cache between forwards (standalone, until the engine's per-layer caches take it):
    per layer, the conv window and delta-rule cache (Gated DeltaNet) or the keys and values (attention)."""

    position: int = 0  # tokens seen so far
    layers: dict[int, tuple] = field(default_factory=dict)


class _Batch:
    """What every layer of one forward shares: op set, sequences, positions, attention plan, caches."""

    def __init__(
        self,
        model: Qwen35ForCausalLM,
        seq_lens: Sequence[int],
        states: Sequence[SequenceState] | None,
        device: torch.device,
    ) -> None:
        cfg = model.config
        self.ops: OpSet = model.ops
        self.seq_lens = list(seq_lens)
        self.states = list(states) if states is not None else None
        starts = [st.position for st in self.states] if self.states is not None else [0] * len(self.seq_lens)
        self.starts = starts
        self.positions = torch.cat(
            [torch.arange(a, a + n, device=device) for a, n in zip(starts, self.seq_lens, strict=True)]
        )
        self.seq_ids = torch.repeat_interleave(
            torch.arange(len(self.seq_lens), device=device), torch.tensor(self.seq_lens, device=device)
        )
        top = max((a + n for a, n in zip(starts, self.seq_lens, strict=True)), default=1) - 1
        self.buf_shape = (len(self.seq_lens), cfg.num_key_value_heads, -(-(top + 1) // KEY_BLOCK) * KEY_BLOCK)
        model.rope.check_top(top)
        self.rope = model.rope
        self.plan = self.ops.plan_attention(
            self.seq_ids, self.positions, cfg.num_attention_heads, cfg.num_key_value_heads, max_position=top
        )

    def cached(self, layer: int) -> list[tuple | None]:
        """Each sequence's cache of `layer` (None: nothing cached, or no states in this forward)."""
        if self.states is None:
            return [None] * len(self.seq_lens)
        return [st.layers.get(layer) for st in self.states]

    def keep(self, layer: int, values: Sequence[tuple]) -> None:
        if self.states is not None:
            for st, value in zip(self.states, values, strict=True):
                st.layers[layer] = value


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
        return torch.cat([batch.ops.rope(batch.rope, x[..., :r], batch.positions), x[..., r:]], dim=-1)

    def forward(self, x: torch.Tensor, batch: _Batch) -> torch.Tensor:
        ops, t, d = batch.ops, x.shape[0], self.head_dim
        qg = ops.linear(x, self.q_proj.weight, self.q_proj.bias).view(t, self.num_heads, 2 * d)
        q, gate = qg[..., :d], qg[..., d:].reshape(t, -1)
        k = ops.linear(x, self.k_proj.weight, self.k_proj.bias).view(t, self.num_kv_heads, d)
        v = ops.linear(x, self.v_proj.weight, self.v_proj.bias).view(t, self.num_kv_heads, d)
        q = self._rotate(self.q_norm(q), batch)
        k = self._rotate(self.k_norm(k), batch)
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
        out = ops.attention(q, k_buf, v_buf, batch.plan, 1.0 / math.sqrt(d)).reshape(t, -1)
        out = out * aligned_unary(torch.sigmoid, gate)
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

    def forward(self, x: torch.Tensor, batch: _Batch) -> torch.Tensor:
        ops, t = batch.ops, x.shape[0]
        cached = batch.cached(self.index)
        keep = batch.states is not None
        mixed, windows = ops.causal_conv1d(
            ops.linear(x, self.in_proj_qkv.weight),
            self.conv1d.weight,
            batch.seq_lens,
            [c[0] if c else None for c in cached],
            keep_windows=keep,
        )
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k = q.reshape(t, self.hk, self.dk), k.reshape(t, self.hk, self.dk)
        v = v.reshape(t, self.hv, self.dv)
        z = ops.linear(x, self.in_proj_z.weight).reshape(t * self.hv, self.dv)
        beta = aligned_unary(torch.sigmoid, ops.linear(x, self.in_proj_b.weight))
        a = ops.linear(x, self.in_proj_a.weight).float() + self.dt_bias
        # g = -exp(A_log) * softplus(a + dt_bias): the per-token log decay, in fp32 as the reference
        g = -aligned_unary(torch.exp, self.A_log.float()) * aligned_unary(F.softplus, a)
        if self.hv != self.hk:
            q = q.repeat_interleave(self.hv // self.hk, dim=1)
            k = k.repeat_interleave(self.hv // self.hk, dim=1)
        q, k = l2_normalize(q), l2_normalize(k)
        core, caches = ops.delta_rule(
            q, k, v, g, beta, batch.seq_lens, [c[1] if c else None for c in cached], keep_caches=keep
        )
        if keep:
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
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
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
    """Qwen3.5 causal LM over packed sequences: `forward` gives final hidden states, `logits` the LM head."""

    def __init__(self, config: Qwen35Config, kernels: str = "aligned") -> None:
        super().__init__()
        self.config = config
        self.model = _Stack(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.kernels = kernels
        self.rope = RopeTable(config.rotary_dim, config.rope_theta, config.max_position_embeddings)

    @property
    def ops(self) -> OpSet:
        return get_ops(self.kernels, self.lm_head.weight.device)

    def forward(
        self, tokens: torch.Tensor, seq_lens: Sequence[int], states: Sequence[SequenceState] | None = None
    ) -> torch.Tensor:
        """Final hidden states [T, hidden] of packed sequences: tokens [T] holds `seq_lens[0]` tokens of
        sequence 0, then sequence 1's, and so on. Without `states` every sequence starts at position 0 (the
        learner's packed forward); with them, sequence i continues `states[i]` (a prefill chunk or a decode
        token), and the states are updated in place."""
        if tokens.dim() != 1 or sum(seq_lens) != tokens.shape[0]:
            raise ValueError(
                f"tokens {tuple(tokens.shape)} must be [T] with T = sum(seq_lens) = {sum(seq_lens)}"
            )
        if states is not None and len(states) != len(seq_lens):
            raise ValueError(f"{len(states)} states for {len(seq_lens)} sequences")
        batch = _Batch(self, seq_lens, states, tokens.device)
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x, batch)
        if states is not None:
            for st, n in zip(states, seq_lens, strict=True):
                st.position += n
        return self.model.norm(x)

    def hf_config(self) -> dict:
        """This model's config.json (`save_hf_checkpoint` writes it, Qwen3_5ForCausalLM reads it)."""
        return {**self.config.to_hf(), "dtype": str(self.lm_head.weight.dtype).removeprefix("torch.")}

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head in the op set's GEMM, as fp32 [T, vocab]."""
        return self.ops.linear(hidden, self.lm_head.weight).float()


def load_qwen3_5(
    ckpt_dir: str | os.PathLike, kernels: str = "aligned", dtype: torch.dtype | None = None
) -> Qwen35ForCausalLM:
    """A Qwen3.5 text model from a transformers checkpoint directory (config.json + safetensors), every
    tensor by name; a missing or unexpected tensor is an error naming it (multi-token-prediction `mtp.*`
    tensors and a vision-language checkpoint's `model.visual.*` are skipped, as transformers skips them)."""
    from rz_agents.model.checkpoint import load_state

    config = Qwen35Config.from_checkpoint(ckpt_dir)
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
