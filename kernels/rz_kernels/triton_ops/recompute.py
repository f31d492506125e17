"""A Triton forward whose backward is autograd through the op's torch form (the CPU kernel's code, which
runs on any device): gradients are not part of the bit-identity contract, so the new ops' backward need not
be a Triton kernel of its own. The forward's bits are the Triton kernel's; the backward recomputes the torch
form on the saved inputs and differentiates it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class _Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fast: Callable, reference: Callable, static: dict, *inputs: torch.Tensor):
        ctx.reference, ctx.static = reference, static
        ctx.save_for_backward(*inputs)
        return fast(*inputs, **static)

    @staticmethod
    def backward(ctx, grad_out):
        inputs = ctx.saved_tensors
        with torch.enable_grad():
            xs = [
                x.detach().requires_grad_(need)
                for x, need in zip(inputs, ctx.needs_input_grad[3:], strict=True)
            ]
            out = ctx.reference(*xs, **ctx.static)
            wanted = [x for x in xs if x.requires_grad]
            grads = iter(torch.autograd.grad(out, wanted, grad_out, allow_unused=True))
        return (None, None, None, *[next(grads) if x.requires_grad else None for x in xs])


def with_reference_backward(
    fast: Callable, reference: Callable, inputs: tuple[torch.Tensor, ...], **static: Any
) -> torch.Tensor:
    """`fast(*inputs, **static)`; under autograd, its gradient is that of `reference(*inputs, **static)`
    (one output tensor each; `static` holds the non-tensor arguments)."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in inputs):
        return _Recompute.apply(fast, reference, static, *inputs)
    return fast(*inputs, **static)
