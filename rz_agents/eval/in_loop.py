"""In-loop evaluation: a training config's ``eval: {every: N, ...}`` runs held-out evaluation inside training.

Every ``every`` learner steps (and after the last one) the training loop evaluates the weights it just
published, on the run's own engine, between two steps: the learner waits for it, the rollouts keep
running. What is evaluated is the ``eval:`` section that ``rz eval CONFIG`` reads, so one section serves
both:

- ``benchmark`` set: a math set (a packaged AIME-style set, gsm8k, a JSONL file; rz_agents/eval/math.py),
  direct answers or, with ``tool: true``, python-tool episodes; MathEvalConfig's fields (k, temperature,
  top_p, top_k, max_tokens, max_turns, limit, seed, prompt_style, ...).
- otherwise the run's env (rz_agents/eval/env_eval.py: any env, custom ones included): tasks from
  ``eval.tasks`` (a list, a file or a packaged name), else ``env.eval_tasks``, else ``eval.num_tasks``
  drawn by the env itself; k, temperature / top_p / top_k (default: the rollout's), ``max_tokens`` (per
  turn; default the rollout's), seed, limit, success_threshold.

Each evaluation uses the same seeds, so successive points compare policies, not samples. Its figures go
into the metrics of the step after which it ran, named ``eval/<figure>`` (avg_at_k, pass_at_k, mean_reward,
...), and ``time_eval_s`` is the time the learner waited for it.

``at_start: true`` also evaluates the first weights (version 0) before the first learner step, so the
held-out curve has a start and the end summary's before -> after compares with the untrained policy. Its
figures go into step 0's metrics as ``eval_at_start/<figure>`` (step 0's ``eval/*``, with ``every: 1``, are
those after step 0); the report plots them at step -1 ("after step -1": before step 0).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from rz_agents.eval.math_config import IN_LOOP_KEYS

# the env evaluation's settings an in-loop section may hold (besides IN_LOOP_KEYS); rz eval's own
# (checkpoint, kernels, dtype, num_threads, save_text) are accepted and not used in the loop
ENV_KEYS = (
    "tasks",
    "num_tasks",
    "limit",
    "k",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "seed",
    "success_threshold",
    "max_running",
)
RZ_EVAL_ONLY = ("checkpoint", "kernels", "dtype", "num_threads", "save_text")
FIGURES = ("avg_at_k", "pass_at_k", "mean_reward", "success_rate", "no_answer_rate", "num_failed", "wall_s")
EVERY_PREFIX = "eval/"  # the figures of an evaluation after a learner step
START_PREFIX = "eval_at_start/"  # those of the evaluation before the first step (eval.at_start)


def eval_every(section: Any) -> int:
    """``eval.every`` of a config's eval section (0 when absent); ValueError naming it when it is bad."""
    if not isinstance(section, dict):
        raise ValueError(f"eval: expected a mapping, got {type(section).__name__}")
    every = section.get("every", 0)
    if every is None:
        return 0
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ValueError(f"eval.every must be a whole number of learner steps >= 0 (0: off), got {every!r}")
    return every


def eval_at_start(section: dict[str, Any], every: int) -> bool:
    """``eval.at_start`` of a config's eval section (False when absent); ValueError naming it when it is not
    a boolean, or is set while the in-loop evaluation is off (``every`` 0)."""
    at_start = section.get("at_start", False)
    if at_start is None:
        return False
    if not isinstance(at_start, bool):
        raise ValueError(f"eval.at_start must be true or false, got {at_start!r}")
    if at_start and not every:
        raise ValueError(
            "eval.at_start: true needs eval.every >= 1 (the in-loop evaluation whose curve it starts)"
        )
    return at_start


@dataclasses.dataclass
class LoopEvalPlan:
    """What an in-loop evaluation runs: ``kind`` "math" (``math``: its MathEvalConfig) or "env" (``env``:
    its EnvEvalConfig, ``tasks``, the episode ``limits``); ``at_start``: also before the first step."""

    every: int
    kind: str
    math: Any = None
    env: Any = None
    tasks: list[Any] | None = None
    limits: Any = None
    at_start: bool = False


def plan_loop_eval(section: dict[str, Any], run_cfg) -> LoopEvalPlan | None:
    """The in-loop evaluation ``section`` asks for (None when ``every`` is 0 or absent). Raises ValueError
    naming the bad field: a wrong type or value, a key that is no setting, no tasks to evaluate."""
    every = eval_every(section)
    at_start = eval_at_start(section, every)
    if not every:
        return None
    from rz_agents.config_io import from_dict, rename_fields
    from rz_agents.eval.env_eval import EnvEvalConfig
    from rz_agents.eval.math_config import MathEvalConfig

    rest = {k: v for k, v in section.items() if k not in IN_LOOP_KEYS}
    if rest.get("benchmark"):
        config = from_dict(MathEvalConfig, rest, "eval")
        config.validate()
        return LoopEvalPlan(every, "math", math=config, at_start=at_start)
    rest = rename_fields(EnvEvalConfig, rest, "eval")
    unknown = sorted(set(rest) - set(ENV_KEYS) - set(RZ_EVAL_ONLY))
    if unknown:
        raise ValueError(
            f"eval.{unknown[0]}: not a setting of an env evaluation (set eval.benchmark for a math set); "
            f"known: every, {', '.join(ENV_KEYS)}"
        )
    return dataclasses.replace(_env_plan(every, rest, run_cfg), at_start=at_start)


