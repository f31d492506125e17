"""Slot-based KV cache: one fixed-length row of keys/values per slot, per layer."""

from __future__ import annotations

import torch

from rz_agents.model.config import ModelConfig
from rz_kernels.attention import KEY_BLOCK


def bytes_per_slot(config: ModelConfig, max_len: int, dtype: torch.dtype | None = None) -> int:
    """Bytes of K and V of one slot of max_len positions (rounded up to the key block), all layers."""
    positions = -(-max_len // KEY_BLOCK) * KEY_BLOCK
    itemsize = torch.empty(0, dtype=dtype or config.torch_dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * positions * config.head_dim * itemsize


class KVCache:
    """k, v: per layer [num_slots, num_kv_heads, max_len, head_dim], zero-initialised.

    max_len is rounded up to a multiple of the attention key block. Slots are handed out by the
    engine; the model writes a token's K/V at (slot, position). Zero init matters: blocked
    attention multiplies masked probabilities (exactly 0) by stale values, which must be finite.
    """

    def __init__(
        self,
        config: ModelConfig,
        num_slots: int,
        max_len: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.max_len = -(-max_len // KEY_BLOCK) * KEY_BLOCK
        self.num_slots = num_slots
        dtype = dtype or config.torch_dtype
        shape = (num_slots, config.num_key_value_heads, self.max_len, config.head_dim)
        self.device = torch.device(device)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.bytes_per_slot = bytes_per_slot(config, self.max_len, dtype)
