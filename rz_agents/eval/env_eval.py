"""``rz eval RUN/config.yaml``: evaluate a checkpoint on the run's own env, whatever env that is.

Each task is run k times as a full episode by the rollout agent loop (the code that produced the training
trajectories): the env's own prompt, tools and reward, the run's chat template, turn and token limits.
Metrics: mean reward, success rate (reward >= ``success_threshold``), avg@k and pass@k of success, and a
per-task table. A sample that fails (env error, prompt too long) is counted, scored reward 0 and not a
success; the evaluation goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from rz_agents.engine import Engine, RZEngine, SamplingParams
from rz_agents.eval.checkpoint_policy import CheckpointPolicy
from rz_agents.eval.pass_at_k import avg_at_k, mean_pass_at_k


@dataclass
class EnvEvalConfig:
    """Settings of an env evaluation. None: the training run's value (rollout sampling, tasks).

    tasks: a list, a JSONL/JSON/Parquet file or a packaged name (None: the run's ``env.eval_tasks``);
    num_tasks: with no task list, evaluate this many tasks the env draws itself (from seeds);
    save_text: keep each sample's episode text (after the prompt: the policy's turns and the env's replies).
    """

    checkpoint: str
    tasks: list[Any] | str | None = None
    num_tasks: int | None = None
    k: int = 4
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int = 0
    success_threshold: float = 1.0
    limit: int | None = None
    RENAMED_FIELDS: ClassVar[dict[str, str]] = {"num_slots": "max_running"}  # config_io: old names

    max_running: int = 32
    num_threads: int | None = None
    kernels: str = "aligned"
    dtype: str | None = None
    save_text: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        for name in ("k", "max_running"):
            if getattr(self, name) < 1:
                raise ValueError(f"eval.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("num_tasks", "limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"eval.{name} must be >= 1, got {value}")


OnSample = Callable[[int, dict[str, Any]], None]


def eval_tasks(run_cfg, config: EnvEvalConfig) -> list[dict[str, Any] | None]:
    """The tasks to evaluate: ``config.tasks``, else the run's ``env.eval_tasks``, else ``num_tasks`` drawn
    by the env; ValueError (one line) when there are none."""
    from rz_agents.envs.tasks import load_tasks

    if config.tasks is not None:
        tasks: list[dict[str, Any] | None] | None = load_tasks(config.tasks, "eval.tasks")
    else:
        tasks = load_tasks(run_cfg.env.eval_tasks, "env.eval_tasks")
    if tasks is None:
        if not config.num_tasks:
            raise ValueError(
                "no eval tasks: set eval.num_tasks: N (the env draws N tasks itself), or eval.tasks / "
                "env.eval_tasks (a list, a JSONL/JSON/Parquet file or a packaged name)"
            )
        tasks = [None] * config.num_tasks
    return tasks[: config.limit] if config.limit else tasks


def _task_id(task: dict[str, Any] | None, index: int, info_id: Any) -> str:
    if info_id is not None:
        return str(info_id)
    if task is not None and "id" in task:
        return str(task["id"])
    return f"task-{index}"


def run_env_eval(
    run_cfg,
    config: EnvEvalConfig,
    policy: CheckpointPolicy,
    plan,
    make_env: Callable[[], Any],
    on_sample: OnSample | None = None,
    engine: Engine | None = None,
) -> dict[str, Any]:
    """Evaluate ``policy`` on ``run_cfg``'s env (a training config and ``plan``, what its validation decided:
    sampling, threads and turn limit are the plan's unless ``config`` sets them; ``make_env``: the run's env
    factory, from the runtime: this module imports nothing of rz_agents.runtime); returns the results
    dict."""
    config.validate()
    tasks = eval_tasks(run_cfg, config)
    r, s = run_cfg.rollout, plan.sampling
    sampling = SamplingParams(
        temperature=s.temperature if config.temperature is None else config.temperature,
        top_k=s.top_k if config.top_k is None else config.top_k,
        top_p=s.top_p if config.top_p is None else config.top_p,
    )
    start = time.perf_counter()
    if engine is None:
        eng_cfg = dataclasses.replace(
            run_cfg.engine,
            max_running=config.max_running,
            seed=config.seed,
            num_threads=config.num_threads or plan.num_threads,
            max_len=max(run_cfg.engine.max_len, r.limits.max_episode_tokens + 1),
        )
        engine = RZEngine(policy.model, eng_cfg, decode=policy.tokenizer.decode)
    from rz_agents.agents import episode_runner

    runner = episode_runner(run_cfg.agent)  # the run's agent drives the evaluation's episodes too
    samples = asyncio.run(
        _run(tasks, config, policy, make_env, engine, sampling, r.limits, on_sample, runner)
    )
    wall = time.perf_counter() - start
    return summarize(samples, config, run_cfg, policy, wall)


async def run_samples(
    tasks, config, policy, make_env, engine, sampling, limits, runner=None
) -> list[list[dict]]:
    """The k samples of every task on ``engine``, from inside a running event loop (the training loop's
    in-loop evaluation, rz_agents/eval/in_loop.py); ``summarize`` turns them into the results dict.
    ``runner``: the run's episode runner (rollout/episode_runner.py; None: the agent loop)."""
    return await _run(tasks, config, policy, make_env, engine, sampling, limits, None, runner)


