"""LoRA on the Ray runtime (the shared two-node test cluster, conftest.py): engine actors build the learner's
adapters, and a weight update publishes only the adapter tensors, through the object store or by broadcast.

- sync mode, object store: trajectories and weights are the local LoRA run's, bit for bit; lag-0 tokens score
  exactly (max |dlogp| 0.0) step after step; each update publishes the adapter bytes only;
- broadcast (gloo), two engines: the same, bytes included;
- a base changed in the driver (a warm start) reaches the engines once, whole; then adapters only; a
  replica Ray restarted takes that base, then the newest adapters (it samples as the other replica);
- two sharded learner ranks (FSDP2 base, replicated adapters) by broadcast: the local run's bits.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from rz_agents.engine import EngineConfig, SamplingParams
from rz_agents.model import ModelConfig
from rz_agents.model.held_weights import HELD_KEY
from rz_agents.model.lora import LoraConfig, publication_bytes
from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import (
    ActorsConfig,
    EnvSpec,
    LearnerSpec,
    RolloutSpec,
    TrainConfig,
    build_run,
)
from rz_agents.trainer.optim import OptimConfig

ray = pytest.importorskip("ray")

LORA = LoraConfig(rank=4, alpha=8.0)
LIMITS = EpisodeLimits(max_turns=2, max_tokens_per_turn=8, max_episode_tokens=200)


def _cfg(runtime="ray", steps=3, actors=None, **kw):
    extra = {"actors": actors or ActorsConfig()} if runtime == "ray" else {}
    return TrainConfig(
        runtime=runtime,
        mode="sync",
        steps=steps,
        seed=5,
        num_threads=1,
        env=EnvSpec(kwargs={"max_turns": 2, "latency_s": 0.0}),
        engine=EngineConfig(max_running=16, max_len=256, max_batch_tokens=512),
        rollout=RolloutSpec(group_size=2, groups_per_batch=2, max_concurrent_episodes=8, limits=LIMITS),
        learner=LearnerSpec(optim=OptimConfig(lr=5e-2), assert_lag0_exact=True, lora=LORA),
        **extra,
        **kw,
    )


def train_recorded(run):
    """Train ``run``; returns (trajectories of each batch as dicts, the whole final weights)."""
    batches = []
    take = run.controller.next_batch

    async def recording(version):
        batch = await take(version)
        batches.append([t.to_dict() for t in batch])
        return batch

    run.controller.next_batch = recording
    asyncio.run(run.train())
    if run.cfg.runtime == "local":
        return batches, {k: v.clone() for k, v in run.learner.weights().items()}
    return batches, run.learner.full_weights()


def _run(cfg):
    run = build_run(cfg)
    try:
        return (run, *train_recorded(run))
    finally:
        run.close()


@pytest.fixture(scope="module")
def local_lora():
    run, batches, weights = _run(_cfg(runtime="local"))
    return run.history, batches, weights


def _bytes(weights, adapters: bool = True) -> int:
    """Bytes of the adapter tensors of ``weights`` (``adapters`` False: of all of them)."""
    return sum(v.numel() * v.element_size() for k, v in weights.items() if ".lora_" in k or not adapters)


def _check_lora_run(run, history, batches, weights, local_lora):
    local_history, local_batches, local_weights = local_lora
    assert batches == local_batches
    assert set(weights) == set(local_weights)
    for k, v in weights.items():
        assert torch.equal(v, local_weights[k]), k
    adapter, full = _bytes(weights), _bytes(weights, adapters=False)
    assert adapter > 0 and adapter == publication_bytes(ModelConfig.tiny("qwen3", vocab_size=320), LORA)[0]
    for step, (mine, theirs) in enumerate(zip(history, local_history, strict=True)):
        assert mine["loss"] == theirs["loss"]
        assert (
            mine["lag0_abs_dlogp_max"] == 0.0 and mine["lag0_token_count"] == mine["num_sampled_tokens"] > 0
        )
        assert mine["engine_version"] == step + 1
        # adapters only (and the 32-byte claim on the base), in both runtimes; the whole weights would be
        # `full` bytes (incl. adapters)
        assert mine["weight_update_bytes"] == theirs["weight_update_bytes"] == adapter + 32 < full // 5
    # The adapters trained (B moved off zero), so lag-0 exactness needed the engines to apply them.
    assert any(v.abs().sum() > 0 for n, v in weights.items() if ".lora_B." in n)


def test_ray_lora_through_the_object_store_equals_the_local_lora_run(ray_cluster, local_lora):
    run, batches, weights = _run(_cfg())
    _check_lora_run(run, run.history, batches, weights, local_lora)
    assert run.publications == {"broadcast": 0, "object_store": 3}


def test_ray_lora_by_broadcast_to_two_engines_equals_the_local_lora_run(ray_cluster, local_lora):
    actors = ActorsConfig(engines=2, env_workers=1, weight_transport="broadcast")
    run, batches, weights = _run(_cfg(actors=actors))
    _check_lora_run(run, run.history, batches, weights, local_lora)
    assert run.publications == {"broadcast": 3, "object_store": 0}


def test_ray_lora_engines_take_a_changed_base_once_then_adapters(ray_cluster):
    """A warm start changes the frozen base in the driver: engines get the whole weights once (else lag-0
    tokens would not score exactly: assert_lag0_exact raises), then adapter-only updates."""
    run = build_run(_cfg(steps=2))
    update = ray.get(run.learner.weights_ref())  # what a publication holds: the adapters only
    assert update.partial and HELD_KEY not in update.tensors  # (and the claim on the base, a field)
    published = dict(update.tensors)
    assert published and all(".lora_A." in k or ".lora_B." in k for k in published)
    adapter = _bytes(published) + 32
    try:
        with torch.no_grad():
            for name, p in run.model.named_parameters():
                if ".lora_" not in name:
                    p.mul_(1.25)  # a base the engines' own checkpoint does not hold
        run.push_model_weights()
        whole = run.learner.full_weights()
        name = next(n for n in whole if ".lora_" not in n and n.endswith("q_proj.weight"))
        assert torch.equal(whole[name], run.model.state_dict()[name])
        train_recorded(run)
    finally:
        run.close()
    for m in run.history:
        assert m["lag0_abs_dlogp_max"] == 0.0 and m["lag0_token_count"] > 0
        assert m["weight_update_bytes"] == adapter > 0


def _sample(replica, seed: int):
    """One sampled completion of a fixed prompt on ``replica`` (tokens, their log-probs, versions)."""
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=seed, ignore_eos=True)
    c = ray.get(replica.actor.generate.remote([3, 10, 40, 7], params), timeout=120)
    return c.tokens, c.logprobs, c.versions


def test_a_restarted_ray_engine_takes_the_changed_base_then_the_newest_adapters(ray_cluster):
    """Ray restarts a killed replica with the checkpoint's base and a fresh adapter: the router sends it the
    run's whole weights first, then the newest adapters, so it samples exactly as the other replica."""
    run = build_run(_cfg(steps=2, actors=ActorsConfig(engines=2, env_workers=1)))
    try:
        with torch.no_grad():
            for name, p in run.model.named_parameters():
                if ".lora_" not in name:
                    p.mul_(1.25)
        run.push_model_weights()
        asyncio.run(run.train())
        restarted, other = run.engine.replicas
        ray.kill(restarted.actor, no_restart=False)

        async def revive():
            run.engine._lost(restarted)  # (as a generate call on it would find out)
            while not restarted.healthy:
                assert restarted.reviving, "the replica was not revived"
                await asyncio.sleep(0.2)

        asyncio.run(asyncio.wait_for(revive(), 180))
        for seed in (1, 2):
            (t0, lp0, v0), (t1, lp1, v1) = _sample(restarted, seed), _sample(other, seed)
            assert t0 == t1 and torch.equal(lp0, lp1) and list(v0) == list(v1) == [2] * 12
    finally:
        run.close()
    assert run.engine.counters["replicas_revived"] == 1


