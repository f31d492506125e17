"""What a Qwen3.5 model (model/qwen3_5.py) holds, for the memory estimate (runtime/memory_estimate.py): the
learner's activations per decoder layer, the engine's cache terms per page (model/qwen3_5_cache.py) and the
recurrent state a step holds per running sequence. Estimates of what autograd and the forward keep, sized
from the config alone (no weights)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch

from rz_agents.model.kv_cache import PAGE_SIZE
from rz_agents.model.qwen3_5_cache import (
    SNAPSHOT_EVERY,
    hybrid_bytes_per_page,
    hybrid_page_terms,
    sequence_state_bytes,
    snapshot_slots,
)
from rz_agents.model.qwen3_5_config import Qwen35Config

F32 = 4  # bytes of the fp32 tensors the delta rule and the decay gates compute in


def _full_attention_bytes(c: Qwen35Config, tokens: int, e: int) -> int:
    """A gated full-attention layer's: two norms' inputs/outputs, q (with its output gate, doubled), k, v,
    their normed and rotated copies, the K/V buffers, the attention output and the gated one."""
    h, q, kv = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    return tokens * e * (4 * h + 2 * q + 3 * q + 5 * kv + 3 * q) + tokens * c.num_attention_heads * F32


def _gated_deltanet_bytes(c: Qwen35Config, tokens: int, e: int) -> int:
    """A Gated DeltaNet layer's: two norms' inputs/outputs, the q/k/v projection and its conv output, q and k
    repeated to the value heads and l2-normalized, z, the gated norm's input and output; in fp32 the decay
    g, beta, the chunked delta rule's per-token q/k/v and its [64, 64] chunk matrices per head, and the state
    entering each 64-token chunk."""
    h, hv, dk, dv = c.hidden_size, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    per_token = e * (4 * h + 2 * c.conv_dim + 4 * hv * dk + 4 * c.value_dim)
    per_token += F32 * (3 * hv + 2 * hv * dk + hv * dv + 3 * hv * PAGE_SIZE)
    return tokens * per_token + math.ceil(tokens / PAGE_SIZE) * hv * dk * dv * F32


def layer_activation_bytes(c: Qwen35Config, tokens: int) -> list[int]:
    """What each decoder layer's autograd graph keeps for ``tokens`` tokens (its mixer and its MLP)."""
    e = torch.empty(0, dtype=c.torch_dtype).element_size()
    h = c.hidden_size
    if c.num_experts:  # routed rows (top k per token), fp32 combine and router, the gated shared expert
        rows = tokens * c.num_experts_per_tok
        mlp = rows * e * (h + 3 * c.moe_intermediate_size) + rows * h * F32 + tokens * c.num_experts * F32
        mlp += tokens * e * (h + 3 * c.shared_expert_intermediate_size + 2)
    else:
        mlp = tokens * e * (h + 3 * c.intermediate_size)
    mixer = {"full_attention": _full_attention_bytes, "linear_attention": _gated_deltanet_bytes}
    return [mlp + mixer[kind](c, tokens, e) for kind in c.layer_types]


def engine_step_width(c: Qwen35Config) -> int:
    """The widest per-token row a forward step computes beside the hidden state (MLP or the q/k/v + z
    projections of a Gated DeltaNet layer)."""
    moe = c.num_experts_per_tok * c.moe_intermediate_size + c.shared_expert_intermediate_size
    return max(c.intermediate_size, moe, c.conv_dim + c.value_dim, 2 * c.num_attention_heads * c.head_dim)


def page_bytes(c: Qwen35Config, dtype: torch.dtype) -> int:
    """Bytes of one engine cache page (every kind, every layer)."""
    return hybrid_bytes_per_page(c, dtype)


def engine_cache_terms(c: Qwen35Config, pages: int, running: int, dtype: torch.dtype) -> dict[str, int]:
    """The engine's: ``pages`` cache pages split by kind (full-attention K/V, the Gated DeltaNet layers'
    per-position recurrent inputs, the delta-rule state snapshot slots: one per SNAPSHOT_EVERY pages) and
    the live recurrent state of ``running`` sequences in one layer of a step."""
    return paged_cache_terms(
        partial(hybrid_page_terms, c, dtype), pages, running, sequence_state_bytes(c, dtype)
    )


def paged_cache_terms(
    page_terms: Callable[[int], dict[str, int]], pages: int, running: int, state_bytes: int
) -> dict[str, int]:
    """A hybrid family's engine cache terms from its page terms (``page_terms(snapshot_every)``: bytes of
    ``kv``, ``recurrent_inputs``, ``state_snapshots`` per page) and one sequence's live state in one layer
    (``state_bytes``): ``pages`` pages, their snapshot slots (one per SNAPSHOT_EVERY pages) and ``running``
    sequences' live state."""
    page = page_terms(SNAPSHOT_EVERY)
    return {
        "kv_cache": pages * page["kv"],
        "recurrent_inputs": pages * page["recurrent_inputs"],
        "state_snapshots": snapshot_slots(pages) * page_terms(1)["state_snapshots"],
        "recurrent_step_state": running * state_bytes,
    }


def cache_note(c: Qwen35Config, dtype: torch.dtype) -> str:
    """One line: what a page holds and a sequence's state costs (for the estimate's notes)."""
    page = hybrid_page_terms(c, dtype)
    linear = c.layer_types.count("linear_attention")
    mib = 2**20
    live = linear * sequence_state_bytes(c, dtype) / mib
    slot = hybrid_page_terms(c, dtype, snapshot_every=1)["state_snapshots"]
    return (
        f"hybrid cache page ({PAGE_SIZE} positions, {c.num_hidden_layers - linear} full-attention + {linear} "
        f"Gated DeltaNet layers): K/V {page['kv'] / mib:.1f} MiB, recurrent inputs "
        f"{page['recurrent_inputs'] / mib:.1f} MiB, delta-rule state snapshots "
        f"{page['state_snapshots'] / mib:.1f} MiB (one slot of {slot / mib:.0f} MiB per {SNAPSHOT_EVERY} "
        f"pages); a running sequence's live state {live:.1f} MiB over all "
        "layers (one layer's at a time in a step)"
    )
