"""Op sets: the one switch between aligned (batch-invariant) and standard (stock PyTorch) kernels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rz_kernels import attention, gemm, moe


@dataclass(frozen=True)
class OpSet:
    name: str
    linear: Callable
    plan_attention: Callable
    attention: Callable
    moe: Callable


ALIGNED = OpSet(
    "aligned", gemm.aligned_linear, attention.plan_blocked, attention.blocked_attention, moe.aligned_moe
)
STANDARD = OpSet(
    "standard", gemm.standard_linear, attention.plan_sdpa, attention.sdpa_attention, moe.standard_moe
)

_OPSETS = {"aligned": ALIGNED, "standard": STANDARD}


def get_ops(name: str) -> OpSet:
    """Return the op set called `name` ("aligned" or "standard")."""
    try:
        return _OPSETS[name]
    except KeyError:
        raise ValueError(f"unknown kernels {name!r}; expected one of {sorted(_OPSETS)}") from None
