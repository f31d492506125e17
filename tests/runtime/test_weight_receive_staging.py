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
from rz_agents.model.lora import LoraConfig, adapter_names, add_lora
from rz_agents.model.presets import preset_config
from rz_agents.runtime import ModelSpec, TrainConfig
from rz_agents.runtime.config import ActorsConfig
from rz_agents.runtime.memory_estimate import estimate_memory
from rz_agents.runtime.ray.weight_broadcast import WeightBroadcast


def _estimate(model_cfg, transport: str, lora: LoraConfig | None = None):
    cfg = TrainConfig(
        model=ModelSpec(dtype="bfloat16"),
        runtime="ray",
        actors=ActorsConfig(learner_ranks=1 if lora else 2, weight_transport=transport),
    )
    if lora is not None:
        cfg.learner.lora = lora
    return estimate_memory(cfg, model_cfg)


def _received_bytes(tensors: dict[str, torch.Tensor]) -> int:
    """What ``WeightBroadcast.receive`` holds for ``tensors`` on a one-member gloo group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    group = WeightBroadcast(f"tcp://127.0.0.1:{port}", 0, 1, "gloo")
    try:
        received = group.receive(tensors)
    finally:
        group.close()
    return sum(t.numel() * t.element_size() for t in received.values())


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


def test_with_lora_the_estimate_counts_the_adapters_a_broadcast_receive_holds():
    """With LoRA a broadcast carries only the adapters (the base reaches an engine once, through the object
    store), so the staging copy is the adapters' bytes, not the whole state's."""
    model_cfg = preset_config(
        "qwen3-0.6b", num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=512, tie_word_embeddings=True,
    )  # fmt: skip
    lora = LoraConfig(rank=4, alpha=8.0)
    model = Transformer(model_cfg, kernels="aligned").to(torch.bfloat16)
    add_lora(model, lora)
    state = model.state_dict()
    held = _received_bytes({k: state[k] for k in adapter_names(model)})
    estimate = _estimate(model_cfg, "broadcast", lora)
    assert estimate.engine["weight_receive_staging"] == held
    assert held < _estimate(model_cfg, "broadcast").engine["weight_receive_staging"] / 10
    assert "receives the adapters" in estimate.format()


def test_with_lora_on_sharded_ranks_only_the_base_is_sharded():
    """learner_ranks 8 with LoRA: the frozen base is divided over the ranks; the adapters, their fp32 masters,
    gradients and AdamW state are whole on each rank (replicated), plus one fp32 gradient row per rank."""
    model_cfg = preset_config("qwen3-4b")
    lora = LoraConfig(rank=16, alpha=32.0)
    cfg = TrainConfig(model=ModelSpec(dtype="bfloat16"), runtime="ray", actors=ActorsConfig(learner_ranks=8))
    cfg.learner.lora = lora
    est = estimate_memory(cfg, model_cfg)
    learner = est.learner
    t = learner["lora_adapters"] // 2  # bf16 adapter parameters
    assert learner["lora_gradient_rows"] == 8 * t * 4
    whole = sum(v for k, v in learner.items() if k != "weights")
    assert est.learner_rank_total == learner["weights"] // 8 + whole
