"""``agent:`` of a run picks its episode runner (loop | openai), is validated with one line naming the bad
field, and the old spelling (the OpenAI agent as env.id rz_agents/OpenAIAgent-v0) loads into it with a
deprecation warning."""

from __future__ import annotations

import pytest
import yaml

from rz_agents.agents import AgentSpec, OpenAIAgentSpec, episode_runner
from rz_agents.agents.examples import openai_letters_agent
from rz_agents.agents.openai_api import OpenAIAPIAgent
from rz_agents.cli.train import load_run_config
from rz_agents.config_io import ConfigError, to_dict
from rz_agents.rollout import AgentLoop
from rz_agents.runtime import EnvSpec, TrainConfig

AGENTS = "rz_agents.agents.examples.openai_letters_agent"
OLD_AGENTS = "rz_agents.envs.examples.openai_letters_agent"  # where the example agent lived before


def _openai(**fields) -> AgentSpec:
    return AgentSpec(kind="openai", openai=OpenAIAgentSpec(**fields))


def test_the_runner_is_chosen_by_agent_kind_not_by_the_env():
    assert isinstance(episode_runner(AgentSpec()), AgentLoop)
    runner = episode_runner(_openai(function=f"{AGENTS}:agent", scorer=f"{AGENTS}:score", model_name="m"))
    assert isinstance(runner, OpenAIAPIAgent) and runner.model_name == "m"
    assert runner.function is openai_letters_agent.agent and runner.scorer is openai_letters_agent.score


def test_the_packaged_openai_agent_config_names_the_openai_runner_and_validates(tmp_path):
    cfg = load_run_config("openai-agent")
    assert cfg.agent == _openai(function=f"{AGENTS}:agent", scorer=f"{AGENTS}:score")
    assert cfg.env == EnvSpec()  # the agent steps no env


def test_the_old_spelling_loads_as_the_new_one_with_a_one_line_deprecation(tmp_path):
    new = load_run_config("openai-agent", validate=False)
    data = to_dict(new)
    del data["agent"]
    data["env"] = {
        "id": "rz_agents/OpenAIAgent-v0",
        "kwargs": {"agent": f"{OLD_AGENTS}:agent", "scorer": f"{OLD_AGENTS}:score"},
    }
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.warns(DeprecationWarning, match="env.id: rz_agents/OpenAIAgent-v0 is now agent:") as record:
        old = load_run_config(str(path))
    assert len([w for w in record if issubclass(w.category, DeprecationWarning)]) == 1
    assert to_dict(old) == to_dict(new)  # the moved example module is found under its new name too


def test_the_old_spelling_in_code_keeps_tasks_and_refuses_what_it_never_had():
    with pytest.warns(DeprecationWarning):
        cfg = TrainConfig(
            env=EnvSpec(id="rz_agents/OpenAIAgent-v0", kwargs={"command": "python a.py"}, tasks=[{"p": 1}])
        )
    assert cfg.agent == _openai(command="python a.py") and cfg.env == EnvSpec(tasks=[{"p": 1}])
    with pytest.raises(ValueError, match=r"unknown \['agnet'\]"):
        TrainConfig(env=EnvSpec(id="rz_agents/OpenAIAgent-v0", kwargs={"agnet": "x:y"}))
    with pytest.raises(ValueError, match="conflicts with rollout.limits.max_turns"):
        TrainConfig(env=EnvSpec(id="rz_agents/OpenAIAgent-v0", kwargs={"command": "a", "max_turns": 9}))
    with pytest.raises(ValueError, match="old spelling of agent: set only agent"):
        TrainConfig(env=EnvSpec(id="rz_agents/OpenAIAgent-v0"), agent=_openai(command="a"))


@pytest.mark.parametrize(
    "config, override, error",
    [
        ("demo", "agent.kind=cli", r"agent.kind must be one of \('loop', 'openai', 'miniswe'\), got 'cli'"),
        ("demo", "agent.kind=openai", "needs exactly one of agent.openai.function or .command"),
        ("demo", "agent.openai.command=python a.py", "agent.openai: is set but agent.kind is 'loop'"),
        ("openai-agent", "agent.openai.command=python a.py", "needs exactly one of agent.openai.function"),
        ("openai-agent", "agent.openai.timeout_s=0", "agent.openai.timeout_s must be > 0"),
        ("openai-agent", "env.id=rz_agents/GuessNumber-v0", "leave env.id and env.kwargs unset"),
    ],
)
def test_a_bad_agent_section_is_one_line_naming_the_field(config, override, error):
    with pytest.raises(ConfigError, match=error):
        load_run_config(config, [override])


def test_an_agent_function_that_does_not_import_fails_when_the_runner_is_built_naming_it():
    cfg = load_run_config("openai-agent", ["agent.openai.function=nope:x"])
    with pytest.raises(ValueError, match="agent function 'nope:x'"):
        episode_runner(cfg.agent)
