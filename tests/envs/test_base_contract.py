"""The MultiTurnTextEnv contract, exercised through the GuessNumber example env."""

import gymnasium
import pytest

import rz_agents.envs  # noqa: F401  (registers the ids)
from rz_agents.envs import MultiTurnTextEnv, as_messages
from rz_agents.envs.examples.guess_number import GuessNumberEnv


def test_gymnasium_make_builds_registered_example_env():
    env = gymnasium.make("rz_agents/GuessNumber-v0", max_turns=3)
    obs, info = env.reset(seed=0, options={"task": {"id": "t1", "secret": 42}})
    assert obs[0]["role"] == "user" and "between 1 and 100" in obs[0]["content"]
    assert info["task_id"] == "t1" and info["tools"] == []
    obs, reward, terminated, truncated, info = env.step("I guess 10")
    assert obs == [{"role": "user", "content": "10 is wrong; go higher."}]
    assert (reward, terminated, truncated, info["turn"]) == (0.0, False, False, 1)
    obs, reward, terminated, truncated, _ = env.step("42")
    assert (reward, terminated, truncated) == (1.0, True, False)
    env.close()


def test_max_turns_truncates_without_termination():
    env = GuessNumberEnv(max_turns=2)
    env.reset(options={"task": {"secret": 5}})
    assert env.step("1")[2:4] == (False, False)
    _, reward, terminated, truncated, info = env.step("2")
    assert (reward, terminated, truncated, info["turn"]) == (0.0, False, True, 2)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("5")


def test_correct_answer_on_last_turn_terminates_rather_than_truncates():
    env = GuessNumberEnv(max_turns=1)
    env.reset(options={"task": {"secret": 5}})
    assert env.step("5")[1:4] == (1.0, True, False)


def test_seeded_reset_is_deterministic():
    a, b = GuessNumberEnv(), GuessNumberEnv()
    a.reset(seed=123)
    b.reset(seed=123)
    assert a.secret == b.secret


def test_step_before_reset_and_non_str_action_are_clear_errors():
    env = GuessNumberEnv()
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("1")
    env.reset(seed=0)
    with pytest.raises(TypeError, match="str"):
        env.step(123)  # type: ignore[arg-type]


def test_spaces_accept_messages_and_text():
    env = GuessNumberEnv()
    obs, _ = env.reset(seed=1)
    assert env.observation_space.contains(obs)
    assert env.observation_space.contains([])
    assert not env.observation_space.contains([{"role": "robot", "content": "x"}])
    assert env.action_space.contains("text") and not env.action_space.contains(3)


def test_as_messages_normalises_strings_and_rejects_garbage():
    assert as_messages("hi", role="tool") == [{"role": "tool", "content": "hi"}]
    assert as_messages(None) == []
    with pytest.raises(ValueError, match="message 0"):
        as_messages([{"role": "user"}])


def test_subclass_must_implement_hooks():
    class Empty(MultiTurnTextEnv):
        pass

    with pytest.raises(NotImplementedError):
        Empty().reset()


def test_builtin_ids_are_registered_on_import_and_register_env_is_idempotent():
    from rz_agents.envs.registry import BUILTIN_ENVS, register_env

    for env_id in BUILTIN_ENVS:
        assert env_id in gymnasium.registry
    before = gymnasium.registry["rz_agents/GuessNumber-v0"]
    register_env("rz_agents/GuessNumber-v0", BUILTIN_ENVS["rz_agents/GuessNumber-v0"])  # same: a no-op
    assert gymnasium.registry["rz_agents/GuessNumber-v0"] is before
