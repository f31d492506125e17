"""The 0/1 math reward: last ``\\boxed{}`` answer vs the gold answer."""

from __future__ import annotations

from rz_agents.rewards.answer import extract_boxed
from rz_agents.rewards.equivalence import MathVerifier, default_verifier


def math_reward(
    completion: str, gold: str, *, format_penalty: float = 0.0, verifier: MathVerifier | None = None
) -> float:
    """1.0 if the last ``\\boxed{}`` in ``completion`` equals ``gold``, else 0.0.

    With no boxed answer at all the reward is ``-format_penalty`` (0 by default).
    """
    answer = extract_boxed(completion)
    if answer is None:
        return -float(format_penalty)
    return 1.0 if (verifier or default_verifier()).equal(answer, str(gold)) else 0.0
