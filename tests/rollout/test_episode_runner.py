"""The episode-runner seam: the controller hands every episode to the run's runner; a runner that steps no
env is given None and the env factory is never called; the default runner is the agent loop."""

from __future__ import annotations

import asyncio

from rz_agents.rollout import AgentLoop, EpisodeRunner
from rz_agents.rollout.controller import RolloutConfig, RolloutController
from rz_agents.rollout.lag_policy import LagPolicy
from rz_agents.rollout.task_source import TaskSource
from rz_agents.sampling import SamplingSpec
from rz_agents.trajectory import NOT_SAMPLED, Trajectory


class _CountingRunner:
    """A runner that steps no env: two prompt tokens and one 'sampled' token per episode, at version 0."""

    uses_env = False

    def __init__(self) -> None:
        self.envs_seen: list = []

    async def run_episode(
        self, engine, env, template, tokenizer, spec, sampling, limits, executor=None, infra_exceptions=()
    ):
        self.envs_seen.append(env)
        return Trajectory(
            tokens=[1, 2, 3 + spec.member],
            loss_mask=[False, False, True],
            behavior_logprobs=[0.0, 0.0, -0.5],
            versions=[NOT_SAMPLED, NOT_SAMPLED, 0],
            reward=float(spec.member),
            group_id=spec.group_id,
            info={"member": spec.member, "runner": "counting"},
        )


def _no_env():
    raise AssertionError("a runner that steps no env must not make the controller build one")


def _controller(runner) -> RolloutController:
    cfg = RolloutConfig(group_size=2, groups_per_batch=2, max_concurrent_episodes=4)
    return RolloutController(
        None,
        _no_env,
        None,
        None,
        TaskSource(None),
        cfg,
        lag=LagPolicy("bounded", 4),
        sampling=SamplingSpec(),
        runner=runner,
    )


def _one_batch(controller: RolloutController) -> list[Trajectory]:
    async def go():
        producer = asyncio.ensure_future(controller.run())
        try:
            return await controller.next_batch(0)
        finally:
            controller.stop()
            await asyncio.gather(producer, return_exceptions=True)

    try:
        return asyncio.run(go())
    finally:
        controller.close()


def test_the_controller_runs_every_episode_through_its_runner_and_builds_no_env_for_one_that_needs_none():
    runner = _CountingRunner()
    batch = _one_batch(_controller(runner))
    assert len(batch) == 4 and all(t.info["runner"] == "counting" for t in batch)
    assert sorted(t.reward for t in batch) == [0.0, 0.0, 1.0, 1.0]  # both members of both groups
    assert runner.envs_seen and all(env is None for env in runner.envs_seen)


def test_both_runners_meet_the_protocol_and_the_default_is_the_agent_loop():
    from rz_agents.agents.openai_api import OpenAIAPIAgent

    assert isinstance(_CountingRunner(), EpisodeRunner) and isinstance(AgentLoop(), EpisodeRunner)
    agent = OpenAIAPIAgent(function=lambda client, task: 1.0)
    assert isinstance(agent, EpisodeRunner) and agent.uses_env is False and AgentLoop.uses_env is True
    controller = RolloutController(
        None, _no_env, None, None, TaskSource(None), RolloutConfig(), lag=LagPolicy(), sampling=SamplingSpec()
    )
    try:
        assert isinstance(controller.runner, AgentLoop)
    finally:
        controller.close()
