"""Rewards: final-answer extraction (``\\boxed{}``) and math equivalence (math-verify, time-bounded)."""

from rz_agents.rewards.answer import extract_boxed, normalize_answer
from rz_agents.rewards.equivalence import MathVerifier, default_verifier, math_equal
from rz_agents.rewards.math_reward import math_reward

__all__ = [
    "MathVerifier",
    "default_verifier",
    "extract_boxed",
    "math_equal",
    "math_reward",
    "normalize_answer",
]
