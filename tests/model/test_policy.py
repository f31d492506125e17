"""The policy builder (model/policy.py): one spec, one model. Adapters are attached once, by the builder, from
the spec (the learner's ``lora``, a PEFT directory, a checkpoint's saved adapter), and the vision tower is
frozen there; nothing else attaches or freezes (the learner checks, and adapter files only fill values)."""

from __future__ import annotations

import pytest
import torch

from rz_agents.model.checkpoint import load_hf_checkpoint, save_hf_checkpoint
from rz_agents.model.lora import LoraConfig, adapter_names
from rz_agents.model.peft_files import load_peft_adapter
from rz_agents.model.policy import PolicySpec, build_policy

LORA = LoraConfig(rank=2, alpha=4.0, target_modules=["q_proj", "v_proj"], init_seed=3)


def _trained(model) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def test_a_tiny_spec_builds_the_same_policy_every_time():
    spec = PolicySpec(vocab_size=64, init_seed=5, lora=LORA)
    a, b = build_policy(spec), build_policy(spec)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    other = build_policy(PolicySpec(vocab_size=64, init_seed=6, lora=LORA))
    assert not torch.equal(a.lm_head.weight, other.lm_head.weight)  # the seed is the spec's


def test_lora_attaches_adapters_and_only_they_train():
    model = build_policy(PolicySpec(vocab_size=64, lora=LORA))
    assert _trained(model) == set(adapter_names(model)) and len(adapter_names(model)) == 2 * 2 * 2
    plain = build_policy(PolicySpec(vocab_size=64))
    assert not adapter_names(plain) and _trained(plain) == {n for n, _ in plain.named_parameters()}


def test_freeze_vision_freezes_the_tower_and_nothing_else():
    spec = PolicySpec(model_type="qwen3_vl", vocab_size=320, freeze_vision=True)
    model = build_policy(spec)
    tower = {n for n, _ in model.named_parameters() if n.startswith("model.visual.")}
    assert tower and not (tower & _trained(model))
    assert _trained(model) == {n for n, _ in model.named_parameters()} - tower
    with pytest.raises(ValueError, match="no vision tower to freeze"):
        build_policy(PolicySpec(vocab_size=64, freeze_vision=True))


def test_a_lora_checkpoint_loads_its_adapter_and_the_learner_lora_must_match_it(tmp_path):
    trained = build_policy(PolicySpec(vocab_size=64, lora=LORA))
    with torch.no_grad():  # B != 0: the adapter counts
        for name in adapter_names(trained):
            trained.get_parameter(name).normal_(generator=torch.Generator().manual_seed(len(name)))
    ckpt = save_hf_checkpoint(trained, tmp_path / "ckpt")
    for model in (load_hf_checkpoint(ckpt), build_policy(PolicySpec(checkpoint=ckpt, lora=LORA))):
        assert all(torch.equal(v, trained.state_dict()[k]) for k, v in model.state_dict().items())
        assert set(model.state_dict()) == set(trained.state_dict())
        assert _trained(model) == set(adapter_names(model))
    with pytest.raises(ValueError, match="does not match the checkpoint's adapter"):
        build_policy(PolicySpec(checkpoint=ckpt, lora=LoraConfig(rank=4, target_modules=["q_proj"])))


def test_adapter_files_fill_adapters_the_builder_attached(tmp_path):
    """load_peft_adapter only copies values: a model without adapters is refused (naming the builder)."""
    trained = build_policy(PolicySpec(vocab_size=64, lora=LORA))
    ckpt = save_hf_checkpoint(trained, tmp_path / "ckpt")
    base = build_policy(PolicySpec(vocab_size=64))
    with pytest.raises(ValueError, match="no adapters to load it into.*build_policy"):
        load_peft_adapter(base, ckpt / "lora_adapter")


def test_the_meta_device_gives_a_checkpoints_shapes_and_refuses_adapters(tmp_path):
    ckpt = save_hf_checkpoint(build_policy(PolicySpec(vocab_size=64)), tmp_path / "ckpt")
    skeleton = build_policy(PolicySpec(checkpoint=ckpt), "meta")
    assert all(p.is_meta for p in skeleton.parameters())
    with pytest.raises(ValueError, match="meta device: adapters"):
        build_policy(PolicySpec(checkpoint=ckpt, lora=LORA), "meta")


def test_a_config_spec_gives_its_shapes_on_meta_with_the_adapters_a_run_attaches():
    from rz_agents.model.config import ModelConfig
    from rz_agents.model.qwen3_vl import Qwen3VLModel
    from rz_agents.model.qwen3_vl_config import Qwen3VLConfig

    text = ModelConfig.tiny("qwen3", vocab_size=64)
    model = build_policy(PolicySpec(config=text, kernels="standard", lora=LORA), "meta")
    assert model.lm_head.weight.is_meta and model.kernels == "standard"
    tiny = build_policy(PolicySpec(vocab_size=64, lora=LORA))  # the same adapters on a real tiny model
    assert adapter_names(model) == adapter_names(tiny) and _trained(model) == _trained(tiny)
    vl = build_policy(PolicySpec(config=Qwen3VLConfig.tiny(vocab_size=320), freeze_vision=True), "meta")
    assert isinstance(vl, Qwen3VLModel) and not any(p.requires_grad for p in vl.visual.parameters())
    with pytest.raises(ValueError, match="shapes only: on the meta device"):
        build_policy(PolicySpec(config=text))
