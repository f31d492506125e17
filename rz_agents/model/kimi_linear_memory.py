"""What a Kimi Linear model (model/kimi_linear.py) holds, for the memory estimate
(runtime/memory_estimate.py), in the shape model/qwen3_5_memory.py gives Qwen3.5's: the learner's activations
per decoder layer, the engine's cache terms per page (model/kimi_linear_cache.py) and the recurrent state a
step holds per running sequence. Estimates of what autograd and the forward keep, sized from the config alone
(no weights)."""

from __future__ import annotations

import math
from functools import partial

import torch

from rz_agents.model.kimi_linear_cache import kimi_page_terms, kimi_sequence_state_bytes
from rz_agents.model.kimi_linear_config import KimiLinearConfig
from rz_agents.model.kv_cache import PAGE_SIZE
from rz_agents.model.qwen3_5_cache import SNAPSHOT_EVERY
from rz_agents.model.qwen3_5_memory import paged_cache_terms

F32 = 4  # bytes of the fp32 tensors KDA computes in (l2-normed q/k, decay, beta, the chunk matrices)


def _mla_bytes(c: KimiLinearConfig, tokens: int, e: int) -> int:
    """An MLA layer's (NoPE: no rotary copies): two norms' inputs/outputs, q, the latent and its norm, the
    expanded per-head no-RoPE keys and values, K/V padded to the cache head dim, the attention output."""
    heads, h = c.num_attention_heads, c.hidden_size
    q = heads * (c.qk_nope_head_dim + c.qk_rope_head_dim)
    latent = c.kv_lora_rank + c.qk_rope_head_dim
    expanded = heads * (c.qk_nope_head_dim + c.v_head_dim)
    padded = 2 * heads * c.head_dim
    return tokens * e * (4 * h + q + 2 * latent + expanded + 2 * padded + heads * c.v_head_dim) + (
        tokens * heads * F32
    )


def _kda_bytes(c: KimiLinearConfig, tokens: int, e: int) -> int:
    """A KDA layer's: two norms' inputs/outputs, the q/k/v projections and their conv output, the decay's and
    the output gate's low-rank inner rows and outer outputs, the core output and its gated norm; in fp32 the
    l2-normed q and k, v, the per-channel decay g, beta, the chunked rule's [64, 64] chunk matrices per head,
    and the state entering each 64-token chunk."""
    h, heads, d, dim = c.hidden_size, c.linear_num_heads, c.linear_head_dim, c.linear_dim
    per_token = e * (4 * h + 2 * c.conv_dim + 2 * d + 2 * dim + 2 * dim)
    per_token += F32 * (4 * dim + heads + 3 * heads * PAGE_SIZE)
    return tokens * per_token + math.ceil(tokens / PAGE_SIZE) * heads * d * d * F32


def _mlp_bytes(c: KimiLinearConfig, tokens: int, e: int, kind: str) -> int:
    """A dense MLP's, or the routed experts' rows (top k per token), their fp32 combine and router, and the
    shared experts'."""
    h = c.hidden_size
    if kind == "dense":
        return tokens * e * (h + 3 * c.intermediate_size)
    rows = tokens * c.num_experts_per_tok
    mlp = rows * e * (h + 3 * c.moe_intermediate_size) + rows * h * F32 + tokens * c.num_experts * F32
    return mlp + tokens * e * 3 * c.n_shared_experts * c.moe_intermediate_size


def layer_activation_bytes(c: KimiLinearConfig, tokens: int) -> list[int]:
    """What each decoder layer's autograd graph keeps for ``tokens`` tokens (its mixer and its MLP)."""
    e = torch.empty(0, dtype=c.torch_dtype).element_size()
    mixer = {"full_attention": _mla_bytes, "linear_attention": _kda_bytes}
    return [
        mixer[kind](c, tokens, e) + _mlp_bytes(c, tokens, e, mlp)
        for kind, mlp in zip(c.layer_types, c.mlp_layer_types, strict=True)
    ]


def engine_step_width(c: KimiLinearConfig) -> int:
    """The widest per-token row a forward step computes beside the hidden state (an MLP, the routed and shared
    experts' rows, a KDA layer's projections and gates, or MLA's expanded keys and values)."""
    moe = (c.num_experts_per_tok + c.n_shared_experts) * c.moe_intermediate_size
    mla = c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim + 2 * c.head_dim)
    return max(c.intermediate_size, moe, 2 * c.conv_dim + 2 * c.linear_dim, mla)


def page_bytes(c: KimiLinearConfig, dtype: torch.dtype) -> int:
    """Bytes of one engine cache page (every kind, every layer)."""
    return sum(kimi_page_terms(c, dtype).values())


def engine_cache_terms(c: KimiLinearConfig, pages: int, running: int, dtype: torch.dtype) -> dict[str, int]:
    """The engine's: ``pages`` cache pages split by kind (the MLA layers' K/V, the KDA layers' per-position
    recurrent inputs, the state snapshot slots: one per SNAPSHOT_EVERY pages) and the live recurrent state
    of ``running`` sequences in one layer of a step."""
    return paged_cache_terms(
        partial(kimi_page_terms, c, dtype), pages, running, kimi_sequence_state_bytes(c, dtype)
    )


def cache_note(c: KimiLinearConfig, dtype: torch.dtype) -> str:
    """One line: what a page holds and a sequence's state costs (for the estimate's notes)."""
    page = kimi_page_terms(c, dtype)
    linear = c.layer_types.count("linear_attention")
    mib = 2**20
    live = linear * kimi_sequence_state_bytes(c, dtype) / mib
    slot = kimi_page_terms(c, dtype, snapshot_every=1)["state_snapshots"]
    return (
        f"hybrid cache page ({PAGE_SIZE} positions, {c.num_hidden_layers - linear} MLA + {linear} KDA "
        f"layers): K/V {page['kv'] / mib:.1f} MiB (expanded per head), recurrent inputs "
        f"{page['recurrent_inputs'] / mib:.1f} MiB, KDA state snapshots {page['state_snapshots'] / mib:.1f} "
        f"MiB (one slot of {slot / mib:.0f} MiB per {SNAPSHOT_EVERY} pages); a running sequence's live "
        f"state {live:.1f} MiB over all layers (one layer's at a time in a step)"
    )
