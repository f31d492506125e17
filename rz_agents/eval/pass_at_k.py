"""Sampling metrics over k samples per problem: avg@k (mean pass@1) and the unbiased pass@k estimator."""

from __future__ import annotations

from collections.abc import Sequence
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: ``1 - C(n-c, k) / C(n, k)``.

    The probability that at least one of ``k`` samples drawn without replacement from the ``n`` is
    correct (Chen et al., 2021). With ``n == k`` it is 1.0 when any sample is correct, else 0.0.
    """
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"pass_at_k takes ints, got n={n!r}, c={c!r}, k={k!r}")
    if n < 1 or not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    # exact integer binomials: no float cancellation for large n
    return 1.0 - comb(n - c, k) / comb(n, k)


def avg_at_k(correct_per_problem: Sequence[Sequence[bool | float]]) -> float:
    """avg@k: the mean over problems of the mean 0/1 reward over that problem's samples (pass@1)."""
    if not correct_per_problem:
        raise ValueError("avg_at_k needs at least one problem")
    means = []
    for i, samples in enumerate(correct_per_problem):
        if not samples:
            raise ValueError(f"problem {i} has no samples")
        means.append(sum(float(x) for x in samples) / len(samples))
    return sum(means) / len(means)


def mean_pass_at_k(correct_per_problem: Sequence[Sequence[bool | float]], k: int) -> float:
    """pass@k averaged over problems, each from its own n samples (n >= k)."""
    if not correct_per_problem:
        raise ValueError("mean_pass_at_k needs at least one problem")
    values = [
        pass_at_k(len(samples), sum(1 for x in samples if float(x) == 1.0), k)
        for samples in correct_per_problem
    ]
    return sum(values) / len(values)
