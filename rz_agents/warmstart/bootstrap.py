"""Rejection-sampling bootstrap: a warm start for envs whose reward is sparse.

Each round samples the current policy on the env's tasks (``samples_per_task`` episodes per task, the
agent loop of the rollout, optionally with a few-shot ``system_prompt`` put in front of the env's prompt),
keeps the episodes with reward >= ``threshold``, and fine-tunes on every episode kept so far. The kept
episodes are trained on *without* the few-shot prompt: their prompt is re-rendered from the env's own
messages and the rest of their tokens (sampled turns, observations) is kept as sampled, so the policy
learns to do unprompted what it did when prompted.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rz_agents.rollout.agent_loop import EpisodeError, EpisodeLimits, EpisodeSpec, run_episode
from rz_agents.warmstart.demos import Demonstration


@dataclass
class BootstrapConfig:
    """``warm_start.bootstrap``: ``rounds: 0`` disables it."""

    rounds: int = 0  # rounds of sample -> keep the rewarded -> SFT (0: off)
    tasks_per_round: int = 32  # tasks drawn (without repeats inside a round) from env.tasks per round
    samples_per_task: int = 4  # episodes sampled per task and round
    threshold: float = 1.0  # keep an episode when its reward >= threshold
    # A few-shot prompt (worked examples) used while sampling, not in what is trained on. Put in front of
    # the env's system message, or as a system message of its own.
    system_prompt: str | None = None
    epochs: int = 2  # SFT epochs per round over the kept episodes
    lr: float | None = None  # null: warm_start.lr
    temperature: float = 1.0  # sampling temperature of the bootstrap's episodes

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if self.rounds < 0:
            raise ValueError(f"warm_start.bootstrap.rounds must be >= 0, got {self.rounds}")
        for name in ("tasks_per_round", "samples_per_task", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"warm_start.bootstrap.{name} must be >= 1, got {getattr(self, name)}")
        if self.lr is not None and self.lr <= 0:
            raise ValueError(f"warm_start.bootstrap.lr must be > 0 or null, got {self.lr}")
        if self.temperature <= 0:
            raise ValueError(f"warm_start.bootstrap.temperature must be > 0, got {self.temperature}")


def with_system_prompt(messages: list[dict[str, Any]], system_prompt: str | None) -> list[dict[str, Any]]:
    """``messages`` with ``system_prompt`` in front (merged into a leading system message)."""
    if not system_prompt:
        return messages
    if messages and messages[0].get("role") == "system":
        head = dict(messages[0], content=f"{system_prompt}\n\n{messages[0]['content']}")
        return [head, *messages[1:]]
    return [{"role": "system", "content": system_prompt}, *messages]


class _PromptedEnv:
    """The env with the few-shot prompt added to what ``reset`` returns; remembers the unprompted one."""

    def __init__(self, env: Any, system_prompt: str | None) -> None:
        self.env, self.system_prompt = env, system_prompt
        self.last_reset: tuple[list[dict[str, Any]], dict[str, Any]] | None = None

    def reset(self, *args, **kwargs):
        messages, info = self.env.reset(*args, **kwargs)
        self.last_reset = (list(messages), dict(info))
        return with_system_prompt(list(messages), self.system_prompt), info

    def step(self, action):
        return self.env.step(action)


def _unprompted(traj, messages, info, tokenizer, template, system_prompt) -> Demonstration:
    """The kept episode as a demonstration whose prompt is the env's own (no few-shot prompt)."""
    tools = info.get("tools") or None
    prompted = list(
        template.encode_prompt(tokenizer, with_system_prompt(messages, system_prompt), tools=tools)
    )
    if list(traj.tokens[: len(prompted)]) != prompted:
        raise AssertionError("the trajectory does not start with its rendered prompt")
    prompt = list(template.encode_prompt(tokenizer, messages, tools=tools))
    rest, rest_mask = traj.tokens[len(prompted) :], traj.loss_mask[len(prompted) :]
    return Demonstration(prompt + list(rest), [False] * len(prompt) + list(rest_mask), traj.info["turns"] > 1)


@dataclass
class RoundResult:
    kept: list[Demonstration]
    total: int
    failed: int
    reward_mean: float


async def sample_round(
    engine: Any,
    env_factory: Callable[[], Any],
    template: Any,
    tokenizer: Any,
    tasks: list[dict[str, Any] | None],
    cfg: BootstrapConfig,
    limits: EpisodeLimits,
    *,
    seed: int,
    concurrency: int,
) -> RoundResult:
    """Sample ``cfg.samples_per_task`` episodes per task; keep those with reward >= ``cfg.threshold``."""
    from rz_agents.engine import SamplingParams

    sampling = SamplingParams(temperature=cfg.temperature)
    executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="rz-bootstrap")
    pool: asyncio.Queue = asyncio.Queue()
    created: list[Any] = []
    slots = asyncio.Semaphore(concurrency)
    loop = asyncio.get_running_loop()

    async def one(index: int, member: int):
        async with slots:
            if pool.empty():
                created.append(await loop.run_in_executor(executor, env_factory))
                pool.put_nowait(_PromptedEnv(created[-1], cfg.system_prompt))
            env = await pool.get()
            spec = EpisodeSpec(
                tasks[index], index, member, seed * 1_000_003 + index * 101 + member, seed * 7919 + index
            )
            try:
                traj = await run_episode(engine, env, template, tokenizer, spec, sampling, limits, executor)
                return traj, env.last_reset
            except EpisodeError:
                return None, None
            finally:
                pool.put_nowait(env)

    try:
        jobs = [one(i, m) for i in range(len(tasks)) for m in range(cfg.samples_per_task)]
        results = await asyncio.gather(*jobs)
    finally:
        for env in created:
            try:
                await loop.run_in_executor(executor, env.close)
            except Exception:  # closing is best effort
                pass
        executor.shutdown(wait=False)
    done = [(t, r) for t, r in results if t is not None]
    kept = [
        _unprompted(t, r[0], r[1], tokenizer, template, cfg.system_prompt)
        for t, r in done
        if t.reward >= cfg.threshold
    ]
    mean = sum(t.reward for t, _ in done) / len(done) if done else float("nan")
    return RoundResult(kept, len(results), len(results) - len(done), mean)


def round_tasks(tasks: list[dict[str, Any]] | None, n: int, seed: int, round_index: int) -> list[Any]:
    """``n`` tasks for a round: a seeded draw without repeats while the list allows (None: the env draws)."""
    if tasks is None:
        return [None] * n
    order = list(range(len(tasks)))
    random.Random(f"rz-bootstrap:{seed}:{round_index}").shuffle(order)
    picked = [order[i % len(order)] for i in range(n)]
    return [tasks[i] for i in picked]
