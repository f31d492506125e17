"""The embedded runtime: bitwise resume from a checkpoint, failed episodes dropped, and learning that
cannot pass by chance (mean reward rises clearly in sync and in async lag-64 mode)."""

import itertools
import json

import gymnasium
import pytest
import torch

from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import EnvSpec, LearnerSpec, LocalRun, RolloutSpec, TrainConfig, run_training
from rz_agents.runtime.synthetic_env import LowercaseLettersEnv
from rz_agents.trainer.optim import OptimConfig

_episodes = itertools.count()


class FlakyLettersEnv(LowercaseLettersEnv):
    """A real env whose every ``fail_every``-th episode raises in its first step (a crashed tool sandbox)."""

    def __init__(self, fail_every: int = 3, **kw) -> None:
        super().__init__(**kw)
        self.fail_every = fail_every
        self._fail = False

    def _reset(self, task, rng):
        self._fail = next(_episodes) % self.fail_every == 0
        return super()._reset(task, rng)

    def _step(self, text):
        if self._fail:
            raise RuntimeError("sandbox crashed")
        return super()._step(text)


# Registered like any user env: the runtime builds it with gymnasium.make.
gymnasium.register(id="rz_tests/FlakyLetters-v0", entry_point=FlakyLettersEnv)


def _cfg(mode="sync", steps=4, lr=1e-2, **kw):
    return TrainConfig(
        mode=mode,
        steps=steps,
        num_threads=1,
        env=EnvSpec(kwargs={"max_turns": 2}),
        rollout=RolloutSpec(
            group_size=4,
            groups_per_batch=4,
            max_concurrent_episodes=16,
            max_lag=64,
            limits=EpisodeLimits(max_turns=2, max_tokens_per_turn=8, max_episode_tokens=200),
        ),
        learner=LearnerSpec(optim=OptimConfig(lr=lr), assert_lag0_exact=True),
        **kw,
    )


def _train(cfg):
    run = LocalRun(cfg)
    try:
        import asyncio

        summary = asyncio.run(run.train())
        return summary, {k: v.clone() for k, v in run.model.state_dict().items()}
    finally:
        run.close()


def test_resumed_sync_run_is_bitwise_identical(tmp_path):
    full, w_full = _train(_cfg(steps=4))
    first, _ = _train(_cfg(steps=2, output_dir=str(tmp_path / "a"), checkpoint_every=2))
    ckpt = tmp_path / "a" / "checkpoint.pt"
    assert ckpt.is_file()
    resumed, w_res = _train(_cfg(steps=4, resume_from=str(ckpt)))
    assert resumed["steps_this_run"] == 2 and resumed["version"] == 4
    assert resumed["reward_mean_per_step"] == full["reward_mean_per_step"]  # same trajectories
    for k, v in w_full.items():
        assert torch.equal(v, w_res[k]), k
    # Metrics went to JSONL, one row per step.
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["lag0_abs_dlogp_max"] == 0.0 and "is_weight_ess_fraction" in rows[0]


def test_failing_episodes_are_dropped_and_counted_not_fatal():
    cfg = _cfg(steps=3)
    cfg.env = EnvSpec(id="rz_tests/FlakyLetters-v0", kwargs={"fail_every": 3})
    s = run_training(cfg)
    assert s["steps"] == 3
    assert s["rollout"]["episodes_failed"] > 0


def _before_after(rewards, k=5):
    return sum(rewards[:k]) / k, sum(rewards[-k:]) / k


def test_reward_rises_in_sync_and_async_lag64_modes():
    # A 320-token random policy writes ~10% lowercase letters; the reward is that share.
    results = {}
    for mode in ("sync", "async"):
        s = run_training(_cfg(mode=mode, steps=30))
        before, after = _before_after(s["reward_mean_per_step"])
        results[mode] = (before, after, s["max_lag_seen"])
        print(f"{mode}: reward {before:.3f} -> {after:.3f}, max lag {s['max_lag_seen']}")
    for mode, (before, after, _) in results.items():
        assert before < 0.25, (mode, before)
        assert after > 0.6, (mode, after)  # random noise moves the mean by ~0.03, not 0.4
    # sync trains only fresh tokens; async really trained stale ones (the next batch is generated while
    # the learner trains on this one), so the learning above happened off-policy. (That the bound holds is
    # test_rollout_lag_bound's, with a bound small enough to be reached.)
    assert results["sync"][2] == 0 and results["async"][2] >= 1


def test_a_run_where_every_episode_fails_stops_with_a_clear_error():
    from rz_agents.rollout.controller import RolloutFailure

    cfg = _cfg(steps=3)
    cfg.env = EnvSpec(id="rz_tests/FlakyLetters-v0", kwargs={"fail_every": 1})
    cfg.rollout.max_consecutive_failures = 8
    with pytest.raises(RolloutFailure, match="8 episodes in a row failed; the last one: env.step failed"):
        run_training(cfg)


def test_a_prompt_longer_than_the_episode_budget_is_a_clear_episode_error():
    from rz_agents.rollout.controller import RolloutFailure

    cfg = _cfg(steps=1)
    cfg.rollout.limits = EpisodeLimits(max_turns=2, max_tokens_per_turn=8, max_episode_tokens=10)
    cfg.rollout.max_consecutive_failures = 4
    with pytest.raises(RolloutFailure, match="no room to sample within max_episode_tokens=10"):
        run_training(cfg)


def test_async_checkpoint_keeps_queued_groups_and_relaunches_those_in_flight(tmp_path):
    import asyncio

    from rz_agents.runtime.stop import StopRequest
    from rz_agents.trainer.checkpoint import load_checkpoint

    # A run of 5 steps stopped after its third: its checkpoint holds the groups started for steps 4 and 5
    # (a run's own last step admits nothing past its end, so that checkpoint would hold none).
    cfg = _cfg(mode="async", steps=5, output_dir=str(tmp_path))
    cfg.learner_step_delay_s = 0.2  # let the engine run ahead so that groups are queued and in flight
    first, stop = LocalRun(cfg), StopRequest()
    one_step = first.loop._train_one_step

    async def step_then_maybe_stop(s):
        await one_step(s)
        if first.loop.steps_done == 3:
            stop.request()

    first.loop._train_one_step = step_then_maybe_stop
    try:
        assert asyncio.run(first.train(stop))["steps"] == 3
    finally:
        first.close()
    state = load_checkpoint(tmp_path / "checkpoint.pt", restore_rng=False)["runtime"]["controller"]
    queued, in_flight = len(state["queued"]), len(state["in_flight"])
    assert queued + in_flight > 0
    assert state["tasks"]["position"] == state["counters"]["groups_started"]

    resumed = _cfg(mode="async", steps=5, resume_from=str(tmp_path / "checkpoint.pt"))
    run = LocalRun(resumed)
    try:
        assert len(run.controller.queue) == queued and len(run.controller._relaunch) == in_flight
        s = asyncio.run(run.train())
    finally:
        run.close()
    assert s["steps"] == 5 and s["steps_this_run"] == 2 and s["version"] == 5
    assert s["max_lag_seen"] <= 64
