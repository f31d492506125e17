"""The Triton op set: the aligned kernels for CUDA (and, through the Triton interpreter, for CPU tests).

Same interface and the same invariants as the CPU `aligned` op set (rz_kernels.opset): a GEMM with a
fixed reduction order per element, attention whose query tiles are aligned to absolute positions and
whose keys are walked from position 0 in fixed blocks, row-wise RMSNorm / RoPE / SiLU-mul / softmax
with one program per row, and an MoE with a stable dispatch, one grouped-GEMM config and a fixed-order
fp32 combine. Importing this package needs `triton`; on a machine without a GPU, set
TRITON_INTERPRET=1 before importing it (see interpreter.py).
"""

from rz_kernels.triton_ops import attention, causal_conv, delta_rule, gated_norm, gemm, moe, rowwise, softmax

__all__ = ["attention", "causal_conv", "delta_rule", "gated_norm", "gemm", "moe", "rowwise", "softmax"]
