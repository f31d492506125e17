"""What DeepSeek-V4's forward keeps per sequence and per token, from the model's own structure: the memory
estimate (`rz train --dry-run`, runtime/memory_estimate.py) asks these functions instead of guessing.

A sequence's cache between forwards (`deepseek_v4_attention.SequenceState`) holds, per layer:
- rows a later token still reads, bounded by `Reach` (the sliding window and the compression windows): the
  attention's K=V row (`head_dim`) on every layer, and each compressor's projections of the windows not
  pooled yet (`.kv` and `.gate`, twice the entry width on CSA's overlapping windows): the attention's
  compressor on CSA and HCA layers, the indexer's on CSA layers;
- one pooled entry per `rate` tokens: CSA and HCA compressed K/V (`head_dim` each) and the indexer's keys
  (`index_head_dim`, CSA layers).
The first kind is per sequence whatever its length, the second grows with it: bytes per token.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from rz_agents.model.deepseek_v4 import DeepseekV4ForCausalLM
from rz_agents.model.deepseek_v4_attention import Reach
from rz_agents.model.deepseek_v4_config import ATTENTION_KINDS, DeepseekV4Config

SLIDING, CSA, HCA = ATTENTION_KINDS


@dataclass(frozen=True)
class V4CacheSizes:
    """Bytes of one sequence's cache: `per_sequence` terms are bounded (held at any length), `per_token`
    terms are per token of the sequence (its pooled entries: one per `rate` tokens, as a fraction)."""

    per_sequence: dict[str, float]
    per_token: dict[str, float]
    rows_held: int  # the most positions of rows a sequence holds (Reach)

    def sequence_bytes(self, positions: int) -> float:
        """One sequence of `positions` tokens: its bounded rows and its entries."""
        return sum(self.per_sequence.values()) + positions * sum(self.per_token.values())


def rows_held(cfg: DeepseekV4Config) -> int:
    """The most positions whose rows a sequence's state keeps after a forward (`Reach.first_needed` of its
    end, over one full period of the window and both rates)."""
    reach = Reach(cfg.sliding_window, cfg.csa_rate, cfg.hca_rate)
    span = cfg.sliding_window + 2 * max(cfg.csa_rate, cfg.hca_rate) + 1
    return max(end - reach.first_needed(end) for end in range(1, span + 1))


def cache_sizes(cfg: DeepseekV4Config, dtype_bytes: int) -> V4CacheSizes:
    """The cache one sequence holds, by kind (sliding-window K/V, compressor windows, CSA / HCA compressed
    K/V, indexer keys), in bytes of a `dtype_bytes` model dtype."""
    rows, d, c = rows_held(cfg), cfg.head_dim, cfg.index_head_dim
    kinds = [cfg.layer_types[i] for i in range(cfg.num_hidden_layers)]
    n_csa, n_hca = kinds.count(CSA), kinds.count(HCA)
    # compressor projections per row: .kv and .gate, each 2 x dim wide on CSA (overlap), dim on HCA
    window_elems = n_csa * 2 * (2 * d + 2 * c) + n_hca * 2 * d
    per_sequence = {
        "sliding_window_kv": float(rows * d * len(kinds) * dtype_bytes),
        "compressor_windows": float(rows * window_elems * dtype_bytes),
    }
    per_token = {
        "csa_compressed_kv": n_csa * d * dtype_bytes / cfg.csa_rate,
        "hca_compressed_kv": n_hca * d * dtype_bytes / cfg.hca_rate,
        "indexer_keys": n_csa * c * dtype_bytes / cfg.csa_rate,
    }
    return V4CacheSizes(per_sequence, per_token, rows)


def activation_bytes_per_token(cfg: DeepseekV4Config, dtype_bytes: int, tokens: int) -> dict[str, float]:
    """What the learner's autograd graph keeps per token of a `tokens`-token sequence (model dtype; fp32
    where the model computes in fp32; an estimate of the largest tensors, not a trace): `per_layer` summed
    over the layers (hyper-connection streams and their mixes, the low-rank query, q, K=V, the window's
    gathered K=V, the grouped output; the indexer's query and its top-k gathered entries on CSA layers,
    every visible entry on HCA layers; the routed and shared experts' rows), `max_layer` (the largest one)
    and `layer_input` (what a checkpointed layer keeps: its `hc_mult` streams)."""
    e, h, n = dtype_bytes, cfg.hidden_size, cfg.hc_mult
    q, d = cfg.num_attention_heads * cfg.head_dim, cfg.head_dim
    mix = (2 + n) * n
    streams = 2 * (3 * n * h * e + mix * 4 + 2 * h * e)  # per site: streams in/out, mixes, x, normed x
    attn = e * (3 * cfg.q_lora_rank + 3 * q + 3 * d + (cfg.sliding_window + 1) * d + 2 * q)
    attn += e * cfg.o_groups * cfg.o_lora_rank + cfg.num_attention_heads * (cfg.sliding_window + 1) * 4
    rows = cfg.num_experts_per_tok + 1  # routed picks and the shared expert
    moe = rows * e * (h + 3 * cfg.moe_intermediate_size) + rows * h * 4 + cfg.n_routed_experts * 4
    read = {
        SLIDING: 0,
        CSA: cfg.index_n_heads * cfg.index_head_dim * e + cfg.index_topk * (d * e + 4),
        HCA: (tokens // cfg.hca_rate) * (d * e + 4),
    }
    layers = [streams + attn + moe + read[cfg.layer_types[i]] for i in range(cfg.num_hidden_layers)]
    return {"per_layer": float(sum(layers)), "max_layer": float(max(layers)), "layer_input": float(n * h * e)}


def parameter_shapes(cfg: DeepseekV4Config) -> tuple[int, int, int, int]:
    """(parameters, elements of the 2-D weights but the embedding, of the largest parameter, of the largest
    layer) of the model `cfg` describes, built on the meta device with two routed experts a layer and the
    others counted (each expert 3 x hidden x moe_intermediate, each a gate row of hidden): V4-Pro's 23k
    expert modules would take minutes to construct, and every expert of a layer has the same shapes."""
    kept = min(cfg.n_routed_experts, 2)
    with torch.device("meta"):
        model = DeepseekV4ForCausalLM(dataclasses.replace(cfg, n_routed_experts=kept), init=False)
    embed = model.get_input_embeddings().weight
    params = list({id(p): p for p in model.parameters()}.values())
    linear = sum(p.numel() for p in params if p.dim() == 2 and p is not embed)
    layer = max(sum(p.numel() for p in layer.parameters()) for layer in model.model.layers)
    h = cfg.hidden_size
    per_layer = (cfg.n_routed_experts - kept) * (3 * h * cfg.moe_intermediate_size + h)  # experts + gate rows
    layers = cfg.num_hidden_layers
    largest = max(max(p.numel() for p in params), cfg.n_routed_experts * h)  # (the gate, were it largest)
    extra = layers * per_layer
    return model.num_parameters() + extra, linear + extra, largest, layer + per_layer
