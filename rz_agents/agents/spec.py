"""``agent:`` of a run: which episode runner drives its episodes (rollout/episode_runner.py).

    agent:
      kind: loop            # default: rz's agent loop steps the run's env (env.id)

    agent:
      kind: openai          # the user's agent written against the OpenAI API, on rz serve sessions
      openai:
        function: my_pkg.agent:solve     # solve(client: openai.OpenAI, task: dict) -> result
        scorer: my_pkg.agent:score       # score(task, result, messages) -> float
        # or  command: "python my_agent.py"  (OPENAI_BASE_URL / OPENAI_API_KEY / RZ_TASK in its environment,
        #      its stdout the result)

    agent:
      kind: miniswe         # mini-swe-agent, unmodified, on Harbor terminal tasks (its venv:
      miniswe:              #   scripts/install_miniswe.sh); rz_agents/agents/miniswe/
        names: [csv-sum, git-tag]

With ``kind: openai`` or ``miniswe`` the run has no env: ``env.tasks`` are the tasks given to the agent,
and ``env.id`` / ``env.kwargs`` must stay unset. The old spelling, the agent as an env
(``env.id: rz_agents/OpenAIAgent-v0`` with ``env.kwargs: {agent, command, scorer, model_name, timeout_s}``),
still loads for one release, with a one-line deprecation warning (``from_legacy_env``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rz_agents.deprecation import warn_deprecated

AGENT_KINDS = ("loop", "openai", "miniswe")
LEGACY_OPENAI_ENV_ID = "rz_agents/OpenAIAgent-v0"
# the example agent lived under envs/ until the agents left it; an old config naming it still finds it
_MOVED_MODULES = {
    "rz_agents.envs.examples.openai_letters_agent": "rz_agents.agents.examples.openai_letters_agent",
}


@dataclass
class OpenAIAgentSpec:
    """``agent.openai``: the user's agent (``function`` or ``command``, exactly one) and its scorer.

    function: ``"module:function"``, called ``function(client, task) -> result`` with an ``openai.OpenAI``
      client whose base URL is the episode's session.
    command: instead, a command line run once per episode with ``OPENAI_BASE_URL`` (the session),
      ``OPENAI_API_KEY`` and ``RZ_TASK`` (the task as JSON) set; its stdout (JSON if it parses) is the result.
    scorer: ``"module:function"``, ``scorer(task, result, messages) -> float``: the reward (``messages``: the
      conversation as the server last saw it). Unset: the result itself is the reward.
    model_name: the model id the endpoint serves (what the agent passes as ``model``).
    timeout_s: a command's time limit.
    """

    function: str | None = None
    command: str | list[str] | None = None
    scorer: str | None = None
    model_name: str = "policy"
    timeout_s: float = 600.0


@dataclass
class MiniSweAgentSpec:
    """``agent.miniswe``: mini-swe-agent on Harbor terminal tasks (rz_agents/agents/miniswe/).

    python: the interpreter that has mini-swe-agent; null: ``$RZ_MINISWE_PYTHON``, else the venv
      scripts/install_miniswe.sh makes (``$RZ_MINISWE_VENV``, default /work/venvs/miniswe).
    configs: mini-swe-agent config specs merged in order (files, or its built-in names such as mini.yaml);
      null: rz's short prompts (agents/miniswe/rz_terminal.yaml). rz sets the model, environment and step
      limit (rollout.limits.max_turns) last.
    tasks: a folder of Harbor tasks (null: the packaged set), drawn from per episode when env.tasks is
      unset (otherwise each task of env.tasks is ``{path: DIR}``).
    names: only these task names of ``tasks`` (null: all).
    command_timeout_s: wall time of one command in the sandbox.
    timeout_s: wall time of one mini-swe-agent process (the episode is dropped past it).
    """

    python: str | None = None
    configs: list[str] | None = None
    tasks: str | None = None
    names: list[str] | None = None
    command_timeout_s: float = 30.0
    timeout_s: float = 900.0


@dataclass
class AgentSpec:
    """``agent:`` of a run: ``kind`` (loop | openai | miniswe) picks the episode runner; ``openai``
    configures the OpenAI-API agent (``kind: openai`` only), ``miniswe`` mini-swe-agent (``kind: miniswe``
    only)."""

    kind: str = "loop"
    openai: OpenAIAgentSpec = field(default_factory=OpenAIAgentSpec)
    miniswe: MiniSweAgentSpec = field(default_factory=MiniSweAgentSpec)

    def validate(self, env_is_default: bool) -> None:
        """Raise ValueError naming the bad field. ``env_is_default``: the run's ``env.id`` and ``env.kwargs``
        are unset (an agent that drives itself steps no env)."""
        if self.kind not in AGENT_KINDS:
            raise ValueError(f"agent.kind must be one of {AGENT_KINDS}, got {self.kind!r}")
        for name, default in (("openai", OpenAIAgentSpec()), ("miniswe", MiniSweAgentSpec())):
            if self.kind != name and getattr(self, name) != default:
                raise ValueError(
                    f"agent.{name}: is set but agent.kind is {self.kind!r}; set agent.kind: {name}"
                )
        if self.kind == "loop":
            return
        if self.kind == "openai":
            o = self.openai
            if (o.function is None) == (o.command is None):
                raise ValueError("agent.kind: openai needs exactly one of agent.openai.function or .command")
            if o.timeout_s <= 0:
                raise ValueError(f"agent.openai.timeout_s must be > 0, got {o.timeout_s}")
        else:
            m = self.miniswe
            for name in ("command_timeout_s", "timeout_s"):
                if getattr(m, name) <= 0:
                    raise ValueError(f"agent.miniswe.{name} must be > 0, got {getattr(m, name)}")
        if not env_is_default:
            raise ValueError(
                f"agent.kind: {self.kind} runs an agent that steps no env: leave env.id and env.kwargs unset "
                "(env.tasks are the tasks it is given)"
            )


def from_legacy_env(env_kwargs: dict[str, Any], max_turns: int) -> AgentSpec:
    """The ``agent:`` section meant by the old spelling ``env.id: rz_agents/OpenAIAgent-v0`` with these
    ``env.kwargs``, warned as deprecated; ValueError naming a key that spelling never had, or a
    ``max_turns`` other than the run's (``rollout.limits.max_turns``, which the agent's sessions follow)."""
    names = {"agent": "function", "command": "command", "scorer": "scorer", "model_name": "model_name",
             "timeout_s": "timeout_s", "max_turns": None}  # fmt: skip
    unknown = sorted(set(env_kwargs) - set(names))
    if unknown:
        raise ValueError(f"env.kwargs of {LEGACY_OPENAI_ENV_ID}: unknown {unknown}; known: {sorted(names)}")
    if env_kwargs.get("max_turns", max_turns) != max_turns:
        raise ValueError(
            f"env.kwargs.max_turns ({env_kwargs['max_turns']!r}) conflicts with rollout.limits.max_turns "
            f"({max_turns}): set only rollout.limits.max_turns"
        )
    warn_deprecated(
        f"env.id: {LEGACY_OPENAI_ENV_ID} is now agent: {{kind: openai, openai: {{function, command, scorer, "
        "model_name, timeout_s}}}} (env.kwargs.agent is agent.openai.function); the old spelling is accepted "
        "for one release"
    )
    fields = {new: _moved(env_kwargs[old]) for old, new in names.items() if new and old in env_kwargs}
    return AgentSpec(kind="openai", openai=OpenAIAgentSpec(**fields))


def _moved(value: Any) -> Any:
    """A ``module:function`` string whose module moved, under its new module name."""
    if isinstance(value, str):
        module, sep, name = value.partition(":")
        if sep and module in _MOVED_MODULES:
            return f"{_MOVED_MODULES[module]}:{name}"
    return value
