"""The Triton op set (selected by rz_kernels.get_ops for "aligned" on CUDA, or by name "triton")."""

from __future__ import annotations

from rz_kernels.op_interface import OpSet
from rz_kernels.triton_ops import attention, causal_conv, delta_rule, gated_norm, gemm, moe, rowwise, sigmoid

TRITON = OpSet(
    "triton",
    linear=gemm.linear,
    plan_attention=attention.plan_attention,
    attention=attention.attention,
    moe=moe.aligned_moe,
    rms_norm=rowwise.rms_norm,
    rope=rowwise.rope,
    silu_mul=rowwise.silu_mul,
    route=moe.route,
    fusable=gemm.fusion_keeps_bits,  # split-K depends on N: a stack must split as its parts do
    sigmoid_route=sigmoid.sigmoid_route,
    # Gated DeltaNet (Qwen3.5): the CPU kernels' fixed chunk grid and tap order, in Triton
    delta_rule=delta_rule.gated_delta_rule,
    causal_conv1d=causal_conv.causal_conv1d,
    gated_rms_norm=gated_norm.gated_rms_norm,
)
