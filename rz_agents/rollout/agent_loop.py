"""One episode: env + engine, token in / token out.

The conversation is kept as tokens from start to end. The prompt is rendered once with the chat template;
after each sampled turn, the env's new messages are rendered with ``encode_continuation`` and appended
(loss mask False). Sampled tokens are never decoded and re-encoded: the decoded text only goes to the env.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from rz_agents.trajectory import NOT_SAMPLED, Trajectory


class EpisodeError(RuntimeError):
    """An episode could not complete (engine error, env failure, bad observation); it is dropped."""


class ReplicaLost(EpisodeError):
    """The engine replica or env worker serving the episode died (Ray runtime); the episode can be run
    again from its start (the controller does, up to ``rollout.max_episode_reruns`` times)."""


@dataclass
class EpisodeSpec:
    """What to run: the task (None lets the env draw one), its group, and the seeds."""

    task: dict[str, Any] | None
    group_id: int
    member: int
    seed: int


@dataclass
class EpisodeLimits:
    """Per-episode bounds. max_episode_tokens must stay below the engine's max_len."""

    max_turns: int = 4
    max_tokens_per_turn: int = 256
    max_episode_tokens: int = 2048


def turn_seed(episode_seed: int, turn: int) -> int:
    """A distinct, reproducible sampling seed per (episode, turn)."""
    return (episode_seed * 1_000_003 + turn * 7919) % (2**63 - 1)


async def _call(executor: Executor | None, fn: Callable, *args, **kwargs):
    if inspect.iscoroutinefunction(fn):  # an env living elsewhere (a Ray env worker) is awaited as it is
        return await fn(*args, **kwargs)
    # Env calls may block (subprocesses, browsers, sleeps): run them off the event loop.
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor, lambda: fn(*args, **kwargs))


async def run_episode(
    engine,
    env,
    template,
    tokenizer,
    spec: EpisodeSpec,
    sampling,
    limits: EpisodeLimits,
    executor: Executor | None = None,
) -> Trajectory:
    """Run one episode to its end and return its Trajectory; raises EpisodeError if it cannot complete.

    ``sampling`` is the engine's SamplingParams template: max_tokens, seed and stop_token_ids are set per turn.
    """
    try:
        messages, info = await _call(executor, env.reset, seed=spec.seed, options={"task": spec.task})
    except ReplicaLost:
        raise
    except Exception as e:
        raise EpisodeError(f"env.reset failed: {e!r}") from e
    tools = info.get("tools") or None
    tokens: list[int] = list(template.encode_prompt(tokenizer, messages, tools=tools))
    mask = [False] * len(tokens)
    behavior = [0.0] * len(tokens)
    versions = [NOT_SAMPLED] * len(tokens)
    stops: Sequence[int] = tuple(template.stop_token_ids(tokenizer))
    total_reward = 0.0
    turns = 0
    finish = "max_turns"

    def append(new: Sequence[int], sampled: bool, logprobs=None, vers=None) -> None:
        tokens.extend(int(t) for t in new)
        mask.extend([sampled] * len(new))
        behavior.extend(logprobs if sampled else [0.0] * len(new))
        versions.extend(vers if sampled else [NOT_SAMPLED] * len(new))

    while turns < limits.max_turns:
        budget = min(limits.max_tokens_per_turn, limits.max_episode_tokens - len(tokens))
        if budget < 1:
            if turns == 0:
                raise EpisodeError(
                    f"the prompt has {len(tokens)} tokens: no room to sample within "
                    f"max_episode_tokens={limits.max_episode_tokens}"
                )
            finish = "max_episode_tokens"
            break
        params = dataclasses.replace(
            sampling, max_tokens=budget, seed=turn_seed(spec.seed, turns), stop_token_ids=tuple(stops)
        )
        try:
            completion = await engine.generate(list(tokens), params)
        except ValueError as e:
            raise EpisodeError(f"engine refused the request: {e}") from e
        if completion.finish_reason in ("error", "cancelled"):
            raise EpisodeError(f"engine {completion.finish_reason}: {completion.error}")
        if not completion.tokens:
            raise EpisodeError("engine returned no token")
        append(
            completion.tokens,
            True,
            [float(x) for x in completion.logprobs.tolist()],
            list(completion.versions),
        )
        turns += 1
        ended_with_stop = completion.tokens[-1] in stops
        text_ids = completion.tokens[:-1] if ended_with_stop else completion.tokens
        # Ids past the tokenizer (padding rows of a larger embedding) carry no text: the env never sees them.
        known = int(getattr(tokenizer, "vocab_size", 0) or 0)
        if known:
            text_ids = [t for t in text_ids if t < known]
        text = tokenizer.decode(text_ids, skip_special_tokens=True)
        try:
            obs, reward, terminated, truncated, step_info = await _call(executor, env.step, text)
            reward = float(reward)
        except ReplicaLost:
            raise
        except Exception as e:
            raise EpisodeError(f"env.step failed: {e!r}") from e
        total_reward += reward
        if terminated or truncated:
            finish = "terminated" if terminated else "truncated"
            break
        if not ended_with_stop:
            append([stops[0]], False)  # close the cut-off turn the way the template renders it
        append(template.encode_continuation(tokenizer, obs), False)

    traj = Trajectory(
        tokens=tokens,
        loss_mask=mask,
        behavior_logprobs=behavior,
        versions=versions,
        reward=total_reward,
        group_id=spec.group_id,
        info={
            "task_id": info.get("task_id"),
            "turns": turns,
            "finish": finish,
            "member": spec.member,
            "seed": spec.seed,  # with the task and the versions, what reproduces the episode
        },
    )
    try:
        traj.validate()
    except ValueError as e:
        raise EpisodeError(f"malformed trajectory: {e}") from e
    return traj
