"""Matrix multiplication whose per-row result does not depend on how many rows share the call.

Stock `F.linear` picks a different kernel (and so a different reduction order) depending on the
number of rows M, so a token's result changes with the batch it sits in. `tiled_linear` zero-pads
the rows to a multiple of a fixed tile and runs every tile as a GEMM of one fixed shape
[tile, K] x [K, N]: a row's arithmetic is then the same whatever M is, by construction.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Rows per tile, per dtype. Chosen per dtype, never per batch size (a table keyed on M is the trap
# that breaks invariance). fp32 runs all tiles in one bmm (as fast as plain mm here); bf16 bmm has
# no fast path on CPU, so bf16 loops over mm calls of larger tiles.
TILE_ROWS = {torch.float32: 64, torch.bfloat16: 128, torch.float16: 128}


def _pad_rows(x: torch.Tensor, tile: int) -> torch.Tensor:
    m = x.shape[0]
    padded = -(-m // tile) * tile
    if padded == m:
        return x
    return torch.cat([x, x.new_zeros(padded - m, x.shape[1])])


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T (+ bias)` computed in fixed-size row tiles (batch-invariant)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    m, k = x2.shape
    n = weight.shape[0]
    if m == 0:
        out = x2.new_zeros(0, n)
    else:
        tile = TILE_ROWS.get(x2.dtype, 64)
        xp = _pad_rows(x2, tile)
        wt = weight.t()
        if x2.dtype == torch.float32:
            out = torch.bmm(xp.view(-1, tile, k), wt.unsqueeze(0).expand(xp.shape[0] // tile, k, n))
            out = out.reshape(-1, n)
        else:
            out = torch.cat([torch.mm(xp[i : i + tile], wt) for i in range(0, xp.shape[0], tile)])
        out = out[:m]
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, n)


def standard_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Stock `F.linear` (not batch-invariant; the negative control)."""
    return F.linear(x, weight, bias)
