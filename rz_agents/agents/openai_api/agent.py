"""``OpenAIAPIAgent``: train agent code written against the OpenAI API, unchanged (``agent.kind: openai``).

An episode runner (rollout/episode_runner.py), not an env: each episode runs the user's agent (a Python
callable, or a command) against a token-exact session of an ``rz serve`` endpoint that the run's own engine
serves (endpoint.py); the user's scorer turns its result into the reward; the session's recorded tokens
(exactly what the engine sampled, with their log-probs and policy versions) are the episode's Trajectory.
The learner cannot tell it from one of the built-in agent loop: the same lag bound, per-token versions, IS
weights and bit-identity hold. Configured by ``agent.openai`` (rz_agents/agents/spec.py).

The session imposes the run's sampling (``rollout.temperature`` / ``top_k`` / ``top_p``), a seed per turn,
``rollout.limits.max_tokens_per_turn``, ``max_episode_tokens`` and ``max_turns``, whatever the agent asks
for; a request past those limits gets a 400 and the episode ends there (scored as it stands, result None).
The agent runs in the rollout's thread pool; its requests reach the engine through the server on the run's
event loop, so they batch with every other episode's. Under ``runtime: ray`` the controller (and so this
runner) lives in the driver, and the server generates through the engine replicas' router.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

from rz_agents.agents.openai_api.endpoint import served_endpoint
from rz_agents.rollout.agent_loop import EpisodeError, EpisodeLimits, EpisodeSpec
from rz_agents.serve import SessionPolicy
from rz_agents.trajectory import Trajectory

AgentFn = Callable[[Any, dict[str, Any]], Any]
ScorerFn = Callable[..., float]


class AgentError(RuntimeError):
    """The user's agent or scorer failed (the episode is dropped and counted)."""


def load_callable(spec: str | Callable, what: str) -> Callable:
    """A callable, or ``"module:function"`` imported; ValueError naming ``what`` otherwise."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"{what} must be a callable or 'module:function', got {spec!r}")
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{what} {spec!r}: {e}") from e
    if not callable(fn):
        raise ValueError(f"{what} {spec!r} is not callable")
    return fn


def _default_scorer(task: dict[str, Any], result: Any, messages: list[dict[str, Any]]) -> float:
    """The agent's result as the reward (an agent that scores itself)."""
    try:
        return float(result)
    except (TypeError, ValueError):
        raise AgentError(f"no scorer given and the agent's result {result!r:.60} is not a number") from None


def episode_session_policy(spec: EpisodeSpec, sampling, limits: EpisodeLimits) -> SessionPolicy:
    """What a training episode's session imposes on every request: the run's sampling, a seed of the
    episode's own, and the episode's limits (whatever the agent asks for)."""
    return SessionPolicy(
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        seed=spec.seed,
        max_tokens_per_turn=limits.max_tokens_per_turn,
        max_session_tokens=limits.max_episode_tokens,
        max_turns=limits.max_turns,
    )


class OpenAIAPIAgent:
    """An episode = the user's OpenAI-API agent on one token-exact session of the run's engine.

    Args:
        function: ``function(client, task) -> result`` (callable or ``"module:function"``); ``client`` is an
            ``openai.OpenAI`` whose base URL is the episode's session.
        command: instead of ``function``, a command line run once per episode with ``OPENAI_BASE_URL`` (the
            session), ``OPENAI_API_KEY`` and ``RZ_TASK`` (the task as JSON) set; its stdout (JSON if it
            parses) is the result.
        scorer: ``scorer(task, result, messages) -> float``: the reward (``messages``: the conversation as the
            server last saw it, the final assistant reply included). Default: the result itself.
        model_name: the model id the endpoint serves (what the agent passes as ``model``).
        timeout_s: a command's time limit.
    """

    uses_env = False  # it drives its episode itself: the controller builds no env for it

    def __init__(
        self,
        function: str | AgentFn | None = None,
        command: str | list[str] | None = None,
        scorer: str | ScorerFn | None = None,
        model_name: str = "policy",
        timeout_s: float = 600.0,
    ) -> None:
        if (function is None) == (command is None):
            raise ValueError(
                "the OpenAI-API agent needs exactly one of function= (a callable) or command= "
                "(a command line)"
            )
        self.function = load_callable(function, "agent function") if function is not None else None
        self.command = command
        self.scorer = load_callable(scorer, "scorer") if scorer is not None else _default_scorer
        self.model_name = model_name
        self.timeout_s = float(timeout_s)

    # ---- the episode ------------------------------------------------------------------------------------
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
        """Run the agent on a fresh session of ``engine``'s endpoint; the session's Trajectory, scored.
        ``env`` is None (``uses_env`` is False) and ``infra_exceptions`` name env exceptions: both unused."""
        http = await served_endpoint(engine, tokenizer, template, self.model_name)
        store = http.server.sessions
        session_id = f"episode-{spec.group_id}-{spec.member}-{spec.seed}"
        session = store.open(session_id, episode_session_policy(spec, sampling, limits))
        task = dict(spec.task or {})
        loop = asyncio.get_running_loop()
        try:
            try:
                result = await loop.run_in_executor(
                    executor, self._run_agent, http.session_url(session_id), task
                )
            except Exception as e:
                if session.limit_reached is None or not session.turns:
                    raise EpisodeError(f"the agent failed: {type(e).__name__}: {e}") from e
                result = None  # it asked past the episode's limits: the episode ends as it stands
            messages = list(session.messages)
            try:
                reward = await loop.run_in_executor(executor, self._score, task, result, messages)
            except Exception as e:
                raise EpisodeError(f"the scorer failed: {type(e).__name__}: {e}") from e
            if not session.turns:
                raise EpisodeError("the agent made no request to its session: nothing was sampled to train")
            info = {
                "task_id": task.get("id"),
                "finish": session.limit_reached or "agent_returned",
                "member": spec.member,
                "seed": spec.seed,
                "reset_seed": spec.reset_seed,
            }
            try:
                return session.trajectory(reward, spec.group_id, info)
            except ValueError as e:
                raise EpisodeError(f"malformed session trajectory: {e}") from e
        finally:
            store.close(session_id)

    def _run_agent(self, base_url: str, task: dict[str, Any]) -> Any:
        if self.function is not None:
            import openai

            client = openai.OpenAI(base_url=base_url, api_key="rz", max_retries=0)
            try:
                return self.function(client, task)
            finally:
                client.close()
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "rz", "RZ_TASK": json.dumps(task)}
        done = subprocess.run(
            self.command,
            shell=isinstance(self.command, str),
            env=env,
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
        )
        if done.returncode != 0:
            raise AgentError(f"agent command exited {done.returncode}: {done.stderr.strip()[-500:]}")
        out = done.stdout.strip()
        try:
            return json.loads(out)
        except json.JSONDecodeError:
            return out

    def _score(self, task: dict[str, Any], result: Any, messages: list[dict[str, Any]]) -> float:
        params = inspect.signature(self.scorer).parameters
        reward = self.scorer(task, result, messages) if len(params) >= 3 else self.scorer(task, result)
        return float(reward)
