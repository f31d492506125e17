"""Rotary position embedding with fp32 cos/sin tables indexed by absolute position.

A token's rotation depends only on its absolute position, never on where it sits in a batch or
chunk, so prefill, chunked prefill, decode and the training forward all rotate it identically.
"""

from __future__ import annotations

import copy

import torch


class RopeTable:
    """cos/sin tables [max_positions, head_dim] (rotate-half layout, as in HF Llama/Qwen3)."""

    def __init__(
        self,
        head_dim: int,
        theta: float,
        max_positions: int,
        inv_freq: torch.Tensor | None = None,
        scale: float = 1.0,
    ) -> None:
        """Tables of the default RoPE frequencies of `theta`, or of `inv_freq` [head_dim // 2] (a scaled RoPE,
        e.g. YaRN), with cos and sin multiplied by `scale` (YaRN's attention factor; 1.0: untouched)."""
        # explicit device: tables stay real CPU tensors even when a model is built on the meta device
        if inv_freq is None:
            inv_freq = 1.0 / (
                theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim)
            )
        if inv_freq.shape != (head_dim // 2,):
            raise ValueError(
                f"inv_freq must have head_dim // 2 = {head_dim // 2} entries, got {tuple(inv_freq.shape)}"
            )
        inv_freq = inv_freq.to(device="cpu", dtype=torch.float32)
        pos = torch.arange(max_positions, dtype=torch.float32, device="cpu")
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos()
        self.sin = emb.sin()
        if scale != 1.0:
            self.cos, self.sin = self.cos * scale, self.sin * scale
        self.max_positions = max_positions
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._prechecked = False
        self._view: RopeTable | None = None  # the prechecked view (shares the tables and their device copies)

    @classmethod
    def from_rows(cls, cos: torch.Tensor, sin: torch.Tensor) -> RopeTable:
        """A table whose row i is (cos[i], sin[i]) [rows, head_dim]: angles gathered per token elsewhere
        (multimodal RoPE: each column's angle from one of several position axes). Apply it with positions
        arange(rows); the rotation's arithmetic is `apply`'s, only the angles' source differs."""
        table = cls.__new__(cls)
        table.cos, table.sin = cos, sin
        table.max_positions = cos.shape[0]
        table._on_device = {}
        table._prechecked = True  # row indices made by the caller, in range by construction
        table._view = table
        return table

    def tables(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) on `device` (computed once on CPU, copied once per device)."""
        device = torch.device(device)
        if device.type == "cpu":
            return self.cos, self.sin
        if device not in self._on_device:
            self._on_device[device] = (self.cos.to(device), self.sin.to(device))
        return self._on_device[device]

    def check_top(self, top: int | None) -> None:
        """Raise ValueError if the highest position ``top`` (None: no tokens) is past the table."""
        if top is not None and top >= self.max_positions:
            raise ValueError(f"position {top} exceeds max_position_embeddings {self.max_positions}")

    def check_positions(self, positions: torch.Tensor) -> None:
        """``check_top`` of ``positions`` (one host sync), unless this is a ``prechecked`` view."""
        if not self._prechecked and positions.numel():
            self.check_top(int(positions.max()))

    def prechecked(self) -> RopeTable:
        """A view of this table (same cos/sin tensors) for forwards whose positions were checked once with
        ``check_top``: its per-layer ``check_positions`` costs nothing (no host sync per layer). Made once."""
        if self._view is None:
            self._view = copy.copy(self)
            self._view._prechecked = True
        return self._view

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x [T, heads, head_dim] by positions [T]; math in fp32, result in x's dtype."""
        self.check_positions(positions)
        cos_table, sin_table = self.tables(x.device)
        cos = cos_table[positions].unsqueeze(1)
        sin = sin_table[positions].unsqueeze(1)
        xf = x.float()
        half = xf.shape[-1] // 2
        rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
        return (xf * cos + rotated * sin).to(x.dtype)
