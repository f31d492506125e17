"""agent.kind: miniswe: mini-swe-agent, unmodified, runs per episode in its own interpreter against an rz
serve session of the run's engine, its commands executed in the episode's Harbor sandbox through the
command endpoint; the verifier scores the workspace and the session's tokens train with exact lag-0
log-probs. The tests that run mini-swe-agent skip when its venv (scripts/install_miniswe.sh) is absent."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rz_agents.agents import AgentSpec, MiniSweAgentSpec, episode_runner
from rz_agents.agents.miniswe import MiniSweAgent
from rz_agents.agents.miniswe.agent import SHIM_DIR, _base_env, miniswe_problem, miniswe_python
from rz_agents.agents.miniswe.command_endpoint import CommandEndpoint
from rz_agents.cli.train import load_run_config
from rz_agents.config_io import ConfigError
from rz_agents.engine import EngineConfig
from rz_agents.envs.harbor.env import ShellTaskEnv
from rz_agents.envs.harbor.shell import bwrap_problem
from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import LearnerSpec, LocalRun, RolloutSpec, TrainConfig
from rz_agents.trainer.optim import OptimConfig

needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"no sandbox: {bwrap_problem()}")
MINISWE_PROBLEM = miniswe_problem()
needs_miniswe = pytest.mark.skipif(MINISWE_PROBLEM is not None, reason=f"mini-swe-agent: {MINISWE_PROBLEM}")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def _post(url: str, body: object, token: str) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Authorization": f"Bearer {token}"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def sandbox():
    env = ShellTaskEnv(names=["csv-sum"], command_timeout_s=5)
    env.reset(seed=0)
    endpoint = CommandEndpoint(env)
    yield env, endpoint
    endpoint.close()
    env.close()


@needs_bwrap
def test_the_command_endpoint_runs_commands_in_the_episode_sandbox_for_its_token_only(sandbox):
    env, endpoint = sandbox
    status, out = _post(endpoint.url, {"command": "echo hi > note.txt && pwd"}, endpoint.token)
    assert status == 200 and out["returncode"] == 0 and out["output"].strip() == "/app"
    status, out = _post(endpoint.url, {"command": "cat note.txt; exit 3"}, endpoint.token)
    assert (out["output"].strip(), out["returncode"]) == ("hi", 3)  # files persist between commands
    status, out = _post(endpoint.url, {"command": "sleep 30", "timeout": 1}, endpoint.token)
    assert out["timed_out"] and out["returncode"] == -1 and "timed out" in out["error"]
    assert _post(endpoint.url, {"command": "ls"}, "wrong")[0] == 401
    assert _post(endpoint.url, b"{not json", endpoint.token)[0] == 400
    assert _post(endpoint.url, [1, 2], endpoint.token)[0] == 400
    assert _post(endpoint.url, {"command": "ls", "timeout": "x"}, endpoint.token)[0] == 400
    status, out = _post(endpoint.url, {"command": "  "}, endpoint.token)
    assert status == 200 and out["returncode"] == -1 and "non-empty" in out["error"]
    assert endpoint.commands == 4
    assert env.verify().reward == 0.0  # the untouched task still fails its verifier


@needs_bwrap
@needs_miniswe
def test_the_shim_environment_runs_mini_swe_agents_actions_in_the_sandbox_and_submits(sandbox):
    env, endpoint = sandbox
    probe = f"""