def _env_plan(every: int, rest: dict[str, Any], run_cfg) -> LoopEvalPlan:
    from rz_agents.eval.env_eval import EnvEvalConfig, eval_tasks

    for name in ("k", "max_running", "limit", "num_tasks", "seed"):
        value = rest.get(name)
        low = 0 if name == "seed" else 1
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise ValueError(f"eval.{name} must be a whole number >= {low}, got {value!r}")
    for name in ("temperature", "top_p", "success_threshold"):
        value = rest.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"eval.{name} must be a number, got {value!r}")
    values = {k: rest[k] for k in ENV_KEYS if k not in ("tasks", "num_tasks", "max_tokens") and k in rest}
    config = EnvEvalConfig(
        checkpoint="(in training)", tasks=rest.get("tasks"), num_tasks=rest.get("num_tasks")
    )
    config = dataclasses.replace(config, **values)
    if config.temperature is not None and config.temperature < 0:
        raise ValueError(f"eval.temperature must be >= 0, got {config.temperature}")
    if config.top_p is not None and not 0.0 < config.top_p <= 1.0:
        raise ValueError(f"eval.top_p must be in (0, 1], got {config.top_p}")
    limits = run_cfg.rollout.limits
    max_tokens = rest.get("max_tokens")
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"eval.max_tokens must be a whole number >= 1, got {max_tokens!r}")
        limits = dataclasses.replace(limits, max_tokens_per_turn=max_tokens)
    try:
        tasks = eval_tasks(run_cfg, config)
    except ValueError as e:
        raise ValueError(f"eval.every needs tasks to evaluate: {e}") from None
    return LoopEvalPlan(every, "env", env=config, tasks=tasks, limits=limits)


class LoopEvaluator:
    """Runs a ``LoopEvalPlan`` on the training engine (``engine``, ``template``, ``tokenizer``: the
    controller's), from inside the training loop's event loop. ``sampling``: the run plan's (the
    controller's), so nothing is resolved again here; ``make_env``: the run's env factory (the runtime's:
    this module imports nothing of rz_agents.runtime)."""

    def __init__(self, plan: LoopEvalPlan, run_cfg, engine, template, tokenizer, sampling, make_env) -> None:
        from rz_agents.eval.checkpoint_policy import CheckpointPolicy

        self.plan, self.run_cfg, self.engine = plan, run_cfg, engine
        self.sampling, self._make_env = sampling, make_env
        self.policy = CheckpointPolicy(model=None, tokenizer=tokenizer, template=template, name="in training")

    def due(self, steps_done: int, total_steps: int) -> bool:
        """Whether to evaluate after ``steps_done`` learner steps: every ``every`` steps, and after the
        last."""
        return steps_done > 0 and (steps_done % self.plan.every == 0 or steps_done == total_steps)

    def due_at_start(self, steps_done: int) -> bool:
        """Whether to evaluate before the first learner step (``eval.at_start``; a run resumed after its
        first step has that evaluation in step 0's metrics already)."""
        return self.plan.at_start and steps_done == 0

    async def evaluate(self, prefix: str = EVERY_PREFIX) -> dict[str, Any]:
        """Evaluate the engine's current weights; their figures, named ``<prefix><figure>``."""
        start = time.perf_counter()
        if self.plan.kind == "math":
            result = await self._math()
        else:
            result = await self._env()
        result["wall_s"] = time.perf_counter() - start
        return {f"{prefix}{k}": float(result[k]) for k in FIGURES if isinstance(result.get(k), (int, float))}

    async def _math(self) -> dict[str, Any]:
        from rz_agents.data import load_dataset
        from rz_agents.eval.math import run_problems
        from rz_agents.eval.math_scoring import summarize
        from rz_agents.rewards import default_verifier

        config = self.plan.math
        if self.plan.tasks is None:
            self.plan.tasks = load_dataset(config.benchmark, limit=config.limit)
        problems = await run_problems(config, self.policy, self.plan.tasks, default_verifier(), self.engine)
        return summarize(problems, config.k)

    async def _env(self) -> dict[str, Any]:
        from rz_agents.agents import episode_runner
        from rz_agents.engine import SamplingParams
        from rz_agents.eval.env_eval import run_samples, summarize

        config, sampling = self.plan.env, self.sampling
        params = SamplingParams(
            temperature=sampling.temperature if config.temperature is None else config.temperature,
            top_k=sampling.top_k if config.top_k is None else config.top_k,
            top_p=sampling.top_p if config.top_p is None else config.top_p,
        )
        runner = episode_runner(self.run_cfg.agent)  # the run's agent drives the evaluation's episodes too
        limits = self.plan.limits
        samples = await run_samples(
            self.plan.tasks, config, self.policy, self._make_env, self.engine, params, limits, runner
        )
        return summarize(samples, config, self.run_cfg, self.policy, 0.0)


def eval_points(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run's in-loop evaluations in order, from its per-step metrics: one entry each, its figures without
    the prefix. The one before the first step (eval.at_start) has ``step`` None and ``at_start`` True; the
    others ``step``: the learner step after which they ran."""
    points = []
    for m in history:
        if f"{START_PREFIX}wall_s" in m:
            start = {k[len(START_PREFIX) :]: v for k, v in m.items() if k.startswith(START_PREFIX)}
            points.append({"step": None, "at_start": True, **start})
        if f"{EVERY_PREFIX}wall_s" in m:
            after = {k[len(EVERY_PREFIX) :]: v for k, v in m.items() if k.startswith(EVERY_PREFIX)}
            points.append({"step": m["step"], **after})
    return points
