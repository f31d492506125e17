"""A broken env is named: which method returned what, and the env's own traceback kept under the error."""

from __future__ import annotations

import asyncio
import traceback

import pytest

from rz_agents.envs import MultiTurnTextEnv
from rz_agents.rollout.agent_loop import EpisodeError, EpisodeLimits, EpisodeSpec, run_episode
from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer


class IntResetEnv(MultiTurnTextEnv):
    def _reset(self, task, rng):
        return 5, {}


class PlainIntResetEnv:
    """Not a MultiTurnTextEnv: the agent loop checks what it returns."""

    def reset(self, *, seed=None, options=None):
        return 5, {}


class NoInfoResetEnv:
    def reset(self, *, seed=None, options=None):
        return "hello"


class RaisingResetEnv(MultiTurnTextEnv):
    def _reset(self, task, rng):
        return {"a": 1}[task["missing"]], {}


def _run(env):
    spec = EpisodeSpec(task={"missing": "x"}, group_id=0, member=0, seed=0)
    return asyncio.run(
        run_episode(None, env, ByteChatTemplate(), ByteTokenizer(), spec, None, EpisodeLimits())
    )


def test_a_bad_observation_from_a_multiturn_env_names_its_reset_method_and_the_type():
    with pytest.raises(EpisodeError) as info:
        _run(IntResetEnv())
    assert str(info.value) == (
        "env.reset failed: TypeError: IntResetEnv._reset returned a bad observation: an observation must be "
        "a str, a {'role', 'content'} message dict, a list of them or None; got int 5"
    )


def test_a_bad_observation_from_a_plain_env_names_its_reset_method_and_the_type():
    with pytest.raises(
        EpisodeError, match=r"^PlainIntResetEnv.reset returned a bad observation: .* got int 5$"
    ):
        _run(PlainIntResetEnv())


def test_a_reset_without_info_says_what_it_must_return():
    with pytest.raises(
        EpisodeError, match=r"NoInfoResetEnv.reset returned str; expected a tuple \(observation, info\)"
    ):
        _run(NoInfoResetEnv())


def test_an_env_exception_keeps_the_envs_own_traceback():
    with pytest.raises(EpisodeError) as info:
        _run(RaisingResetEnv())
    assert str(info.value) == "env.reset failed: KeyError: 'x'"
    cause = info.value.__cause__
    assert isinstance(cause, KeyError)
    frames = [f.name for f in traceback.extract_tb(cause.__traceback__)]
    assert frames[-1] == "_reset"  # the line in the env that raised
