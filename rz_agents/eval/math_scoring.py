"""Scoring math samples: one completion -> extracted answer + 0/1 correctness; problems -> summary.

Kept apart from generation so the arithmetic can be tested with scripted completions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rz_agents.eval.pass_at_k import avg_at_k, mean_pass_at_k
from rz_agents.rewards import MathVerifier, default_verifier, extract_boxed, normalize_answer


@dataclass
class SampleResult:
    """One sample of one problem.

    answer: the last ``\\boxed{}`` content (None when there is none); correct: it equals the gold answer;
    tokens: tokens the policy generated; finish: why generation ended ("stop", "length", "terminated",
    "max_turns", ... or "error"); error: why the sample failed, if it did (it then counts as wrong);
    tool_turns: turns that called the tool; text: the generated text, when the run saves it.
    """

    answer: str | None
    correct: bool
    tokens: int = 0
    finish: str = "stop"
    error: str | None = None
    tool_turns: int = 0
    text: str | None = None


@dataclass
class ProblemResult:
    """All samples of one problem."""

    id: str
    answer: str
    samples: list[SampleResult] = field(default_factory=list)

    @property
    def num_correct(self) -> int:
        return sum(s.correct for s in self.samples)

    def top_answer(self) -> str | None:
        """The most frequent extracted answer (by light normal form), in the form first written; None if
        none."""
        answers = [s.answer for s in self.samples if s.answer is not None]
        if not answers:
            return None
        counts = Counter(normalize_answer(a) for a in answers)
        best = max(counts.values())
        return next(a for a in answers if counts[normalize_answer(a)] == best)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "answer": self.answer,
            "num_correct": self.num_correct,
            "num_samples": len(self.samples),
            "top_answer": self.top_answer(),
            "samples": [asdict(s) for s in self.samples],
        }


def final_answer(text: str) -> str | None:
    """The last ``\\boxed{}`` content; None when there is none or it is empty (an echo of the instruction)."""
    answer = extract_boxed(text)
    return answer if answer else None


def score_completion(text: str, gold: str, verifier: MathVerifier | None = None) -> SampleResult:
    """Score one final answer text: the last ``\\boxed{}`` against ``gold`` with math equivalence.

    No boxed answer (or an empty ``\\boxed{}``) is wrong (reward 0); ``1/2``, ``0.5`` and ``\\frac{1}{2}`` are
    the same answer. A verifier failure scores the sample wrong and records why instead of raising.
    """
    answer = final_answer(text)
    if answer is None:
        return SampleResult(answer=None, correct=False)
    try:
        correct = bool((verifier or default_verifier()).equal(answer, str(gold)))
    except Exception as exc:  # noqa: BLE001 - one bad answer must not stop the evaluation
        return SampleResult(answer=answer, correct=False, error=f"verifier failed: {exc!r}")
    return SampleResult(answer=answer, correct=correct)


def summarize(problems: Sequence[ProblemResult], k: int) -> dict[str, Any]:
    """Aggregate metrics: avg@k (mean pass@1), pass@k (unbiased, n = samples per problem), and counts."""
    if not problems:
        raise ValueError("no problem to summarize")
    correct = [[s.correct for s in p.samples] for p in problems]
    samples = [s for p in problems for s in p.samples]
    n = len(samples)
    return {
        "num_problems": len(problems),
        "num_samples": n,
        "avg_at_k": avg_at_k(correct),
        "pass_at_k": mean_pass_at_k(correct, k),
        "num_correct": sum(s.correct for s in samples),
        "num_failed": sum(s.error is not None for s in samples),
        "no_answer_rate": sum(s.answer is None for s in samples) / n,
        "truncated_rate": sum(s.finish in ("length", "max_turns", "max_episode_tokens") for s in samples) / n,
        "mean_tokens": sum(s.tokens for s in samples) / n,
        "mean_tool_turns": sum(s.tool_turns for s in samples) / n,
    }
