"""`rz train`'s warm start: episodes from a file, a rejection-sampling bootstrap, synthetic tool demos.

Runs on the run's own model, tokenizer, chat template, env and engine (before RL), then hands the weights
to the learner and the engines. Writes run_dir/warm_start_model (and run_dir/initial_model when the policy
is a random init, which exists nowhere else: ``rz eval --checkpoint`` scores the policy before and after). A
warm start that does not fit the run's env is a ``WarmStartMismatch`` (one line), raised before anything
trains.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rz_agents.model.lora import base_trainable
from rz_agents.runtime.stop import StopRequest
from rz_agents.warmstart import (
    DEMO_TASKS,
    WarmStartConfig,
    load_episodes,
    render_episode,
    supervised_warm_start,
)
from rz_agents.warmstart.bootstrap import round_tasks, sample_round
from rz_agents.warmstart.demos import Demonstration

# The built-in envs each kind of synthetic demonstration is written for (their prompts, tool and answer
# format).
DEMO_ENVS = {
    "arithmetic": ("rz_agents.envs.arithmetic_tool", "ArithmeticToolEnv"),
    "word_problems": ("rz_agents.envs.word_problem_tool", "WordProblemToolEnv"),
    "visual_click": ("rz_agents.envs.visual_click.env", "VisualClickEnv"),
}


class WarmStartMismatch(ValueError):
    """The configured warm start cannot teach the run's env anything (e.g. arithmetic demos elsewhere)."""


def _local_env_factory(run) -> Callable[[], Any]:
    """Envs built in this process (the Ray runtime's own factory gives remote proxies)."""
    from rz_agents.runtime.factories import run_env_factory

    return run_env_factory(run.cfg, run.plan)


def _close(env: Any) -> None:
    try:
        env.close()
    except Exception:  # best effort
        pass


def check_demos_fit(ws: WarmStartConfig, env_id: str, env_class: Any) -> None:
    """WarmStartMismatch unless the synthetic demos (``warm_start.demos``) were written for ``env_class``
    (what ``env.id`` builds)."""
    import importlib

    if ws.demos <= 0:
        return
    module, name = DEMO_ENVS[ws.task]
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(env_class, type) and issubclass(env_class, cls)):
        raise WarmStartMismatch(
            f"warm_start.demos makes {ws.task!r} demonstrations for {module}:{name}, but env.id is "
            f"{env_id!r}: "
            "they would teach this env nothing. Give your own episodes (warm_start.episodes: FILE.jsonl), "
            "a bootstrap (warm_start.bootstrap.rounds: N), or set warm_start.demos: 0 (docs/custom_env.md)"
        )


def episode_demos(run, path: str, log: Callable[[str], None]) -> list[Demonstration]:
    """The episodes of ``path`` rendered with the run's template; tools the episode does not give are the
    env's (from one ``reset``)."""
    episodes = load_episodes(path)
    env_tools = None
    if any("tools" not in e for e in episodes):
        env = _local_env_factory(run)()
        try:
            _, info = env.reset(seed=0, options={"task": None})
            env_tools = info.get("tools") or None
        except Exception as exc:  # an env that needs a task: episodes must then give their tools
            log(f"warm start: env.reset without a task failed ({exc!r}); episodes without 'tools' use none")
        finally:
            _close(env)
    demos = [
        render_episode(run.tokenizer, run.template, e["messages"], e.get("tools", env_tools))
        for e in episodes
    ]
    limit = run.cfg.rollout.limits.max_episode_tokens
    longest = max(len(d.tokens) for d in demos)
    if longest > limit:
        log(
            f"warning: the longest warm-start episode has {longest} tokens > "
            f"rollout.limits.max_episode_tokens {limit}"
        )
    return demos


