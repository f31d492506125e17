"""Pacing instead of dropping (rollout.stale_groups): a slow episode is trained at its lag, within max_lag,
because the learner waits for it rather than train past the bound; with drop it is generated and thrown
away."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rz_agents.engine import Completion
from rz_agents.envs import MultiTurnTextEnv
from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.rollout.byte_chat import ByteChatTemplate, ByteTokenizer
from rz_agents.rollout.controller import RolloutConfig, RolloutController
from rz_agents.rollout.lag_policy import LagPolicy
from rz_agents.rollout.task_source import TaskSource
from rz_agents.sampling import SamplingSpec

MAX_LAG = 2


class OneTurnEnv(MultiTurnTextEnv):
    def _reset(self, task, rng):
        return str(task["question"]), {"task_id": task["id"]}

    def _step(self, text):
        return [], 1.0, True, {}


class VersionedEngine:
    """Samples with the newest published version; a prompt that says "slow" takes SLOW_S to answer."""

    SLOW_S = 1.0

    def __init__(self) -> None:
        self.version = 0
        self.tok = ByteTokenizer()

    async def generate(self, prompt, params):
        version = self.version  # the weights the episode starts sampling with
        if "slow" in self.tok.decode(prompt):
            await asyncio.sleep(self.SLOW_S)
        tokens = self.tok.encode("ok")[: params.max_tokens - 1] + [params.stop_token_ids[0]]
        return Completion(list(prompt), tokens, torch.zeros(len(tokens)), [version] * len(tokens), "stop")

    def load_weights(self, state, version):
        self.version = version


def _controller(engine, stale_groups: str) -> RolloutController:
    tasks = [{"id": "slow", "question": "slow one"}] + [
        {"id": f"t{i}", "question": f"q{i}"} for i in range(40)
    ]
    return RolloutController(
        engine,
        lambda: OneTurnEnv(max_turns=1),
        ByteChatTemplate(),
        ByteTokenizer(),
        TaskSource(tasks, shuffle=False),
        RolloutConfig(
            group_size=1,
            groups_per_batch=1,
            max_concurrent_episodes=8,
            limits=EpisodeLimits(max_turns=1, max_tokens_per_turn=8, max_episode_tokens=200),
            stale_groups=stale_groups,
        ),
        lag=LagPolicy("bounded", MAX_LAG),
        sampling=SamplingSpec(),
    )


async def _train(stale_groups: str, steps: int, until_dropped: bool = False):
    """A learner whose steps take 20 ms: (task id, lag of its oldest token) of each step's batch; with
    ``until_dropped`` it goes on (up to ``steps``) until a group was dropped as stale."""
    engine = VersionedEngine()
    ctl = _controller(engine, stale_groups)
    producer = asyncio.ensure_future(ctl.run())
    trained = []
    try:
        for version in range(steps):
            batch = await asyncio.wait_for(ctl.next_batch(version), 20)
            trained += [(t.info["task_id"], version - t.oldest_version()) for t in batch]
            engine.load_weights(None, version + 1)
            ctl.step_done(version + 1)
            if until_dropped and ctl.counters["groups_dropped_stale"]:
                break
            await asyncio.sleep(0.02)
    finally:
        ctl.stop()
        await asyncio.gather(producer, return_exceptions=True)
        ctl.close()
    return ctl, trained


def test_pacing_trains_the_slow_episode_at_max_lag_where_dropping_loses_it():
    ctl, trained = asyncio.run(_train("pace", steps=6))
    lags = dict(trained)
    assert lags["slow"] == MAX_LAG  # the learner waited at version 2 for it, and took it first
    assert all(lag <= MAX_LAG for _, lag in trained)
    assert ctl.counters["groups_dropped_stale"] == 0

    ctl, trained = asyncio.run(_train("drop", steps=300, until_dropped=True))
    assert "slow" not in dict(trained)  # the learner went on; the slow episode aged past max_lag
    assert ctl.counters["groups_dropped_stale"] == 1
    assert all(lag <= MAX_LAG for _, lag in trained)


def test_stale_groups_is_validated():
    with pytest.raises(
        ValueError, match=r"rollout.stale_groups must be one of \('pace', 'drop'\), got 'keep'"
    ):
        RolloutConfig(stale_groups="keep").validate()
