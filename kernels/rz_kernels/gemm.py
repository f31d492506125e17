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


def _tiled_matmul(x2: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[m, k] @ weight.T in fixed [tile, k] x [k, n] GEMMs (the batch-invariant forward)."""
    m, k = x2.shape
    n = weight.shape[0]
    if m == 0:
        return x2.new_zeros(0, n)
    tile = TILE_ROWS.get(x2.dtype, 64)
    xp = _pad_rows(x2, tile)
    wt = weight.t()
    if x2.dtype == torch.float32:
        # the weight is broadcast over the tiles (a stride-0 view, no copy)
        out = torch.bmm(xp.view(-1, tile, k), wt.unsqueeze(0).expand(xp.shape[0] // tile, k, n))
        out = out.reshape(-1, n)
    else:
        out = torch.cat([torch.mm(xp[i : i + tile], wt) for i in range(0, xp.shape[0], tile)])
    return out[:m]


class _TiledLinear(torch.autograd.Function):
    """Forward in fixed tiles; backward as two plain GEMMs.

    Autograd through the broadcast bmm would build the weight gradient as one [k, n] matrix per
    tile and then sum them: for a 151,936-wide LM head and a 4,096-token micro-batch that is tens
    of GB and most of the backward's time. Gradients are not part of the bit-identity contract
    (only the forward log-probs are), so the backward uses `grad_out @ W` and `grad_out.T @ x`.
    """

    @staticmethod
    def forward(ctx, x2: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x2, weight)
        return _tiled_matmul(x2, weight)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x2, weight = ctx.saved_tensors
        grad_x = grad_out.mm(weight) if ctx.needs_input_grad[0] else None
        grad_w = grad_out.t().mm(x2) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T (+ bias)` computed in fixed-size row tiles (batch-invariant forward)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if torch.is_grad_enabled() and (x2.requires_grad or weight.requires_grad):
        out = _TiledLinear.apply(x2, weight)
    else:
        out = _tiled_matmul(x2, weight)
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, weight.shape[0])


def standard_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Stock `F.linear` (not batch-invariant; the negative control)."""
    return F.linear(x, weight, bias)
