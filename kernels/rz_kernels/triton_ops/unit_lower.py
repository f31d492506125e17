"""(I - L)^-1 of a strictly lower-triangular chunk matrix in Triton, shared by the delta-rule kernels."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def unit_lower_inverse(low, rows, C: tl.constexpr):
    """(I - L)^-1 of the strictly lower [C, C] tile `low` (rows = tl.arange(0, C)) by forward substitution,
    row i = e_i + sum_j L[i, j] row j: a runtime loop (compiles small), each row a function of the rows
    before it (L[i, j >= i] are exact zeros), so a row's bits do not depend on the rows after it."""
    inv = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    for i in range(1, C):
        pick = rows[:, None] == i
        l_i = tl.sum(tl.where(pick, low, 0.0), axis=0)  # row i of L (exact: one nonzero per column)
        inv = tl.where(pick, inv + tl.sum(l_i[:, None] * inv, axis=0)[None, :], inv)
    return inv
