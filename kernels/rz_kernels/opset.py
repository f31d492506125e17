"""Op sets: the one switch between aligned (batch-invariant) and standard (stock PyTorch) kernels.

`aligned` resolves by device: the CPU kernels of this package on CPU, the Triton kernels
(rz_kernels.triton_ops) on CUDA. `triton` names the Triton op set on any device (on CPU it needs
TRITON_INTERPRET=1: the interpreter runs it, for tests). `standard` is stock PyTorch everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from rz_kernels import attention, gemm, grouped_route, moe, norm
from rz_kernels.op_interface import OpSet

__all__ = ["ALIGNED", "KERNELS", "STANDARD", "OpSet", "get_ops"]


def _per_expert(fn: Callable) -> Callable:
    """The CPU MoE runs one expert callable at a time (its activation included); the grouped (Triton) one
    reads the weights and the activation's swiglu_limit."""

    def run(x, weights, experts, num_experts, expert_fn, expert_weights=None, swiglu_limit=None):
        return fn(x, weights, experts, num_experts, expert_fn)

    return run


ALIGNED = OpSet(
    "aligned",
    gemm.aligned_linear,
    attention.plan_blocked,
    attention.blocked_attention,
    _per_expert(moe.aligned_moe),
    fusable=gemm.fusion_verified,
)
STANDARD = OpSet(
    "standard",
    gemm.standard_linear,
    attention.plan_sdpa,
    attention.sdpa_attention,
    _per_expert(moe.standard_moe),
    sigmoid_route=grouped_route.make_sigmoid_route(torch.sigmoid),
    layer_norm=norm.standard_layer_norm,
    gelu=lambda x, approximate="none": F.gelu(x, approximate=approximate),
)

KERNELS = ("aligned", "standard", "triton")
_OPSETS = {"aligned": ALIGNED, "standard": STANDARD}


def _triton_opset() -> OpSet:
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise RuntimeError(
            "the Triton op set needs a CUDA GPU, or TRITON_INTERPRET=1 set before rz_kernels.triton_ops is "
            "imported (its interpreter runs the kernels on CPU, slowly: for tests)"
        )
    try:
        from rz_kernels.triton_ops.interpreter import check_triton_interprets
        from rz_kernels.triton_ops.opset import TRITON

        check_triton_interprets()
    except ImportError as exc:  # triton missing
        raise RuntimeError(f"the Triton op set needs the `triton` package ({exc})") from None
    return TRITON


def get_ops(name: str, device: torch.device | str | None = None) -> OpSet:
    """The op set called `name` ("aligned", "standard" or "triton") for tensors on `device`."""
    if name not in KERNELS:
        raise ValueError(f"unknown kernels {name!r}; expected one of {list(KERNELS)}")
    if name == "triton" or (name == "aligned" and device is not None and torch.device(device).type == "cuda"):
        return _triton_opset()
    return _OPSETS[name]
