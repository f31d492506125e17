"""Score an episode as OSWorld does.

* ``infeasible`` tasks score 1 exactly when the agent's last action was ``FAIL``.
* Any other task scores 0 when the last action was ``FAIL``; otherwise ``postconfig`` runs, then
  each metric reads its ``result`` (and ``expected``) getter. With ``conj: "and"`` the first 0
  ends scoring at 0 and the score is the mean; with ``"or"`` the first 1 ends it at 1, else the max.
  A getter or metric that raises scores that metric 0 (the error is recorded, the caller goes on).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rz_agents.envs.osworld.context import EpisodeContext
from rz_agents.envs.osworld.getters import get_state
from rz_agents.envs.osworld.metrics import METRICS
from rz_agents.envs.osworld.setup_steps import run_steps
from rz_agents.envs.osworld.task import Evaluator


@dataclass
class Evaluation:
    """The score and how it came about."""

    score: float
    metric_scores: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def evaluate_episode(ctx: EpisodeContext, evaluator: Evaluator, action_history: list[str]) -> Evaluation:
    """Run postconfig and the metrics; never raises for a task-level problem."""
    last = action_history[-1] if action_history else None
    if evaluator.is_infeasible:
        return Evaluation(float(last == "FAIL"))
    if last == "FAIL":
        return Evaluation(0.0)
    if not evaluator.funcs:
        return Evaluation(0.0, errors=["the task defines no evaluator"])
    out = Evaluation(0.0)
    try:
        run_steps(ctx, evaluator.postconfig)
    except Exception as exc:
        out.errors.append(f"postconfig: {exc}")
        return out
    for i, name in enumerate(evaluator.funcs):
        score = 0.0
        try:
            metric = METRICS.get(name)
            if metric is None:
                raise KeyError(f"metric not implemented: {name}")
            result = get_state(ctx, evaluator.results[i]) if evaluator.results[i] else None
            options = evaluator.options[i] if i < len(evaluator.options) else {}
            if evaluator.expected[i]:
                score = float(metric(result, get_state(ctx, evaluator.expected[i]), **options))
            else:
                score = float(metric(result, **options))
        except Exception as exc:
            out.errors.append(f"{name}: {type(exc).__name__}: {exc}")
        out.metric_scores.append(score)
        if evaluator.conj == "and" and score == 0.0:
            return out
        if evaluator.conj == "or" and score == 1.0:
            out.score = 1.0
            return out
    scores = out.metric_scores
    out.score = sum(scores) / len(scores) if evaluator.conj == "and" else max(scores)
    return out
