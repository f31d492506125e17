"""Elementwise transcendental functions (exp, silu) whose result for an element never depends on
how large the tensor is.

PyTorch's CPU kernels run a vector loop over each thread's chunk and a scalar loop over the chunk's
remainder; the vector exp (SLEEF) and the scalar one (libm) can differ in the last bit. A thread's
chunk is ceil(numel / threads) elements, so which elements fall in a remainder depends on the tensor's
size: the same value could be rounded differently in a big batch than alone (seen for SiLU on MoE
expert batches at 2 threads). Padding the flat tensor to a multiple of ALIGN x threads makes every
chunk a whole number of vector iterations: every element takes the vector path, always.
(+, -, *, /, sqrt are correctly rounded on both paths and need none of this.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# Elements per vector loop iteration, rounded up generously (fp32 AVX-512: 2 x 16; bf16: 2 x 32).
ALIGN = 128


def aligned_unary(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn(x) for an elementwise fn, computed so that each element takes the vector path."""
    flat = x.reshape(-1)
    n = flat.numel()
    block = ALIGN * torch.get_num_threads()
    pad = (-n) % block
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return fn(flat)[:n].view(x.shape)