def test_ray_lora_on_two_sharded_learner_ranks_by_broadcast_equals_the_local_run(ray_cluster, local_lora):
    """learner_ranks 2: FSDP2 shards the frozen base, the adapters are whole on both ranks (their gradients
    summed in one process's order), rank 0 broadcasts the adapters: trajectories, losses and final weights are
    the one-process run's bit for bit."""
    actors = ActorsConfig(learner_ranks=2, weight_transport="broadcast")
    run, batches, weights = _run(_cfg(actors=actors))
    _check_lora_run(run, run.history, batches, weights, local_lora)
    assert run.publications == {"broadcast": 3, "object_store": 0}
    assert all(m["grad_norm"] == e["grad_norm"] for m, e in zip(run.history, local_lora[0], strict=True))


def test_a_killed_sharded_ray_lora_run_resumes_to_the_local_runs_bits(ray_cluster, local_lora, tmp_path):
    """learner_ranks 2, killed right after step 1's metrics row (its checkpoint, after step 0, holds the
    adapters' state on the ranks and names the base written once in frozen_base/): the resumed run's steps and
    final weights are the uninterrupted local one-process run's, bit for bit."""
    import dataclasses

    from tests.rollout.test_rollout_lora_resume import _Killed, _KilledAfterRow

    cfg = _cfg(actors=ActorsConfig(learner_ranks=2), output_dir=str(tmp_path), checkpoint_every=1)
    run = build_run(cfg)
    run.writer = _KilledAfterRow(run.writer, 1)
    try:
        with pytest.raises(_Killed):
            asyncio.run(run.train())
    finally:
        run.close()
    assert len(list((tmp_path / "frozen_base").iterdir())) == 1
    resumed, _, weights = _run(dataclasses.replace(cfg, resume_from=str(tmp_path / "checkpoint.pt")))
    local_history, _, local_weights = local_lora
    assert set(weights) == set(local_weights)
    for k, v in weights.items():
        assert torch.equal(v, local_weights[k]), k
    assert [m["loss"] for m in resumed.history] == [m["loss"] for m in local_history]
    assert all(m["lag0_abs_dlogp_max"] == 0.0 for m in resumed.history)
