"""``model.adapter``: a run starts from base + a PEFT LoRA adapter (the learner and the engine both load it)
and LoRA training continues from it; a config whose learner.lora does not match the adapter fails at load."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rz_agents.engine import EngineConfig
from rz_agents.model.lora import LoraConfig, add_lora
from rz_agents.model.peft_files import save_peft_adapter
from rz_agents.rollout.agent_loop import EpisodeLimits
from rz_agents.runtime import EnvSpec, LearnerSpec, ModelSpec, RolloutSpec, TrainConfig, build_run
from rz_agents.runtime.factories import build_model
from rz_agents.trainer.optim import OptimConfig

LORA = LoraConfig(rank=2, alpha=4.0)


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory):
    """A trained-looking adapter (B random) for the run's tiny model, as a PEFT directory."""
    model = build_model(ModelSpec(), 320)
    add_lora(model, LORA)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return save_peft_adapter(model, tmp_path_factory.mktemp("peft") / "adapter"), model.state_dict()


def _cfg(adapter, lora=LORA):
    limits = EpisodeLimits(max_turns=2, max_tokens_per_turn=8, max_episode_tokens=200)
    return TrainConfig(
        mode="sync",
        steps=1,
        seed=5,
        num_threads=1,
        model=ModelSpec(adapter=str(adapter)),
        env=EnvSpec(kwargs={"max_turns": 2, "latency_s": 0.0}),
        engine=EngineConfig(max_running=8, max_len=256, max_batch_tokens=512),
        rollout=RolloutSpec(group_size=2, groups_per_batch=2, max_concurrent_episodes=4, limits=limits),
        learner=LearnerSpec(optim=OptimConfig(lr=1e-2), assert_lag0_exact=True, lora=lora),
    )


def test_a_run_starts_from_base_plus_adapter_and_trains_it(adapter_dir):
    path, saved = adapter_dir
    run = build_run(_cfg(path))
    try:
        names = [k for k in saved if ".lora_" in k]
        learner, engine = run.model.state_dict(), run.engine.model.state_dict()
        for k in names:  # both sides start from the file's adapter, not a fresh init (B = 0)
            assert torch.equal(learner[k], saved[k]) and torch.equal(engine[k], saved[k]), k
        asyncio.run(run.train())
    finally:
        run.close()
    (m,) = run.history
    assert m["lag0_abs_dlogp_max"] == 0.0 and m["lag0_token_count"] > 0
    trained = run.model.state_dict()
    assert any(not torch.equal(trained[k], saved[k]) for k in names)  # the adapter trained on
    assert all(torch.equal(trained[k], v) for k, v in saved.items() if ".lora_" not in k)  # base frozen


@pytest.mark.parametrize(
    "lora, message",
    [
        (LoraConfig(), r"model.adapter needs learner.lora set as the adapter's \(rank 2, alpha 4.0"),
        (
            LoraConfig(rank=4, alpha=4.0),
            r"learner.lora \(rank 4, alpha 4.0, .*does not match model.adapter's",
        ),
    ],
)
def test_an_adapter_that_does_not_match_learner_lora_is_refused_at_load(adapter_dir, lora, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.validate(_cfg(adapter_dir[0], lora))


def test_a_directory_that_is_not_an_adapter_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"model.adapter .*: no adapter_config.json there"):
        TrainConfig.validate(_cfg(tmp_path))
