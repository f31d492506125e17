"""The short causal depthwise convolution of Gated DeltaNet layers, one token's arithmetic whatever the call.

out[t, c] = sum_{j < K} weight[c, j] * x[t - K + 1 + j, c] (zeros before the sequence start), computed in
fp32 as K multiply-adds in the fixed order j = 0..K-1: an elementwise recipe, so a token gets the same bits
in a packed training forward, a prefill cut anywhere and a one-token decode. The state a sequence carries
between calls is its last K - 1 inputs (the *window*). The reference (`nn.Conv1d` / causal-conv1d) sums in
an order of its own choosing, so it agrees to rounding, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from rz_kernels.elementwise import aligned_unary


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: Sequence[int],
    windows: Sequence[torch.Tensor | None] | None = None,
    silu: bool = True,
    keep_windows: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """Causal depthwise conv (then SiLU if `silu`) over packed sequences.

    x [T, Ch] holds `seq_lens[0]` tokens of sequence 0, then sequence 1's, ...; weight [Ch, K] (a
    `Conv1d(groups=Ch)` weight [Ch, 1, K] squeezed); `windows[i]` [K - 1, Ch] holds sequence i's previous
    inputs (None: it starts here). Returns the output [T, Ch] in x's dtype and, with `keep_windows`, each
    sequence's window after these tokens (in x's dtype, as the inputs were).
    """
    t, ch = x.shape
    kw = weight.shape[-1]
    if weight.dim() == 3:
        weight = weight.reshape(ch, kw)
    if sum(seq_lens) != t:
        raise ValueError(f"seq_lens add up to {sum(seq_lens)} tokens, the input has {t}")
    windows = list(windows) if windows is not None else [None] * len(seq_lens)
    if len(windows) != len(seq_lens):
        raise ValueError(f"{len(windows)} windows for {len(seq_lens)} sequences")
    w = weight.float().t()  # [K, Ch]
    if not seq_lens:
        out = x.new_zeros(0, ch, dtype=torch.float32)
        return out.to(x.dtype), ([] if keep_windows else None)
    # One gather lays each sequence out behind its K - 1 previous inputs (its window, or zeros): rows of
    # [x; the windows; a zero row]. Per-sequence slices of x would each cost a full-size zero tensor and an
    # add in the backward (quadratic in the number of sequences); one index's backward is one index_add.
    given = [win.to(x.dtype) for win in windows if win is not None]
    src = torch.cat([x, *given, x.new_zeros(1, ch)])
    zero_row, next_window = src.shape[0] - 1, t
    index, out_rows, window_at = [], [], []
    start = padded = 0
    for n, win in zip(seq_lens, windows, strict=True):
        if win is None:
            index.append(torch.full((kw - 1,), zero_row, dtype=torch.long))
        else:
            index.append(torch.arange(next_window, next_window + kw - 1))
            next_window += kw - 1
        index.append(torch.arange(start, start + n))
        out_rows.append(torch.arange(padded, padded + n))  # row r of `acc` is padded row r + K - 1's output
        window_at.append(padded + n)
        start += n
        padded += kw - 1 + n
    xs = src[torch.cat(index).to(x.device)]  # [sum(K - 1 + n), Ch]
    xf = xs.float()
    # the same K multiply-adds per element as one sequence at a time: elementwise, so the same bits
    m = padded - (kw - 1)
    acc = xf[0:m] * w[0]
    for j in range(1, kw):
        acc = acc + xf[j : j + m] * w[j]
    out = acc[torch.cat(out_rows).to(x.device)]
    kept = [xs[p : p + kw - 1].detach() for p in window_at] if keep_windows else None
    if silu:
        out = aligned_unary(F.silu, out)
    return out.to(x.dtype), kept
