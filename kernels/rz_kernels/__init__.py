"""rz_kernels: the op sets shared by the rollout engine and the trainer.

`aligned` ops give every token the same arithmetic whatever batch, chunk or padding it is computed
in; `standard` ops are stock PyTorch (fast paths chosen by shape, not batch-invariant).
"""

from rz_kernels.activation import silu_mul
from rz_kernels.logprobs import gather_logprobs, sampling_logprobs
from rz_kernels.moe import route
from rz_kernels.norm import rms_norm
from rz_kernels.opset import ALIGNED, STANDARD, OpSet, get_ops
from rz_kernels.rope import RopeTable

__all__ = [
    "ALIGNED",
    "STANDARD",
    "OpSet",
    "RopeTable",
    "gather_logprobs",
    "get_ops",
    "rms_norm",
    "route",
    "sampling_logprobs",
    "silu_mul",
]
