"""One episode: env + engine, token in / token out.

The conversation is kept as tokens from start to end. The prompt is rendered once with the chat template;
after each sampled turn, the env's new messages are rendered with ``encode_continuation`` and appended
(loss mask False). Sampled tokens are never decoded and re-encoded: the decoded text only goes to the env.

Observations may hold images (content parts, ``rz_agents.images``): they go to the template with their
messages (a template that renders them says so with ``renders_images = True``; a text-only template is a
clear EpisodeError) and into ``Trajectory.images`` as PNG bytes, in the order they appear.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from rz_agents.images import message_images, to_png
from rz_agents.trajectory import NOT_SAMPLED, Trajectory


class EpisodeError(RuntimeError):
    """An episode could not complete (engine error, env failure, bad observation); it is dropped."""


class InfraFailure(EpisodeError):
    """The episode was lost to infrastructure, not to the policy: its env worker, sandbox or desktop died,
    or the env raised an exception the run names as infrastructure (``rollout.infra_exceptions``), or the
    env said so (``info["infra_failure"]``, a reason string, from reset or step). The controller runs it
    again (``rollout.max_episode_reruns``) and otherwise masks it: it is left out of its group (baseline and
    loss) and counted (``rollout_infra_failed``), never scored."""


class ReplicaLost(InfraFailure):
    """The engine replica or env worker serving the episode died (Ray runtime); the episode can be run
    again from its start (the controller does, up to ``rollout.max_episode_reruns`` times)."""


@dataclass
class EpisodeSpec:
    """What to run: the task (None lets the env draw one), its group, and the seeds.

    ``seed`` seeds the sampling of this member; ``reset_seed`` (default: ``seed``) seeds ``env.reset``.
    The controller gives every member of a group the group's reset seed, so an env that draws its own
    task from the seed poses the same task to the whole group (the group-mean baseline compares samples
    of one prompt).
    """

    task: dict[str, Any] | None
    group_id: int
    member: int
    seed: int
    reset_seed: int | None = None


@dataclass
class EpisodeLimits:
    """Per-episode bounds. max_episode_tokens must stay below the engine's max_len."""

    max_turns: int = 4  # policy turns per episode; the episode is truncated after the last
    max_tokens_per_turn: int = 256  # tokens the policy may sample in one turn
    max_episode_tokens: int = 2048  # prompt + every turn and observation: the episode is truncated past it


def turn_seed(episode_seed: int, turn: int) -> int:
    """A distinct, reproducible sampling seed per (episode, turn)."""
    return (episode_seed * 1_000_003 + turn * 7919) % (2**63 - 1)