import json
from minisweagent.exceptions import Submitted
from rz_sandbox_environment import RzSandboxEnvironment
env = RzSandboxEnvironment(url={endpoint.url!r}, token={endpoint.token!r}, timeout=5)
first = env.execute({{"command": "echo made > made.txt; ls"}})
try:
    env.execute({{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo done"}})
    submitted = None
except Submitted as e:
    submitted = e.messages[0]["extra"]
print(json.dumps({{"first": first, "submitted": submitted, "vars": sorted(env.get_template_vars())}}))
"""
    env_vars = {**_base_env(), "MSWEA_GLOBAL_CONFIG_DIR": str(env.trial.dir)}
    done = subprocess.run(
        [miniswe_python(), "-c", probe], env=env_vars, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["first"]["returncode"] == 0 and "made.txt" in result["first"]["output"]
    assert result["submitted"] == {"exit_status": "Submitted", "submission": "done\n"}
    assert "token" not in result["vars"]  # the token never reaches the prompt templates
    assert str(SHIM_DIR) == env_vars["PYTHONPATH"]


class _ScriptedMiniSweAgent(MiniSweAgent):
    """The runner with mini-swe-agent's own scripted test model (``model_class: deterministic``) in place of
    the session: what the unmodified CLI, the shim and the sandbox do with commands that solve the task."""

    def __init__(self, commands: list[str], **kwargs) -> None:
        super().__init__(**kwargs)
        self.commands = commands

    def episode_config(self, *args) -> dict:
        config = super().episode_config(*args)
        outputs = [{"role": "assistant", "content": f"run {c}", "extra": {"actions": [{"command": c}]}}
                   for c in self.commands]  # fmt: skip
        config["model"] = {"model_class": "deterministic", "model_name": "scripted", "outputs": outputs}
        return config


@needs_bwrap
@needs_miniswe
@pytest.mark.parametrize("solve, reward", [(True, 1.0), (False, 0.0)])
def test_the_unmodified_mini_cli_solves_a_packaged_task_in_the_sandbox_and_the_verifier_scores_it(
    solve, reward
):
    right = ["echo 'Hello, world!' > /app/hello.txt"] if solve else ["echo 'Hello world' > /app/hello.txt"]
    agent = _ScriptedMiniSweAgent(
        [*right, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"], names=["hello-file"]
    )
    env = agent._make_env(3)
    env.reset(seed=0)
    endpoint = CommandEndpoint(env)
    try:
        run = agent._run_mini("http://127.0.0.1:9/unused", endpoint, env, EpisodeLimits(max_turns=3))
        assert run["returncode"] == 0, run["stderr"]
        assert (run["exit_status"], run["task_id"], endpoint.commands) == ("Submitted", "hello-file", 2)
        assert env.verify().reward == reward
    finally:
        endpoint.close()
        env.close()


@needs_bwrap
@needs_miniswe
def test_the_warm_start_episodes_are_the_unmodified_agents_own_conversation_with_todays_prompts(monkeypatch):
    # configs/miniswe-tiny.yaml warm-starts on these: a change to rz_terminal.yaml's templates (or to how
    # mini-swe-agent renders them) without rerunning the script would teach the policy a prompt it never sees
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # the script imports make_terminal_demos by name
    spec = importlib.util.spec_from_file_location(
        "make_miniswe_demos", ROOT / "scripts" / "make_miniswe_demos.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    messages, reward = script.scripted_episode("hello-file", script.COMMANDS["hello-file"][0])
    roles = [m["role"] for m in messages]
    assert reward == 1.0 and roles == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == "```bash\necho 'Hello, world!' > /app/hello.txt\n```"
    committed = (ROOT / "configs" / "miniswe-tiny-demos.jsonl").read_text().splitlines()
    assert json.dumps({"messages": messages, "tools": []}) in committed


def _cfg(steps: int) -> TrainConfig:
    return TrainConfig(
        mode="sync",
        steps=steps,
        num_threads=1,
        agent=AgentSpec(kind="miniswe", miniswe=MiniSweAgentSpec(names=["csv-sum"], command_timeout_s=10)),
        engine=EngineConfig(max_len=4096, max_running=8, max_batch_tokens=4096),
        rollout=RolloutSpec(
            group_size=2,
            groups_per_batch=1,
            max_concurrent_episodes=2,
            limits=EpisodeLimits(max_turns=2, max_tokens_per_turn=16, max_episode_tokens=4000),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-2), assert_lag0_exact=True),
    )


@needs_bwrap
@needs_miniswe
def test_mini_swe_agent_unmodified_trains_on_its_session_tokens_with_exact_lag0_logprobs():
    from rz_agents.agents.openai_api.endpoint import _ENDPOINTS

    run = LocalRun(_cfg(steps=1))
    try:
        summary = asyncio.run(run.train())
        counters = dict(_ENDPOINTS[run.engine][1].server.sessions.counters)
        history = run.loop.history
    finally:
        run.close()
    error = summary["first_episode_error"]
    assert summary["steps"] == 1 and summary["rollout"]["episodes_failed"] == 0, error
    assert summary["rollout"]["infra_failed"] == 0
    assert counters["sessions_opened"] == 2 and counters["session_requests"] >= 2
    assert history[0]["lag0_token_count"] > 0 and history[0]["lag0_abs_dlogp_max"] == 0.0  # every segment
    assert history[0]["is_weight_max"] == 1.0 == history[0]["is_weight_min"]


def test_a_bad_miniswe_section_is_one_line_naming_the_field():
    with pytest.raises(ConfigError, match="agent.miniswe: is set but agent.kind is 'loop'"):
        load_run_config("demo", ["agent.miniswe.timeout_s=5"])
    with pytest.raises(ConfigError, match="agent.kind: miniswe runs an agent that steps no env"):
        load_run_config("demo", ["agent.kind=miniswe"])
    with pytest.raises(ConfigError, match="agent.miniswe.command_timeout_s must be > 0"):
        overrides = ["agent.openai.function=null", "agent.openai.scorer=null", "agent.kind=miniswe"]
        load_run_config("openai-agent", [*overrides, "agent.miniswe.command_timeout_s=0"])
    with pytest.raises(ValueError, match=r"no such Harbor tasks: \['nope'\]"):
        episode_runner(AgentSpec(kind="miniswe", miniswe=MiniSweAgentSpec(names=["nope"])))
    assert episode_runner(AgentSpec(kind="miniswe")).uses_env is False
