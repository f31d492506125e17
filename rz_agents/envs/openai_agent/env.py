"""``OpenAIAgentEnv``: train agent code written against the OpenAI API, unchanged.

Each episode runs the user's agent (a Python callable, or a command) against a token-exact session of an
``rz serve`` endpoint that the run's own engine serves; the user's scorer turns its result into the reward;
the session's recorded tokens (exactly what the engine sampled, with their log-probs and policy versions)
are the episode's Trajectory. The learner cannot tell it from one of the built-in agent loop: the same lag
bound, per-token versions, IS weights and bit-identity hold.

    env:
      id: rz_agents/OpenAIAgent-v0
      kwargs:
        agent: my_pkg.agent:solve        # solve(client: openai.OpenAI, task: dict) -> result
        scorer: my_pkg.agent:score       # score(task, result, messages) -> float
      # or  command: "python my_agent.py"  (OPENAI_BASE_URL / OPENAI_API_KEY / RZ_TASK in its environment,
      #      its stdout the result)

The session imposes the run's sampling (``rollout.temperature`` / ``top_k`` / ``top_p``), a seed per turn,
``rollout.limits.max_tokens_per_turn``, ``max_episode_tokens`` and ``max_turns``, whatever the agent asks
for; a request past those limits gets a 400 and the episode ends there (scored as it stands, result None).
The env's agent runs in the rollout's thread pool; its requests reach the engine through the server on the
run's event loop, so they batch with every other episode's. Under ``runtime: ray`` the env is built in the
driver (``runtime.factories.runs_own_agent``) and the server generates through the engine replicas' router.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import subprocess
import weakref
from collections.abc import Callable
from typing import Any

import gymnasium

from rz_agents.envs.base import ChatMessages, TurnText

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


class OpenAIAgentEnv(gymnasium.Env):
    """An episode = the user's OpenAI-API agent on one token-exact session of the run's engine.

    Args:
        agent: ``agent(client, task) -> result`` (callable or ``"module:function"``); ``client`` is an
            ``openai.OpenAI`` whose base URL is the episode's session.
        command: instead of ``agent``, a command line run once per episode with ``OPENAI_BASE_URL`` (the
            session), ``OPENAI_API_KEY`` and ``RZ_TASK`` (the task as JSON) set; its stdout (JSON if it
            parses) is the result.
        scorer: ``scorer(task, result, messages) -> float``: the reward (``messages``: the conversation as the
            server last saw it, the final assistant reply included). Default: the result itself.
        model_name: the model id the endpoint serves (what the agent passes as ``model``).
        timeout_s: a command's time limit.
        max_turns: the run's turn limit (set by the runtime from ``rollout.limits.max_turns``).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        agent: str | AgentFn | None = None,
        command: str | list[str] | None = None,
        scorer: str | ScorerFn | None = None,
        model_name: str = "policy",
        timeout_s: float = 600.0,
        max_turns: int | None = None,
    ) -> None:
        if (agent is None) == (command is None):
            raise ValueError(
                "OpenAIAgentEnv needs exactly one of agent= (a callable) or command= (a command line)"
            )
        self.agent = load_callable(agent, "agent") if agent is not None else None
        self.command = command
        self.scorer = load_callable(scorer, "scorer") if scorer is not None else _default_scorer
        self.model_name = model_name
        self.timeout_s = float(timeout_s)
        self.max_turns = max_turns
        self.observation_space = ChatMessages()
        self.action_space = TurnText()

    # The Gymnasium contract: an agent of this env is not driven step by step by rz's loop.
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        raise RuntimeError(
            "OpenAIAgentEnv runs its own agent against an rz serve session: the rollout calls "
            "run_agent_episode; it cannot be stepped with reset/step"
        )

    def step(self, action):
        raise RuntimeError("OpenAIAgentEnv cannot be stepped: see reset")

    # ---- the episode ------------------------------------------------------------------------------------
    async def run_agent_episode(self, engine, template, tokenizer, spec, sampling, limits, executor):
        """Run the agent on a fresh session of ``engine``'s endpoint; the session's Trajectory, scored."""
        from rz_agents.rollout.agent_loop import EpisodeError
        from rz_agents.serve import SessionPolicy

        http = await served_endpoint(engine, tokenizer, template, self.model_name)
        store = http.server.sessions
        session_id = f"episode-{spec.group_id}-{spec.member}-{spec.seed}"
        policy = SessionPolicy(
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            seed=spec.seed,
            max_tokens_per_turn=limits.max_tokens_per_turn,
            max_session_tokens=limits.max_episode_tokens,
            max_turns=self.max_turns or limits.max_turns,
        )
        session = store.open(session_id, policy)
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
        if self.agent is not None:
            import openai

            client = openai.OpenAI(base_url=base_url, api_key="rz", max_retries=0)
            try:
                return self.agent(client, task)
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


# One endpoint per engine: every episode of a run shares it (their requests batch in the engine), on the
# event loop the engine steps on. Keyed weakly so a finished run's engine is not kept alive.
_ENDPOINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def served_endpoint(engine, tokenizer, template, model_name: str = "policy"):
    """The running ``rz serve`` endpoint of ``engine`` on this event loop (started on first use)."""
    from rz_agents.serve import OpenAIServer, start_in_loop

    loop = asyncio.get_running_loop()
    entry = _ENDPOINTS.get(engine)
    if entry is not None and entry[0] is loop and entry[1].running:
        return entry[1]
    lock = _start_locks.setdefault(loop, asyncio.Lock())
    async with lock:  # concurrent first episodes start one server
        entry = _ENDPOINTS.get(engine)
        if entry is not None and entry[0] is loop and entry[1].running:
            return entry[1]
        http = await start_in_loop(OpenAIServer(engine, tokenizer, template, model_name=model_name))
        _ENDPOINTS[engine] = (loop, http)
        return http


_start_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