async def call_env(executor: Executor | None, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` on ``executor``'s threads (the loop's default executor when None).

    Env calls block (subprocesses, browsers, sleeps): they run off the event loop, so that other episodes and
    the engine go on meanwhile. Size the pool to the env calls that may block at once. An env living
    elsewhere (a Ray env worker) has coroutine methods: they are awaited as they are.
    """
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor, lambda: fn(*args, **kwargs))


@dataclass
class _Transcript:
    """The episode's tokens so far, with their loss mask, behavior log-probs and policy versions."""

    tokens: list[int]
    mask: list[bool]
    behavior: list[float]
    versions: list[int]
    images: list[bytes] = dataclasses.field(default_factory=list)  # PNG bytes, in order of appearance

    @classmethod
    def of_prompt(cls, prompt: Sequence[int]) -> _Transcript:
        n = len(prompt)
        return cls([int(t) for t in prompt], [False] * n, [0.0] * n, [NOT_SAMPLED] * n)

    def add_images(self, messages: Sequence[dict[str, Any]]) -> None:
        """Keep the images of messages just rendered into the tokens (lossless PNG)."""
        self.images.extend(message_pngs(messages))

    def add_context(self, ids: Sequence[int]) -> None:
        """Tokens the policy did not sample (observations, template glue): masked out of the loss."""
        self.tokens.extend(int(t) for t in ids)
        self.mask.extend([False] * len(ids))
        self.behavior.extend([0.0] * len(ids))
        self.versions.extend([NOT_SAMPLED] * len(ids))

    def add_sampled(self, completion) -> None:
        """A completion's tokens with the log-probs and versions the engine sampled them at."""
        self.tokens.extend(int(t) for t in completion.tokens)
        self.mask.extend([True] * len(completion.tokens))
        self.behavior.extend(float(x) for x in completion.logprobs.tolist())
        self.versions.extend(int(v) for v in completion.versions)


def message_pngs(messages: Sequence[dict[str, Any]]) -> list[bytes]:
    """The images of ``messages`` as PNG bytes, in order of appearance: what a Trajectory keeps and what a
    request's images are made of (lossless, so the learner re-encodes exactly the pixels the policy saw)."""
    return [to_png(image) for image in message_images(messages)]


def image_request(template, pngs: Sequence[bytes]) -> dict[str, Any]:
    """``engine.generate``'s keyword arguments for a prompt whose image runs hold ``pngs`` (in order):
    ``{"images": template.image_prompt(pngs)}`` with a vision-language template (its checkpoint's image
    preprocessing), else none (no images, or a template that renders images as text). The rollout loop and
    the evaluation's checkpoint policy (eval/osworld_policies.py) both send images this way."""
    image_prompt = getattr(template, "image_prompt", None)
    return {"images": image_prompt(list(pngs))} if pngs and image_prompt else {}


async def _sample_turn(engine, transcript: _Transcript, params, template=None):
    """One policy turn from the engine; EpisodeError when it cannot give one.

    A transcript with images sends them all with the request when the template makes one
    (``template.image_prompt``: a vision-language template; a template that renders images as text has
    none): a multi-turn prompt repeats earlier pictures, which the engine encodes once (cached by content)."""
    kwargs = image_request(template, transcript.images)
    try:
        completion = await engine.generate(list(transcript.tokens), params, **kwargs)
    except ValueError as e:
        raise EpisodeError(f"engine refused the request: {e}") from e
    if completion.finish_reason in ("error", "cancelled"):
        raise EpisodeError(f"engine {completion.finish_reason}: {completion.error}")
    if not completion.tokens:
        raise EpisodeError("engine returned no token")
    return completion


def _sampled_vision_token(template, tokens: Sequence[int]) -> bool:
    """Whether a turn holds a vision special token the template writes (``vision_token_ids``)."""
    special = set(getattr(template, "vision_token_ids", ()))
    return bool(special) and not special.isdisjoint(int(t) for t in tokens)


def _turn_text(tokenizer, tokens: Sequence[int], stops: Sequence[int]) -> tuple[str, bool]:
    """The decoded text the env sees (without the stop token), and whether the turn ended on one."""
    ended_with_stop = tokens[-1] in stops
    text_ids = tokens[:-1] if ended_with_stop else tokens
    # Ids past the tokenizer (padding rows of a larger embedding) carry no text: the env never sees them.
    known = int(getattr(tokenizer, "vocab_size", 0) or 0)
    if known:
        text_ids = [t for t in text_ids if t < known]
    return tokenizer.decode(text_ids, skip_special_tokens=True), ended_with_stop


def _returned(result: Any, method: str, expected: str, n: int) -> tuple:
    """``result`` as the n-tuple ``method`` must return; EpisodeError saying what came instead."""
    if not isinstance(result, tuple) or len(result) != n:
        got = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
        raise EpisodeError(f"{method} returned {got}; expected a tuple {expected}")
    return result


def _observation(obs: Any, method: str, role: str) -> list[dict[str, str]]:
    """The env's observation as chat messages; EpisodeError naming the method and what it returned."""
    from rz_agents.envs.base import as_messages

    try:
        return as_messages(obs, role=role)
    except (TypeError, ValueError) as e:
        raise EpisodeError(f"{method} returned a bad observation: {e}") from e


async def run_episode(
    engine,
    env,
    template,
    tokenizer,
    spec: EpisodeSpec,
    sampling,
    limits: EpisodeLimits,
    executor: Executor | None = None,
    infra_exceptions: Sequence[str] = (),
) -> Trajectory:
    """Run one episode to its end and return its Trajectory; raises EpisodeError if it cannot complete, and
    InfraFailure (an EpisodeError) if infrastructure lost it.

    ``sampling`` is the engine's SamplingParams template: max_tokens, seed and stop_token_ids are set per
    turn.
    ``infra_exceptions``: names of exception classes which, raised by env.reset or env.step (the class or a
    base of it), mean the infrastructure failed (e.g. an env's own ``TimeoutError`` waiting for a desktop).
    """
    name = type(getattr(env, "unwrapped", env)).__name__
    reset_seed = spec.seed if spec.reset_seed is None else spec.reset_seed
    messages, info = await _reset(env, name, reset_seed, spec.task, executor, infra_exceptions)
    _check_images(template, messages, f"{name}.reset")
    transcript = _Transcript.of_prompt(
        template.encode_prompt(tokenizer, messages, tools=info.get("tools") or None)
    )
    transcript.add_images(messages)
    stops: tuple[int, ...] = tuple(template.stop_token_ids(tokenizer))
    total_reward, turns, finish = 0.0, 0, "max_turns"
    while turns < limits.max_turns:
        budget = min(limits.max_tokens_per_turn, limits.max_episode_tokens - len(transcript.tokens))
        if budget < 1:
            if turns == 0:
                raise EpisodeError(
                    f"the prompt has {len(transcript.tokens)} tokens: no room to sample within "
                    f"max_episode_tokens={limits.max_episode_tokens}"
                )
            finish = "max_episode_tokens"
            break
        params = dataclasses.replace(
            sampling, max_tokens=budget, seed=turn_seed(spec.seed, turns), stop_token_ids=stops
        )
        completion = await _sample_turn(engine, transcript, params, template)
        transcript.add_sampled(completion)
        turns += 1
        text, ended_with_stop = _turn_text(tokenizer, completion.tokens, stops)
        role = "tool" if info.get("tools") else "user"
        obs, reward, terminated, truncated = await _step(env, name, text, role, executor, infra_exceptions)
        total_reward += reward
        if terminated or truncated:
            finish = "terminated" if terminated else "truncated"
            break
        if _sampled_vision_token(template, completion.tokens):
            # An ordinary token to the engine and the learner in the turn it was sampled in, but the next
            # request's prompt would hold it where the engine expects the template's image placeholders:
            # the episode ends here (its reward so far stands).
            finish = "sampled_vision_token"
            break
        if not ended_with_stop:
            transcript.add_context([stops[0]])  # close the cut-off turn the way the template renders it
        _check_images(template, obs, f"{name}.step")
        transcript.add_context(template.encode_continuation(tokenizer, obs))
        transcript.add_images(obs)
    episode = {"task_id": info.get("task_id"), "turns": turns, "finish": finish, "reset_seed": reset_seed}
    return _trajectory(transcript, total_reward, spec, episode)


def _check_images(template, messages: Sequence[dict[str, Any]], method: str) -> None:
    """EpisodeError when ``messages`` hold images and ``template`` renders text only."""
    if getattr(template, "renders_images", False):
        return
    n = len(message_images(messages))
    if n:
        raise EpisodeError(
            f"{method} returned {n} image(s) but the chat template {type(template).__name__} renders text "
            "only (no renders_images = True): train on image observations with a vision-language model's "
            "template"
        )


def _env_failure(method: str, e: Exception, infra_exceptions: Sequence[str]) -> EpisodeError:
    """The error for an exception an env call raised: InfraFailure when its class (or a base of it) is named
    in ``infra_exceptions``, EpisodeError otherwise."""
    names = {c.__name__ for c in type(e).__mro__}
    kind = InfraFailure if names & set(infra_exceptions) else EpisodeError
    return kind(f"{method} failed: {type(e).__name__}: {e}")


def _check_infra(info: Any, method: str) -> None:
    """InfraFailure when the env's info dict reports one (``info["infra_failure"]``: the reason)."""
    reason = info.get("infra_failure") if isinstance(info, dict) else None
    if reason:
        raise InfraFailure(f"{method} reported an infrastructure failure: {reason}")


async def _reset(
    env, name: str, seed: int, task, executor: Executor | None, infra_exceptions: Sequence[str] = ()
) -> tuple[list, dict]:
    """``env.reset`` for the episode: (its first messages, its info dict); EpisodeError when it fails or
    returns something else, InfraFailure when infrastructure failed it."""
    try:
        result = await call_env(executor, env.reset, seed=seed, options={"task": task})
    except InfraFailure:
        raise
    except Exception as e:
        raise _env_failure("env.reset", e, infra_exceptions) from e
    obs, info = _returned(result, f"{name}.reset", "(observation, info)", 2)
    _check_infra(info, f"{name}.reset")
    messages = _observation(obs, f"{name}.reset", "user")
    if not isinstance(info, dict):
        raise EpisodeError(f"{name}.reset returned info of type {type(info).__name__}; expected a dict")
    return messages, info


async def _step(
    env, name: str, text: str, role: str, executor: Executor | None, infra_exceptions: Sequence[str] = ()
) -> tuple[list, float, bool, bool]:
    """``env.step(text)``: (the observation as messages of ``role``, the reward as a float, terminated,
    truncated); EpisodeError when it fails or returns something else, InfraFailure when infrastructure
    failed it (then its reward is never used)."""
    try:
        result = await call_env(executor, env.step, text)
    except InfraFailure:
        raise
    except Exception as e:
        raise _env_failure("env.step", e, infra_exceptions) from e
    obs, reward, terminated, truncated, info = _returned(
        result, f"{name}.step", "(observation, reward, terminated, truncated, info)", 5
    )
    _check_infra(info, f"{name}.step")
    obs = _observation(obs, f"{name}.step", role)
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        raise EpisodeError(
            f"{name}.step returned a reward of type {type(reward).__name__} ({reward!r:.40}); "
            "expected a number"
        ) from None
    return obs, reward, terminated, truncated


def _trajectory(transcript: _Transcript, reward: float, spec: EpisodeSpec, episode: dict) -> Trajectory:
    """The validated Trajectory of a finished episode (EpisodeError if it is malformed)."""
    traj = Trajectory(
        tokens=transcript.tokens,
        loss_mask=transcript.mask,
        behavior_logprobs=transcript.behavior,
        versions=transcript.versions,
        reward=reward,
        group_id=spec.group_id,
        images=transcript.images,
        info={
            "task_id": episode["task_id"],
            "turns": episode["turns"],
            "finish": episode["finish"],
            "member": spec.member,
            # with the task and the versions, what reproduces the episode
            "seed": spec.seed,
            "reset_seed": episode["reset_seed"],
        },
    )
    try:
        traj.validate()
    except ValueError as e:
        raise EpisodeError(f"malformed trajectory: {e}") from e
    return traj


class AgentLoop:
    """The default episode runner (``agent.kind: loop``; rollout/episode_runner.py): ``run_episode`` above,
    stepping the env the controller gives it."""

    uses_env = True

    async def run_episode(
        self,
        engine,
        env,
        template,
        tokenizer,
        spec: EpisodeSpec,
        sampling,
        limits: EpisodeLimits,
        executor: Executor | None = None,
        infra_exceptions: Sequence[str] = (),
    ) -> Trajectory:
        """One episode of ``env`` (see the module's ``run_episode``)."""
        return await run_episode(
            engine, env, template, tokenizer, spec, sampling, limits, executor, infra_exceptions
        )
