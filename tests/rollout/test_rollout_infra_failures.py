"""An episode lost to infrastructure is masked (left out of its group's baseline and the loss, counted), never
scored; a policy failure stays a reward. The kill is real: the python-tool env's sandbox worker (a bubblewrap
process group) is SIGKILLed between two of the policy's tool calls, as a host OOM kill or preemption would."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest
import torch

from rz_agents.engine import Completion, SamplingParams
from rz_agents.envs import MultiTurnTextEnv
from rz_agents.envs.python_tool import PythonToolEnv
from rz_agents.model import ModelConfig, Transformer
from rz_agents.rollout.agent_loop import EpisodeError, EpisodeLimits, EpisodeSpec, InfraFailure, run_episode
from rz_agents.rollout.byte_chat import VOCAB_SIZE, ByteChatTemplate, ByteTokenizer
from rz_agents.rollout.controller import RolloutConfig, RolloutController
from rz_agents.rollout.lag_policy import LagPolicy
from rz_agents.rollout.task_source import TaskSource
from rz_agents.sampling import SamplingSpec
from rz_agents.trainer.advantages import group_advantages
from rz_agents.trainer.learner import Learner, LearnerConfig

CALL = '<tool_call>{"name": "python", "arguments": {"code": "%s"}}</tool_call>'


class ScriptedPolicy:
    """Stands in for the sampler (a random tiny model writes no tool call): two python calls, then an
    answer that is right for even episode seeds and wrong for odd ones, so a group's rewards differ."""

    version = 0

    def __init__(self) -> None:
        self.tok = ByteTokenizer()

    async def generate(self, prompt, params):
        done = self.tok.decode(prompt).count("</tool_call>")  # the calls this episode made so far
        if done == 0:
            text = CALL % "x = 6 * 7"
        elif done == 1:
            text = CALL % "print(x)"
        else:
            text = "\\boxed{42}" if params.seed % 2 == 0 else "\\boxed{41}"
        tokens = self.tok.encode(text)[: params.max_tokens - 1] + [params.stop_token_ids[0]]
        return Completion(list(prompt), tokens, torch.full((len(tokens),), -1.0), [0] * len(tokens), "stop")

    def load_weights(self, state, version):
        raise NotImplementedError


class PreemptedOnce(PythonToolEnv):
    """The first episode to reach its second tool call finds its sandbox worker killed (SIGKILL to the
    worker's whole process group, waited for) just before the call."""

    killed: list[int] = []
    lock = threading.Lock()  # episodes step on several threads: exactly one of them kills

    def _step(self, text):
        if "print(x)" in text:
            with PreemptedOnce.lock:
                first = not PreemptedOnce.killed
                if first:
                    proc = self.sandbox._worker.proc
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
                    PreemptedOnce.killed.append(proc.pid)
        return super()._step(text)


def _controller(group_size: int = 4) -> RolloutController:
    cfg = RolloutConfig(
        group_size=group_size,
        groups_per_batch=1,
        max_concurrent_episodes=group_size,
        limits=EpisodeLimits(max_turns=3, max_tokens_per_turn=120, max_episode_tokens=1500),
        max_episode_reruns=0,  # mask at once (a rerun would otherwise refill the group)
    )
    tasks = TaskSource([{"id": "t", "question": "What is 6*7?", "answer": "42"}], seed=0)
    return RolloutController(
        ScriptedPolicy(),
        lambda: PreemptedOnce(max_turns=3, prompt_style="compact"),
        ByteChatTemplate(),
        ByteTokenizer(),
        tasks,
        cfg,
        lag=LagPolicy("bounded", 4),
        sampling=SamplingSpec(),
    )


async def _one_batch(controller: RolloutController):
    producer = asyncio.ensure_future(controller.run())
    try:
        return await asyncio.wait_for(controller.next_batch(0), 60)
    finally:
        controller.stop()
        await asyncio.gather(producer, return_exceptions=True)
        controller.close()


