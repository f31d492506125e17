"""``env.id: openenv:URL``: an OpenEnv environment server (openenv-core's own create_app, served by uvicorn on
loopback as its docs start one) runs as a Gymnasium multi-turn env, one WebSocket session per episode, trains
under ``rz train`` and evaluates under ``rz eval``; a server that does not answer is one line at config
load."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "openenv.core", reason="openenv-core is not installed (bash scripts/install.sh installs it)"
)
pytest.importorskip("websockets", reason="websockets (openenv-core's client) is not installed")

from rz_agents.cli.train import RunConfig  # noqa: E402
from rz_agents.config_io import ConfigError, load_config  # noqa: E402
from rz_agents.envs.resolve import resolve_env  # noqa: E402
from tests.envs.openenv_server_process import echo_server, free_port  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The echo-word server on a free loopback port, started with uvicorn and stopped after the module."""
    with echo_server(tmp_path_factory.mktemp("openenv")) as url:
        yield url


def test_an_episode_is_a_session_of_turns_with_the_servers_reward_and_done(server):
    env = resolve_env(f"openenv:{server}").make(max_turns=3)
    assert env.action_field == "message"  # the action schema's only string field
    obs, info = env.reset(options={"task": {"id": "t1", "word": "tiger"}})
    assert obs == [{"role": "user", "content": "Say the word tiger."}]
    assert info == {"tools": [], "task_id": "t1"}
    obs, reward, terminated, truncated, _ = env.step("a lion")
    assert (obs, reward, terminated, truncated) == (
        [{"role": "user", "content": "No. Say the word tiger."}],
        0.0,
        False,
        False,
    )  # the session kept the word between steps: the server's state lives for the episode
    obs, reward, terminated, truncated, _ = env.step("tiger")
    assert (obs[0]["content"], reward, terminated, truncated) == ("Correct.", 1.0, True, False)
    assert env._client is None  # the session closed with the episode
    env.close()


def test_the_reset_seed_reaches_the_server_and_the_turn_limit_truncates(server):
    env = resolve_env(f"openenv:{server}").make(max_turns=2)
    words = {env.reset(seed=s)[0][0]["content"] for s in range(12)}
    assert len(words) > 1 and env.reset(seed=5) == env.reset(seed=5)
    env.reset(seed=5)
    assert env.step("no")[2:4] == (False, False)
    _, reward, terminated, truncated, _ = env.step("still no")
    assert (reward, terminated, truncated) == (0.0, False, True)
    env.close()


def test_mapping_options_that_name_no_field_are_one_line(server):
    target = resolve_env(f"openenv:{server}")
    with pytest.raises(
        ValueError, match="env.kwargs.action_field: the server's action has no field 'text'; it has"
    ):
        target.make(action_field="text")
    env = target.make(observation_field="question")
    with pytest.raises(ValueError, match="observation has no field 'question'; it has prompt, attempts"):
        env.reset(seed=0)
    env.close()
    env = target.make(observation_field="attempts")
    assert env.reset(seed=0)[0] == [{"role": "user", "content": "0"}]
    env.close()


def test_with_no_single_text_field_the_turn_is_the_actions_json_and_a_bad_one_is_answered(server):
    from rz_agents.envs.adapters.openenv_env import OpenEnvEnv, get_json

    schema = get_json("test", server, "/schema")
    # an action schema with two string fields (as a richer server's): no field to put the turn in
    schema["action"]["properties"]["note"] = {"type": "string"}
    env = OpenEnvEnv(server, schema=schema, max_turns=4)
    assert env.action_field is None
    env.reset(options={"task": {"word": "stone"}})
    obs, reward, terminated, _, info = env.step("stone")
    assert obs[0]["content"].startswith("Write the action as one JSON object with the fields message, note")
    assert (reward, terminated, info["invalid_action"]) == (0.0, False, True)
    obs, reward, terminated, _, info = env.step('{"text": "stone"}')  # the server's model rejects it
    assert obs[0]["content"].startswith("Invalid action: ") and "VALIDATION_ERROR" in obs[0]["content"]
    assert (reward, terminated, info["invalid_action"]) == (0.0, False, True)
    obs, reward, terminated, _, _ = env.step('{"message": "stone"}')  # the session survived the rejection
    assert (obs[0]["content"], reward, terminated) == ("Correct.", 1.0, True)
    env.close()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:{closed}", "no OpenEnv server answers at http://127.0.0.1:{closed} (GET /health"),
        ("ftp://127.0.0.1", "expected openenv:http://HOST:PORT (or https, ws, wss), got 'ftp://127.0.0.1'"),
        ("{server}/nothere", "GET {server}/nothere/health answered HTTP 404: is it an OpenEnv server?"),
        ("", "openenv: needs the server's URL after the colon"),
    ],
)
def test_a_server_that_does_not_answer_is_one_line_at_config_load(tmp_path, server, url, expected):
    closed = free_port()
    url, expected = (s.format(closed=closed, server=server) for s in (url, expected))
    path = tmp_path / "run.yaml"
    path.write_text(f"env: {{id: 'openenv:{url}'}}\nrollout: {{limits: {{max_turns: 1}}}}\n")
    with pytest.raises(ConfigError) as info:
        load_config(RunConfig, path, [])
    message = str(info.value)
    assert expected in message and "\n" not in message


TRAIN = (
    "steps: 1\nnum_threads: 1\nreport: false\nwarm_start: {{demos: 0}}\n"
    "model: {{tiny_overrides: {{hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1}}}}\n"
    "env:\n  id: 'openenv:{url}'\n"
    "  eval_tasks: [{{id: a, word: apple}}, {{id: t, word: tiger}}]\n"
    "rollout:\n  group_size: 2\n  groups_per_batch: 2\n  max_concurrent_episodes: 4\n"
    "  limits: {{max_turns: 2, max_tokens_per_turn: 6, max_episode_tokens: 200}}\n"
    "engine: {{max_running: 4, max_len: 256}}\n"
)


def test_rz_train_then_rz_eval_run_the_server_end_to_end(train_then_eval, server):
    summary, result = train_then_eval(TRAIN.format(url=server))
    assert summary["steps"] == 1
    assert result["env"] == f"openenv:{server}" and (result["num_tasks"], result["num_samples"]) == (2, 4)
    assert result["num_failed"] == 0 and 0.0 <= result["mean_reward"] <= 1.0
    assert [t["id"] for t in result["tasks"]] == ["a", "t"]
