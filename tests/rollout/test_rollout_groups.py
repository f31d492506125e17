"""A group is G samples of one prompt: with an env that draws its own task from the reset seed, every
member of a group gets the same task (the group-mean baseline compares answers to one question)."""

import asyncio

from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import EnvSpec, LocalRun, RolloutSpec, TrainConfig


def _prompt(traj) -> tuple[int, ...]:
    return tuple(traj.tokens[: traj.loss_mask.index(True)])


def test_members_of_a_group_share_the_task_the_env_draws_and_groups_differ():
    cfg = TrainConfig(
        steps=1,
        num_threads=1,
        env=EnvSpec(kwargs={"max_turns": 1}),  # LowercaseLettersEnv draws a word from the reset seed
        rollout=RolloutSpec(
            group_size=4,
            groups_per_batch=3,
            max_concurrent_episodes=12,
            limits=EpisodeLimits(max_turns=1, max_tokens_per_turn=4, max_episode_tokens=100),
        ),
    )
    run = LocalRun(cfg)

    async def one_batch():
        producer = asyncio.ensure_future(run.controller.run())
        try:
            return await run.controller.next_batch(run.learner.version)
        finally:
            run.controller.stop()
            await asyncio.gather(producer, return_exceptions=True)

    try:
        batch = asyncio.run(one_batch())
    finally:
        run.close()
    groups: dict[int, set] = {}
    for t in batch:
        groups.setdefault(t.group_id, set()).add(_prompt(t))
    assert len(groups) == 3 and all(len(prompts) == 1 for prompts in groups.values())
    assert len({next(iter(p)) for p in groups.values()}) == 3  # different groups, different tasks
    # Members still sample independently (their own seeds).
    assert len({tuple(t.tokens) for t in batch}) > 3