async def _run(
    tasks, config, policy, make_env, engine, sampling, limits, on_sample, runner=None
) -> list[list[dict]]:
    from rz_agents.eval.math import sample_seed
    from rz_agents.rollout.agent_loop import AgentLoop, EpisodeSpec

    runner = runner if runner is not None else AgentLoop()

    concurrency = config.max_running
    executor = ThreadPoolExecutor(max_workers=min(32, concurrency), thread_name_prefix="rz-eval-env")
    loop = asyncio.get_running_loop()
    idle: list[Any] = []
    created: list[Any] = []
    slots = asyncio.Semaphore(concurrency)
    results: list[list[dict]] = [[] for _ in tasks]

    async def sample(index: int, member: int) -> tuple[int, dict]:
        async with slots:
            env = idle.pop() if idle else None
            spec = EpisodeSpec(
                task=tasks[index],
                group_id=index,
                member=member,
                seed=sample_seed(config.seed, index, member),
                reset_seed=sample_seed(config.seed + 1, index, 0),  # one task per index for every member
            )
            try:
                if env is None and runner.uses_env:  # a runner that steps no env gets None
                    env = await loop.run_in_executor(executor, make_env)
                    created.append(env)
                traj = await runner.run_episode(
                    engine, env, policy.template, policy.tokenizer, spec, sampling, limits, executor
                )
            except Exception as exc:  # noqa: BLE001 - a failed sample is counted, the evaluation goes on
                if env is not None:  # it may be broken: not reused
                    await loop.run_in_executor(executor, _close, env)
                    created.remove(env)
                out = {
                    "reward": 0.0,
                    "success": False,
                    "finish": "error",
                    "error": f"{type(exc).__name__}: {exc}",
                }
                out["task_id"] = _task_id(tasks[index], index, None)
            else:
                idle.append(env)
                reward = float(traj.reward)
                out = {
                    "reward": reward,
                    "success": reward >= config.success_threshold,
                    "finish": traj.info.get("finish"),
                    "turns": traj.info.get("turns"),
                    "tokens": int(sum(traj.loss_mask)),
                    "task_id": _task_id(tasks[index], index, traj.info.get("task_id")),
                }
                if config.save_text:
                    out["text"] = _episode_text(traj, policy.tokenizer)
        if on_sample is not None:
            on_sample(index, out)
        return index, out

    try:
        jobs = [sample(i, m) for i in range(len(tasks)) for m in range(config.k)]
        for index, out in await asyncio.gather(*jobs):
            results[index].append(out)
    finally:
        for env in created:
            await loop.run_in_executor(executor, _close, env)
        executor.shutdown(wait=False)
    return results


