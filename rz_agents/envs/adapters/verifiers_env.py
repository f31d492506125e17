"""A verifiers taskset as an rz_agents env: ``env.id: verifiers:NAME``.

verifiers 0.4 (the ``verifiers.v1`` API PRIME-RL trains with) splits an environment in two: a *taskset*
(an installed package exporting a ``vf.Taskset`` subclass in ``__all__``; its rows are ``vf.Task``s with a
prompt, a system prompt, their own fields and ``@vf.reward`` scoring methods) and a *harness* (the agent
program that calls the model over an OpenAI-compatible endpoint). Under rz_agents the policy is the agent:
the adapter plays the part of verifiers' ``null`` chat harness. ``reset`` loads the task (with verifiers'
own loader, ``verifiers.v1.utils.loaders.taskset_class``) and returns its system prompt and prompt as chat
messages, with the task's tools (its ``vf.Toolset``s, served in-process: ``verifiers_tools``); a turn that
calls tools gets their results as ``tool`` messages, and the first turn without a call ends the episode:
the conversation is recorded as a ``vf.Trace`` and scored with the task's own ``Task.score`` (rewards,
weights and metrics as verifiers computes them). What does not map (sandboxed or remote tool servers,
runtime-reading rewards, LLM judges, multi-agent envs) is refused with one line, at config load where the
classes tell, else when the env is built: see docs/env_adapters.md.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from rz_agents.envs.adapters.verifiers_tools import ToolServers
from rz_agents.envs.adapters.verifiers_tools import problem as toolset_problem
from rz_agents.envs.base import Message, MultiTurnTextEnv
from rz_agents.envs.tool_calls import ToolCallError, parse_tool_calls

PINNED_VERSION = "0.4.0"  # what scripts/install.sh installs and the tests run against


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def import_v1(env_id: str) -> Any:
    """``verifiers.v1``, or a ValueError saying what is missing."""
    try:
        import verifiers
    except ImportError:
        raise ValueError(
            f"env.id {env_id!r}: the verifiers package is not installed (pip install "
            f"verifiers=={PINNED_VERSION}, or bash scripts/install.sh)"
        ) from None
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        version = getattr(verifiers, "__version__", "?")
        raise ValueError(
            f"env.id {env_id!r}: rz_agents runs verifiers' v1 API (verifiers >= 0.4); the installed "
            f"verifiers {version} has none ({_one_line(exc)})"
        ) from exc
    return vf


def taskset_class(env_id: str, name: str) -> type:
    """The taskset class verifiers' own loader finds for ``name``; ValueError in one line otherwise."""
    import_v1(env_id)
    from verifiers.v1.utils.loaders import taskset_class as load_class

    try:
        return load_class(name)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f"env.id {env_id!r}: {_one_line(exc)}") from exc


