"""Slot-based KV cache: one fixed-length row of keys/values per slot, per layer."""

from __future__ import annotations

import torch

from rz_agents.model.config import ModelConfig
from rz_kernels.attention import KEY_BLOCK


class KVCache:
    """k, v: per layer [num_slots, num_kv_heads, max_len, head_dim], zero-initialised.

    max_len is rounded up to a multiple of the attention key block. Slots are handed out by the
    engine; the model writes a token's K/V at (slot, position). Zero init matters: blocked
    attention multiplies masked probabilities (exactly 0) by stale values, which must be finite.
    """

    def __init__(
        self, config: ModelConfig, num_slots: int, max_len: int, dtype: torch.dtype | None = None
    ) -> None:
        self.max_len = -(-max_len // KEY_BLOCK) * KEY_BLOCK
        self.num_slots = num_slots
        dtype = dtype or config.torch_dtype
        shape = (num_slots, config.num_key_value_heads, self.max_len, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.bytes_per_slot = (
            2 * config.num_hidden_layers * shape[1] * shape[2] * shape[3] * self.k[0].element_size()
        )
