"""The engine's paged cache of Kimi Linear: one page = 64 positions = one KDA chunk, as for Qwen3.5
(model/qwen3_5_cache.py, whose layout and reasoning this follows).

Per page, for each layer of its kind:
- MLA (full attention): the expanded K/V of its 64 positions, per head at the padded MLA head dim (what rz's
  MLA attends over, model/mla.py; not the compressed latent: a latent cache needs an attention kernel that
  expands it per key block, which the op sets do not have yet);
- KDA: per position, the short convs' input (the q/k/v projections), the per-channel log decay g
  [heads, dk] and beta (fp32); beside the pages, as Qwen3.5's, fewer KDA state snapshots than pages
  (fp32 [heads, dk, dv] after a page's chunk, one slot per ``snapshot_every`` pages, the slots
  model/qwen3_5_snapshots.py plans). The current chunk's k and v are recomputed from the conv inputs
  (per-token arithmetic: the same bits).

The attribute names (`k`, `v`, `conv_in`, `dr_g`, `dr_beta`, `state`) are the ones the hybrid forward
(model/qwen3_5.py's batch) reads and writes, so prefill chunks, decode, preemption, prefix reuse and weight
updates go through the same code for both families.
"""

from __future__ import annotations

import torch

from rz_agents.model.kimi_linear_config import KimiLinearConfig
from rz_agents.model.kv_cache import PAGE_SIZE
from rz_agents.model.qwen3_5_cache import SNAPSHOT_EVERY, HybridCache


def kimi_page_terms(
    config: KimiLinearConfig, dtype: torch.dtype | None = None, snapshot_every: int = SNAPSHOT_EVERY
) -> dict[str, int]:
    """Bytes one page (64 positions) holds over all layers, by what they are: ``kv`` (the MLA layers'
    expanded K/V), ``recurrent_inputs`` (each KDA layer's per-position conv input, g [heads, dk] and beta,
    fp32) and ``state_snapshots`` (its share of the snapshot slots: each KDA layer's fp32 [heads, dk, dv]
    state, one slot per ``snapshot_every`` pages). The keys are Qwen3.5's (``hybrid_page_terms``)."""
    item = torch.empty(0, dtype=dtype or config.torch_dtype).element_size()
    full = config.layer_types.count("full_attention")
    linear = config.num_hidden_layers - full
    h, d = config.linear_num_heads, config.linear_head_dim
    return {
        "kv": full * 2 * config.num_attention_heads * PAGE_SIZE * config.head_dim * item,
        "recurrent_inputs": linear * PAGE_SIZE * (config.conv_dim * item + 4 * (h * d + h)),
        "state_snapshots": linear * (4 * h * d * d // snapshot_every),
    }


def kimi_bytes_per_page(
    config: KimiLinearConfig, dtype: torch.dtype | None = None, snapshot_every: int = SNAPSHOT_EVERY
) -> int:
    """Bytes one page (64 positions) holds over all layers (the sum of ``kimi_page_terms``)."""
    return sum(kimi_page_terms(config, dtype, snapshot_every).values())


def kimi_sequence_state_bytes(config: KimiLinearConfig, dtype: torch.dtype | None = None) -> int:
    """Bytes of one sequence's live recurrent state in one KDA layer while a forward continues it: the state
    read from its page snapshot and the one the chunks advance (fp32 [heads, dk, dv] each) and the conv
    window (K - 1 positions of the three convs' input)."""
    item = torch.empty(0, dtype=dtype or config.torch_dtype).element_size()
    h, d = config.linear_num_heads, config.linear_head_dim
    return 2 * 4 * h * d * d + (config.linear_conv_kernel_dim - 1) * config.conv_dim * item


class KimiLinearCache(HybridCache):
    """The pages of a Kimi Linear model's cache (see the module docstring): the tensors Qwen3.5's
    ``HybridCache`` holds, in this family's shapes, so its ``view``, ``copy_page`` and ``buffers`` serve."""

    def __init__(  # (HybridCache's own __init__ reads a Qwen3.5 config: its allocation is shared)
        self,
        config: KimiLinearConfig,
        num_pages: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
        snapshot_every: int = SNAPSHOT_EVERY,
    ) -> None:
        dtype = dtype or config.torch_dtype
        h, d = config.linear_num_heads, config.linear_head_dim
        self._allocate(
            config.layer_types, num_pages, dtype, device, snapshot_every,
            kv=(config.num_attention_heads, PAGE_SIZE, config.head_dim), conv_dim=config.conv_dim,
            g=(h, d), beta=(h,), state=(h, d, d),
        )  # fmt: skip
        self.bytes_per_page = kimi_bytes_per_page(config, dtype, snapshot_every)