def _needs_runtime(fn: Callable[..., Any]) -> bool:
    """True when a scoring function takes a ``runtime`` (a sandbox) with no default, as verifiers reads it."""
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def _class_problem(cls: type, name: str) -> str | None:
    """What of taskset ``name`` (class ``cls``) cannot run here, read from the classes alone (nothing is
    loaded)."""
    import verifiers.v1 as vf
    from verifiers.v1.utils.generic import concrete_type
    from verifiers.v1.utils.loaders import environment_class

    env_cls = environment_class(name)
    if env_cls is not vf.SingleAgentEnv:
        return (
            f"its package exports the Env {env_cls.__name__} (a multi-agent env), which the adapter does "
            "not run; only single-agent tasksets map to a Gymnasium env"
        )
    task_cls = cls.task_type()
    if getattr(task_cls, "NEEDS_CONTAINER", False):
        return (
            f"its task {task_cls.__name__} needs a container (NEEDS_CONTAINER), "
            "which the adapter does not run"
        )
    try:  # tool servers, as the default configs declare them
        config_cls = concrete_type(cls, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
        toolsets = [*cls.toolsets(config_cls(id=name)), *task_cls.toolsets(task_cls.config_type()())]
    except Exception:  # noqa: BLE001 - a config that needs fields: checked on the built env instead
        toolsets = []
    for toolset in toolsets:
        if found := toolset_problem(toolset):
            return found
    rewards = [fn for klass in task_cls.__mro__ for fn in vars(klass).values() if hasattr(fn, "reward")]
    runtime = sorted(fn.__name__ for fn in rewards if _needs_runtime(fn))
    if runtime:
        return (
            f"reward(s) {', '.join(runtime)} of {task_cls.__name__} read the task's runtime (a sandbox), "
            "which the adapter does not run"
        )
    return None


def _instance_problem(taskset: Any, task: Any) -> str | None:
    """What of a built taskset and one of its tasks cannot run here (remote or sandboxed tool servers,
    judges, no reward)."""
    for toolset in [*type(taskset).toolsets(taskset.config), *task.toolsets(task.config)]:
        if found := toolset_problem(toolset):
            return found
    if task.config.judges:
        names = ", ".join(type(j).__name__ for j in task.plugged_judges())
        return f"its task config plugs judges ({names}), which call a judge model over the network"
    rewards = task.hooks("reward")
    runtime = sorted(fn.__name__ for fn in rewards if _needs_runtime(fn))
    if runtime:
        return (
            f"reward(s) {', '.join(runtime)} read the task's runtime (a sandbox), "
            "which the adapter does not run"
        )
    if not rewards:
        return f"its task {type(task).__name__} has no @vf.reward: every episode would score 0"
    return None


def resolve(env_id: str, name: str) -> Any:
    """The EnvTarget of ``verifiers:NAME``: the taskset is found and its classes checked, nothing loaded."""
    from rz_agents.envs.resolve import EnvTarget

    cls = taskset_class(env_id, name)
    problem = _class_problem(cls, name)
    if problem:
        raise ValueError(f"env.id {env_id!r}: {problem}")

    def make(config: dict[str, Any] | None = None, max_turns: int = 4) -> VerifiersEnv:
        return VerifiersEnv(name, config=config, max_turns=max_turns)

    make.__qualname__ = make.__name__ = "VerifiersEnv"
    return EnvTarget(env_id, cls=make)


# a taskset's rows, loaded once per process and config (the env pool builds many envs of one taskset)
_ROWS: dict[str, list[Any]] = {}


class _Loop:
    """A private event loop on a daemon thread: an env's coroutines (scoring, its tool servers) all run there,
    so what a toolset opens stays on one loop, whichever rollout thread calls the env."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="rz-verifiers-env", daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


_CALL_BLOCK = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.DOTALL)


class VerifiersEnv(MultiTurnTextEnv):
    """One verifiers taskset (``taskset``, a verifiers taskset id) played as verifiers' chat harness plays it:
    the policy's turns go on while they call tools (``<tool_call>`` in the Qwen3/Hermes format, answered as
    ``tool`` messages by the task's toolsets, served in-process) and the first turn without a call ends the
    episode, scored by the task's own rewards; at the turn limit the conversation so far is scored.

    ``config`` holds the taskset config's fields (``num_tasks``, ``task: {...}`` ... as verifiers'
    ``--env.taskset.*`` flags would). A task given to ``reset`` is ``{"idx": i}`` (the taskset's i-th row),
    ``{"id": ...}`` (the row with that ``TaskData.id``), or the fields of a row (built with the taskset's own
    task and data classes); with none, a row is drawn with the reset seed.
    """

    def __init__(self, taskset: str, config: dict[str, Any] | None = None, max_turns: int = 4) -> None:
        super().__init__(max_turns=max_turns)
        from pydantic import ValidationError
        from verifiers.v1.utils.generic import concrete_type

        vf = import_v1(f"verifiers:{taskset}")
        self._vf = vf
        self.name = taskset
        cls = taskset_class(f"verifiers:{taskset}", taskset)
        config_cls = concrete_type(cls, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
        try:
            self.config = config_cls(**{**(config or {}), "id": taskset})
        except ValidationError as exc:
            raise ValueError(f"env.kwargs.config: {config_cls.__name__}: {_one_line(exc)}") from None
        self.taskset = cls(self.config)
        self._rows: list[Any] | None = None
        self._task: Any = None
        self._messages: list[Any] = []  # the episode's conversation, as verifiers messages
        self._sampled: list[bool] = []  # which of them the policy wrote
        self._loop = _Loop()
        self._shared: ToolServers | None = None  # the taskset's toolsets, set up at the first reset
        self._episode_tools = ToolServers()  # the task's toolsets, one set per episode
        if self.taskset.bounded:
            self.rows()  # what does not map (tools, judges, no reward) fails here, when the env is built

    # --- the taskset's rows -----------------------------------------------------------------
    def rows(self) -> list[Any]:
        """The taskset's tasks, loaded once (each one checked for what does not map)."""
        if self._rows is None:
            if not self.taskset.bounded:
                raise ValueError(f"verifiers taskset {self.name!r} is infinite: give env.tasks (row fields)")
            key = (
                f"{type(self.taskset).__module__}.{type(self.taskset).__qualname__}:"
                f"{self.config.model_dump_json()}"
            )
            rows = _ROWS.get(key)
            if rows is None:
                rows = list(self.taskset)
                if not rows:
                    raise ValueError(f"verifiers taskset {self.name!r} loaded no task")
                problem = _instance_problem(self.taskset, rows[0])
                if problem:
                    raise ValueError(f"env.id 'verifiers:{self.name}': {problem}")
                _ROWS[key] = rows
            self._rows = rows
        return self._rows

    def _pick(self, task: dict[str, Any] | None, rng: np.random.Generator) -> Any:
        if task is None:
            rows = self.rows()
            return rows[int(rng.integers(len(rows)))]
        if set(task) == {"idx"}:
            rows, i = self.rows(), task["idx"]
            if not isinstance(i, int) or not 0 <= i < len(rows):
                raise ValueError(f"task {task!r}: idx must be an int in [0, {len(rows)})")
            return rows[i]
        if set(task) == {"id"}:
            found = [t for t in self.rows() if t.data.id == task["id"]]
            if not found:
                raise ValueError(f"task {task!r}: verifiers taskset {self.name!r} has no row with that id")
            return found[0]
        task_cls = type(self.taskset).task_type()
        data = task_cls.data_type().model_validate(task)
        if self.taskset.system_prompt is not None:
            data = data.model_copy(update={"system_prompt": self.taskset.system_prompt})
        built = task_cls(data, self.config.task)
        problem = _instance_problem(self.taskset, built)
        if problem:
            raise ValueError(f"env.id 'verifiers:{self.name}': {problem}")
        return built

    # --- the episode ----------------------------------------------------------------------------
    def _reset(self, task: dict[str, Any] | None, rng: np.random.Generator) -> tuple[list[Message], dict]:
        from verifiers.v1.types import content_text

        vf = self._vf
        self._end_episode()
        self._task = self._pick(task, rng)
        data = self._task.data
        if data.prompt is None:
            raise ValueError(
                f"verifiers task {data.idx} has no prompt (the user opens the conversation: a user "
                "simulator, which the adapter does not run)"
            )
        prompt = [vf.UserMessage(content=data.prompt)] if isinstance(data.prompt, str) else list(data.prompt)
        if data.system_prompt is not None:
            prompt.insert(0, vf.SystemMessage(content=data.system_prompt))
        self._messages, self._sampled = list(prompt), [False] * len(prompt)
        if self._shared is None:
            self._shared = ToolServers()
            self._loop.run(self._shared.add(type(self.taskset).toolsets(self.config)))
        self._loop.run(self._episode_tools.add(self._task.toolsets(self._task.config), data))
        self.tools = [*self._shared.specs, *self._episode_tools.specs]
        messages = [{"role": m.role, "content": content_text(m.content)} for m in prompt]
        ident = data.id if data.id is not None else (data.name if data.name is not None else data.idx)
        return messages, {"task_id": None if ident is None else str(ident), "tools": list(self.tools)}

    def trace(self) -> Any:
        """The episode's conversation as a verifiers Trace (not yet scored)."""
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, TraceTask

        vf, task = self._vf, self._task
        nodes = [
            MessageNode(parent=i - 1 if i else None, message=m, sampled=sampled)
            for i, (m, sampled) in enumerate(zip(self._messages, self._sampled, strict=True))
        ]
        return vf.Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=AgentInfo(config=vf.AgentConfig()),
            tools=[vf.Tool.model_validate(t["function"]) for t in self.tools] if self.tools else [],
            nodes=nodes,
        )

    def _score(self) -> tuple[float, dict]:
        trace = self.trace()
        self._loop.run(self._task.score(trace))
        rewards = {k: (None if r is None else r.score) for k, r in trace.rewards.items()}
        return float(trace.reward), {"rewards": rewards, "metrics": dict(trace.metrics)}

    def _step(self, text: str) -> tuple[list[Message] | None, float, bool, dict]:
        vf = self._vf
        turn = parse_tool_calls(text, self.tools) if self.tools else None
        if turn is None or not turn.has_calls:  # a reply: the chat ends, the task scores it
            self._messages.append(vf.AssistantMessage(content=text))
            self._sampled.append(True)
            reward, info = self._score()
            self._end_episode()
            return None, reward, True, info
        calls, results = [], []
        for k, item in enumerate(turn.items):
            call_id = f"call_{self.turn}_{k}"
            if isinstance(item, ToolCallError):
                calls.append(vf.ToolCall(id=call_id, name="invalid", arguments=item.raw))
                results.append((call_id, item.message))
            else:
                calls.append(vf.ToolCall(id=call_id, name=item.name, arguments=json.dumps(item.arguments)))
                results.append(
                    (call_id, self._loop.run(self._episode_or_shared_call(item.name, item.arguments)))
                )
        content = _CALL_BLOCK.sub("", text).strip() or None
        self._messages.append(vf.AssistantMessage(content=content, tool_calls=calls))
        self._sampled.append(True)
        for call_id, result in results:
            self._messages.append(vf.ToolMessage(tool_call_id=call_id, content=result))
            self._sampled.append(False)
        return [{"role": "tool", "content": r} for _, r in results], 0.0, False, {}

    async def _episode_or_shared_call(self, name: str, arguments: dict[str, Any]) -> str:
        servers = self._episode_tools if name in self._episode_tools else self._shared
        return await servers.call(name, arguments)

    def _on_truncate(self) -> float:
        """At the turn limit the conversation so far is scored (verifiers scores a max_turns trace too)."""
        reward, _ = self._score()
        self._end_episode()
        return reward

    def _end_episode(self) -> None:
        self._loop.run(self._episode_tools.close())

    def close(self) -> None:
        """Close the episode's and the taskset's toolsets and the env's event loop; safe to call twice."""
        if not self._loop.loop.is_closed():
            self._end_episode()
            if self._shared is not None:
                self._loop.run(self._shared.close())
            self._loop.close()
        super().close()
