"""An engine replica that receives weights by broadcast (actors.weight_transport: broadcast) holds the whole
received state beside its own weights until it applies it between engine steps: the memory estimate (and so
``rz train --dry-run``) counts that copy as ``weight_receive_staging``, exactly the bytes
``WeightBroadcast.receive`` allocates (checked on a one-member gloo group); the object-store transport has no
device-side staging copy."""

from __future__ import annotations

import socket

import pytest
import torch

from rz_agents.model import Transformer
from rz_agents.model.presets import preset_config
from rz_agents.runtime import ModelSpec, TrainConfig
from rz_agents.runtime.config import ActorsConfig
from rz_agents.runtime.memory_estimate import estimate_memory
from rz_agents.runtime.ray.weight_broadcast import WeightBroadcast


def _estimate(model_cfg, transport: str):
    cfg = TrainConfig(
        model=ModelSpec(dtype="bfloat16"),
        runtime="ray",
        actors=ActorsConfig(learner_ranks=2, weight_transport=transport),
    )
    return estimate_memory(cfg, model_cfg)


@pytest.mark.parametrize("tied", [True, False])
def test_the_estimate_counts_exactly_what_a_broadcast_receive_holds(tied):
    model_cfg = preset_config(
        "qwen3-0.6b", num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=512, tie_word_embeddings=tied,
    )  # fmt: skip
    model = Transformer(model_cfg, kernels="aligned").to(torch.bfloat16)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    group = WeightBroadcast(f"tcp://127.0.0.1:{port}", 0, 1, "gloo")
    try:
        received = group.receive(model.state_dict())
    finally:
        group.close()
    held = sum(t.numel() * t.element_size() for t in received.values())
    # (views of the received buckets: their storages are what stays allocated)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in received.values()}
    assert sum(storages.values()) == held
    broadcast, object_store = _estimate(model_cfg, "broadcast"), _estimate(model_cfg, "object_store")
    assert broadcast.engine["weight_receive_staging"] == held
    assert "weight_receive_staging" not in object_store.engine
    assert broadcast.engine_total - object_store.engine_total == held
    assert "weight_receive_staging" in broadcast.format()