def bootstrap(run, ws: WarmStartConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """``warm_start.bootstrap.rounds`` rounds of sample -> keep reward >= threshold -> fine-tune."""
    b = ws.bootstrap
    tasks = run.controller.tasks.tasks
    cfg = run.cfg
    concurrency = max(1, min(cfg.rollout.max_concurrent_episodes, cfg.engine.max_running))
    kept: list[Demonstration] = []
    rounds = []
    for r in range(b.rounds):
        picked = round_tasks(tasks, b.tasks_per_round, ws.seed, r)
        t0 = time.perf_counter()
        result = asyncio.run(
            sample_round(
                run.engine,
                _local_env_factory(run),
                run.template,
                run.tokenizer,
                picked,
                b,
                cfg.rollout.limits,
                seed=ws.seed * 1000 + r,
                concurrency=concurrency,
            )
        )
        kept += result.kept
        row = {
            "round": r + 1,
            "kept": len(result.kept),
            "total": result.total,
            "failed": result.failed,
            "reward_mean": result.reward_mean,
            "sample_s": time.perf_counter() - t0,
        }
        log(
            f"warm start, bootstrap round {r + 1}/{b.rounds}: kept {len(result.kept)}/{result.total} "
            f"episodes (reward >= {b.threshold}; mean reward {result.reward_mean:.3f}"
            + (f"; {result.failed} failed" if result.failed else "")
            + f"); fine-tuning on {len(kept)} kept so far"
        )
        if kept:
            row["sft"] = supervised_warm_start(run.model, kept, ws, epochs=b.epochs, lr=b.lr or ws.lr)
            run.push_model_weights()  # the next round samples the fine-tuned policy
        rounds.append(row)
    if not kept:
        log(
            "warning: the bootstrap kept no episode in any round: the policy never reached the threshold; "
            "give a few-shot warm_start.bootstrap.system_prompt, lower the threshold, or give episodes"
        )
    return {"rounds": rounds, "kept_total": len(kept)}


def run_warm_start(run, cfg, log: Callable[[str], None], stop: StopRequest | None = None) -> dict | None:
    """Every configured warm start on ``run``'s model, in order; the result for summary.json.

    ``stop`` (runtime/stop.py): once requested, the warm start raises ``RunStopped`` at its next SFT step or
    between its phases, before it hands any weights on or writes its model (nothing of it is kept)."""

    def check_stop() -> None:
        if stop is not None:
            stop.raise_if_requested("during the warm start")

    ws: WarmStartConfig = cfg.warm_start
    if not ws.enabled:
        return None
    if cfg.resume_from:  # the checkpoint holds the weights the warm start (and RL) made: train on them
        log(f"warm start skipped: the run continues from {cfg.resume_from}")
        return None
    if ws.demos > 0:
        env = _local_env_factory(run)()
        try:
            check_demos_fit(ws, cfg.env.id, type(getattr(env, "unwrapped", env)))
        finally:
            _close(env)
    last = [0.0]

    def progress(phase: str):
        def on_step(step: int, total: int, loss: float) -> None:
            check_stop()
            if step == total or time.perf_counter() - last[0] > 10:
                last[0] = time.perf_counter()
                log(f"  warm start ({phase}) step {step}/{total}  loss {loss:.3f}")

        return on_step

    if cfg.output_dir and not cfg.model.checkpoint:  # a random init exists nowhere else: keep it for rz eval
        run.export_model(Path(cfg.output_dir) / "initial_model")
    result: dict[str, Any] = {}
    # The SFT may run on the standard ops (faster); RL then samples and trains on the run's kernels.
    kernels, threads = run.model.kernels, torch.get_num_threads()
    run.model.set_kernels(ws.kernels or kernels)
    torch.set_num_threads(ws.num_threads or threads)
    # LoRA: the warm start fine-tunes the base (adapters frozen at B = 0), RL then trains the adapters
    with base_trainable(run.model):
        try:
            if ws.episodes:
                demos = episode_demos(run, ws.episodes, log)
                tokens = sum(sum(d.loss_mask) for d in demos)
                log(
                    f"warm start, episodes: {len(demos)} from {ws.episodes} ({tokens} assistant tokens) x "
                    f"{ws.epochs} epochs"
                )
                result["episodes"] = supervised_warm_start(run.model, demos, ws, on_step=progress("episodes"))
                result["episodes"]["count"] = len(demos)
                check_stop()
                run.push_model_weights()
            if ws.bootstrap.rounds > 0:
                result["bootstrap"] = bootstrap(run, ws, log)
                check_stop()
            if ws.demos > 0:
                result.update(_synthetic(run, ws, log, progress))
        finally:
            run.model.set_kernels(kernels)
            torch.set_num_threads(threads)
    check_stop()
    # The learner (and its fp32 masters) and the engines take the warm-started weights (same version).
    run.push_model_weights()
    if cfg.output_dir:
        run.export_model(Path(cfg.output_dir) / "warm_start_model")
    return result


def _synthetic(run, ws: WarmStartConfig, log, progress) -> dict[str, Any]:
    if ws.task == "visual_click":
        from rz_agents.warmstart.visual_demos import visual_click_demos

        demos = visual_click_demos(
            _local_env_factory(run), run.tokenizer, run.template, ws.demos, seed=ws.seed,
            named_fraction=ws.tool_fraction,
        )  # fmt: skip
        log(
            f"warm start, visual_click: {len(demos)} demonstrations (named button in "
            f"{ws.tool_fraction:.0%}, else a random one) x {ws.epochs} epochs"
        )
        return {"format": supervised_warm_start(run.model, demos, ws, on_step=progress("format"))}
    make_demos = DEMO_TASKS[ws.task]
    fmt = make_demos(
        run.tokenizer, run.template, ws.demos, seed=ws.seed, difficulty=ws.difficulty, tool_fraction=1.0
    )
    log(f"warm start, format phase: {len(fmt)} tool-use demonstrations ({ws.task}) x {ws.epochs} epochs")
    result = {"format": supervised_warm_start(run.model, fmt, ws, on_step=progress("format"))}
    if ws.prior_demos > 0:
        prior = make_demos(
            run.tokenizer,
            run.template,
            ws.prior_demos,
            seed=ws.seed + 1,
            difficulty=ws.difficulty,
            tool_fraction=ws.tool_fraction,
        )
        log(
            f"warm start, prior phase: {len(prior)} demonstrations, "
            f"{sum(d.uses_tool for d in prior)} use the tool (the rest guess)"
        )
        result["prior"] = supervised_warm_start(
            run.model, prior, ws, on_step=progress("prior"), epochs=1, lr=ws.prior_lr, warmup_steps=0
        )
    return result
