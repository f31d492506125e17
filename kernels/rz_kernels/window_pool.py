"""Softmax-gated pooling of fixed token windows into one compressed entry each (DeepSeek-V4's compressors).

Window i's entry is `sum_j softmax_j(gate[i, j, :]) * kv[i, j, :]` over its R slots, per channel; empty slots
carry gate -inf (weight exactly 0). The aligned form computes each entry from its own window only, with the
max exact, the exponentials on the vector path for every element (`aligned_unary`), and the sums over the
slots as an explicit loop in slot order: an entry's bits depend on its window's values alone, never on how
many windows or sequences share the call. The standard form is the stock softmax-and-sum transformers runs.
"""

from __future__ import annotations

import torch

from rz_kernels.elementwise import aligned_unary


def aligned_pool(kv: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Entries [N, D] of windows kv, gate [N, R, D] (gate in fp32; result in kv's dtype)."""
    g = gate.float()
    top = g.max(dim=1, keepdim=True).values
    e = aligned_unary(torch.exp, g - top)
    total = e[:, 0]
    for j in range(1, e.shape[1]):  # fixed slot order
        total = total + e[:, j]
    p = (e / total.unsqueeze(1)).to(kv.dtype)
    out = kv[:, 0] * p[:, 0]
    for j in range(1, kv.shape[1]):
        out = out + kv[:, j] * p[:, j]
    return out


def standard_pool(kv: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The stock form: softmax over the slots in fp32, weighted sum (transformers' arithmetic)."""
    return (kv * gate.softmax(dim=1, dtype=torch.float32).to(kv.dtype)).sum(dim=1)
