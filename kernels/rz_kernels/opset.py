"""Op sets: the one switch between aligned (batch-invariant) and standard (stock PyTorch) kernels.

`aligned` resolves by device: the CPU kernels of this package on CPU, the Triton kernels
(rz_kernels.triton_ops) on CUDA. `triton` names the Triton op set on any device (on CPU it needs
TRITON_INTERPRET=1: the interpreter runs it, for tests). `standard` is stock PyTorch everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rz_kernels import (
    activation,
    attention,
    causal_conv,
    delta_rule,
    gated_norm,
    gemm,
    grouped_route,
    moe,
    norm,
)
from rz_kernels.rope import RopeTable


@dataclass(frozen=True)
class OpSet:
    name: str
    linear: Callable
    plan_attention: Callable
    attention: Callable
    moe: Callable  # (x, weights, experts, num_experts, expert_fn, expert_weights=None)
    rms_norm: Callable = norm.rms_norm  # (x, weight, eps)
    rope: Callable = RopeTable.apply  # (table, x, positions)
    silu_mul: Callable = activation.silu_mul  # (gate, up)
    # The vision tower's (Qwen3-VL): (x, weight, bias, eps) and (x, approximate="none" | "tanh"). Row-wise /
    # elementwise torch on every op set for now (on CUDA the Triton op set runs these torch forms too).
    layer_norm: Callable = norm.layer_norm
    gelu: Callable = activation.gelu
    route: Callable = moe.route  # (router_logits, top_k, normalize)
    # DeepSeek-V3 routing: (router_logits, correction_bias, top_k, n_group, topk_group, normalize, scaling)
    sigmoid_route: Callable = grouped_route.sigmoid_route
    # Gated DeltaNet (Qwen3.5's linear attention): the fixed-chunk-grid delta rule, the short causal conv and
    # the gated norm. Torch forms on every op set for now (exact by construction on any device); a Triton
    # kernel with the same grid slots in here.
    delta_rule: Callable = delta_rule.gated_delta_rule  # (q, k, v, g, beta, seq_lens, caches, ...)
    causal_conv1d: Callable = causal_conv.causal_conv1d  # (x, weight, seq_lens, windows, ...)
    gated_rms_norm: Callable = gated_norm.gated_rms_norm  # (x, gate, weight, eps)
    # (sizes, k, dtype) -> whether `linear` over weights stacked row-wise gives each part's columns
    # bit for bit (then the model may fuse q/k/v and gate/up into one GEMM).
    fusable: Callable = lambda sizes, k, dtype: True  # noqa: E731


def _per_expert(fn: Callable) -> Callable:
    """The CPU MoE runs one expert callable at a time; the grouped (Triton) one reads the weights."""

    def run(x, weights, experts, num_experts, expert_fn, expert_weights=None):
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
