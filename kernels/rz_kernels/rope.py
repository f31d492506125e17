"""Rotary position embedding with fp32 cos/sin tables indexed by absolute position.

A token's rotation depends only on its absolute position, never on where it sits in a batch or
chunk, so prefill, chunked prefill, decode and the training forward all rotate it identically.
"""

from __future__ import annotations

import torch


class RopeTable:
    """cos/sin tables [max_positions, head_dim] (rotate-half layout, as in HF Llama/Qwen3)."""

    def __init__(self, head_dim: int, theta: float, max_positions: int) -> None:
        # explicit device: tables stay real CPU tensors even when a model is built on the meta device
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim)
        )
        pos = torch.arange(max_positions, dtype=torch.float32, device="cpu")
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos()
        self.sin = emb.sin()
        self.max_positions = max_positions

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x [T, heads, head_dim] by positions [T]; math in fp32, result in x's dtype."""
        if positions.numel() and int(positions.max()) >= self.max_positions:
            raise ValueError(
                f"position {int(positions.max())} exceeds max_position_embeddings {self.max_positions}"
            )
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        xf = x.float()
        half = xf.shape[-1] // 2
        rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
        return (xf * cos + rotated * sin).to(x.dtype)
