"""The op-set interface: what every op set (aligned, standard, triton) provides. A module of its own so that
the op sets' registry (opset.py, which picks the Triton op set lazily) and the Triton op set both import it
without importing each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rz_kernels import activation, causal_conv, delta_rule, gated_norm, grouped_route, moe, norm
from rz_kernels.rope import RopeTable


@dataclass(frozen=True)
class OpSet:
    """The ops a model calls, one field each: the CPU op sets (opset.py) and the Triton one
    (triton_ops/opset.py) fill it; the defaults are the row-wise CPU kernels."""

    name: str
    linear: Callable
    plan_attention: Callable
    attention: Callable
    # (x, weights, experts, num_experts, expert_fn, expert_weights=None, swiglu_limit=None): the CPU op sets
    # call expert_fn per expert; the grouped Triton MoE reads expert_weights and clamps by swiglu_limit (V4)
    moe: Callable
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
    # the gated norm. The torch forms (exact by construction on any device) on the CPU op sets; the Triton op
    # set has kernels on the same grid (rz_kernels.triton_ops.delta_rule, causal_conv, gated_norm).
    # (q, k, v, g, beta, seq_lens, caches, scale, keep_caches, keep_rows: the row path's rows, if it has one)
    delta_rule: Callable = delta_rule.gated_delta_rule
    causal_conv1d: Callable = causal_conv.causal_conv1d  # (x, weight, seq_lens, windows, ...)
    gated_rms_norm: Callable = gated_norm.gated_rms_norm  # (x, gate, weight, eps)
    # (sizes, k, dtype) -> whether `linear` over weights stacked row-wise gives each part's columns
    # bit for bit (then the model may fuse q/k/v and gate/up into one GEMM).
    fusable: Callable = lambda sizes, k, dtype: True  # noqa: E731