def _episode_text(traj, tokenizer) -> str:
    """The episode after its prompt, turn markers kept so tool calls and the env's replies stay readable."""
    from rz_agents.eval.math import decode_text

    start = traj.loss_mask.index(True) if True in traj.loss_mask else len(traj.tokens)
    return decode_text(tokenizer, traj.tokens[start:], False)


def _close(env) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001 - closing is best effort
        pass


def summarize(samples: list[list[dict]], config: EnvEvalConfig, run_cfg, policy, wall: float) -> dict:
    """The results dict: summary metrics, then one row per task."""
    flat = [s for per_task in samples for s in per_task]
    failed = [s for s in flat if s["finish"] == "error"]
    done = [s for s in flat if s["finish"] != "error"]
    success = [[s["success"] for s in per_task] for per_task in samples]
    rows = []
    for per_task in samples:
        rewards = [s["reward"] for s in per_task]
        first_id = next((s["task_id"] for s in per_task if s["finish"] != "error"), per_task[0]["task_id"])
        rows.append(
            {
                "id": first_id,
                "mean_reward": sum(rewards) / len(rewards),
                "num_success": sum(s["success"] for s in per_task),
                "num_samples": len(per_task),
                "num_failed": sum(s["finish"] == "error" for s in per_task),
                "samples": per_task,
            }
        )
    return {
        "env": run_cfg.env.id,
        "checkpoint": config.checkpoint,
        "policy": policy.name,
        "k": config.k,
        "success_threshold": config.success_threshold,
        "num_tasks": len(samples),
        "num_samples": len(flat),
        "num_failed": len(failed),
        "first_error": failed[0]["error"] if failed else None,
        "mean_reward": sum(s["reward"] for s in flat) / len(flat),
        "mean_reward_completed": (sum(s["reward"] for s in done) / len(done)) if done else None,
        "success_rate": sum(s["success"] for s in flat) / len(flat),
        "avg_at_k": avg_at_k(success),
        "pass_at_k": mean_pass_at_k(success, config.k),
        "mean_turns": (sum(s["turns"] or 0 for s in done) / len(done)) if done else None,
        "wall_s": wall,
        "config": asdict(config),
        "tasks": rows,
    }


def format_env_table(result: dict[str, Any], max_rows: int | None = None) -> str:
    """The per-task table (id, mean reward, successes/k, failed) and the summary lines."""
    rows = result["tasks"][:max_rows] if max_rows else result["tasks"]
    id_w = max([len("task"), *(min(len(str(r["id"])), 32) for r in rows)])
    lines = [f"{'task':<{id_w}}  {'reward':>7}  {'success':>8}  {'failed':>6}", "-" * (id_w + 29)]
    for r in rows:
        tid = str(r["id"]) if len(str(r["id"])) <= 32 else str(r["id"])[:31] + "…"
        frac = f"{r['num_success']}/{r['num_samples']}"
        lines.append(f"{tid:<{id_w}}  {r['mean_reward']:>7.3f}  {frac:>8}  {r['num_failed']:>6}")
    if max_rows and len(result["tasks"]) > max_rows:
        lines.append(f"... {len(result['tasks']) - max_rows} more tasks")
    k, thr = result["k"], result["success_threshold"]
    lines += [
        "",
        f"{result['env']} ({result['num_tasks']} tasks, k={k}, checkpoint {result['policy']})",
        f"mean reward: {result['mean_reward']:.4f}   success rate (reward >= {thr:g}): "
        f"{100 * result['success_rate']:.2f}%",
        f"avg@{k}: {100 * result['avg_at_k']:.2f}%   pass@{k}: {100 * result['pass_at_k']:.2f}%",
        f"failed samples: {result['num_failed']} of {result['num_samples']}"
        + (f"   first error: {result['first_error']}" if result["first_error"] else ""),
        f"wall: {result['wall_s']:.1f} s",
    ]
    return "\n".join(lines)