def test_a_killed_env_worker_masks_its_episode_out_of_the_group_baseline_and_the_loss():
    PreemptedOnce.killed.clear()
    controller = _controller()
    batch = asyncio.run(_one_batch(controller))
    assert len(PreemptedOnce.killed) == 1  # a real worker process was killed mid-group
    c = controller.counters
    assert c["infra_failed"] == 1 and c["episodes_failed"] == 1 and c["episodes_finished"] >= 3
    # the group trains on its three survivors: no row for the lost member (and none scored 0 for it)
    assert len(batch) == 3 and {t.group_id for t in batch} == {0}
    members = sorted(t.info["member"] for t in batch)
    assert len(set(members)) == 3
    rewards = [t.reward for t in batch]
    assert all(r in (0.0, 1.0) for r in rewards) and len(set(rewards)) == 2  # survivors were scored
    adv = group_advantages(rewards, [t.group_id for t in batch])
    baseline = sum(rewards) / 3  # over the survivors only
    assert adv == [r - baseline for r in rewards]
    # the learner's step sees exactly those rows: three trajectories, the survivors' mean reward
    torch.manual_seed(0)
    model = Transformer(ModelConfig.tiny("qwen3", vocab_size=VOCAB_SIZE), kernels="aligned")
    metrics = Learner(model, LearnerConfig(micro_batch_tokens=4096)).step(batch)
    assert metrics["batch_trajectories"] == 3
    assert metrics["reward_mean"] == pytest.approx(baseline)


class InfoFlagEnv(MultiTurnTextEnv):
    """An env that tells the rollout its desktop crashed (info["infra_failure"]) on its first step."""

    def _reset(self, task, rng):
        return "go", {}

    def _step(self, text):
        return [], 0.0, True, {"infra_failure": "desktop crashed"}


class PolicyErrorEnv(MultiTurnTextEnv):
    """A malformed action is the policy's failure: the env scores it (-1) and the episode ends."""

    def _reset(self, task, rng):
        return "go", {}

    def _step(self, text):
        return [], -1.0, True, {"malformed_calls": 1}


class TimeoutEnv(MultiTurnTextEnv):
    def _reset(self, task, rng):
        raise TimeoutError("the desktop did not answer in 60 s")

    def _step(self, text):  # pragma: no cover - reset fails first
        raise AssertionError


def _run(env, infra_exceptions=()):
    spec = EpisodeSpec(task=None, group_id=0, member=0, seed=0)

    return asyncio.run(
        run_episode(
            ScriptedPolicy(),
            env,
            ByteChatTemplate(),
            ByteTokenizer(),
            spec,
            SamplingParams(),
            EpisodeLimits(max_turns=1, max_tokens_per_turn=8, max_episode_tokens=200),
            infra_exceptions=infra_exceptions,
        )
    )


def test_an_env_reporting_infra_failure_in_its_info_loses_the_episode_to_infrastructure():
    with pytest.raises(InfraFailure, match="desktop crashed"):
        _run(InfoFlagEnv(max_turns=1))


def test_a_policy_failure_stays_a_reward():
    assert _run(PolicyErrorEnv(max_turns=1)).reward == -1.0


def test_an_env_timeout_is_infrastructure_only_when_the_run_names_it():
    with pytest.raises(EpisodeError) as plain:
        _run(TimeoutEnv(max_turns=1))
    assert not isinstance(plain.value, InfraFailure)
    with pytest.raises(InfraFailure, match="TimeoutError"):
        _run(TimeoutEnv(max_turns=1), infra_exceptions=["OSError"])  # TimeoutError is an OSError


def test_infra_exceptions_must_be_class_names():
    with pytest.raises(ValueError, match=r"rollout.infra_exceptions .* got 'not a name'"):
        RolloutConfig(infra_exceptions=["not a name"]).validate()
