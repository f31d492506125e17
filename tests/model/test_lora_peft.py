"""LoRA adapters as PEFT directories: peft loads rz's adapter on the HF model with rz's logits (fp32, 1e-5),
rz re-loads its own exactly, and rz loads a PEFT-made adapter with PEFT's logits."""

import json

import pytest
import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.checkpoint import load_hf_checkpoint, save_hf_checkpoint
from rz_agents.model.lora import LoraConfig, adapter_names, add_lora
from rz_agents.model.peft_files import ADAPTER_DIR, PREFIX, read_peft_config
from rz_agents.model.policy import PolicySpec, build_policy

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _rz_adapted(seed: int = 7) -> Transformer:
    model = Transformer(ModelConfig.tiny("qwen3"), kernels="aligned")
    model.reset_parameters(std=0.05, seed=seed)
    add_lora(model, LoraConfig(rank=4, alpha=8.0))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n in adapter_names(model):
            if ".lora_B." in n:
                model.get_parameter(n).copy_(torch.randn(model.get_parameter(n).shape, generator=gen) * 0.05)
    return model


def _logits(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.logits(model(tokens, torch.arange(tokens.numel())))


def test_peft_loads_rz_adapter_with_rz_logits_and_rz_reloads_it_exactly(tmp_path):
    ours = _rz_adapted()
    ckpt = save_hf_checkpoint(ours, tmp_path / "ours")
    adapter = ckpt / ADAPTER_DIR
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8.0
    tokens = torch.randint(0, ours.config.vocab_size, (1, 29), generator=torch.Generator().manual_seed(1))
    base = transformers.AutoModelForCausalLM.from_pretrained(ckpt)  # the base only (no lora_ keys in it)
    hf = peft.PeftModel.from_pretrained(base, adapter)
    with torch.no_grad():
        hf_logits = hf(tokens).logits[0]
    our_logits = _logits(ours, tokens[0])
    assert (our_logits - hf_logits).abs().max() <= 1e-5
    # adapters count
    assert (our_logits - _logits(Transformer(ours.config).eval(), tokens[0])).abs().max() > 1e-3
    back = load_hf_checkpoint(ckpt)  # base + lora_adapter/
    assert list(back.state_dict()) == list(ours.state_dict())
    pairs = zip(ours.state_dict().values(), back.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert torch.equal(_logits(back, tokens[0]), our_logits)
    assert all(p.requires_grad == (".lora_" in n) for n, p in back.named_parameters())


def test_rz_loads_a_peft_made_adapter_with_peft_logits(tmp_path):
    base_rz = Transformer(ModelConfig.tiny("qwen3"))
    base_rz.reset_parameters(std=0.05, seed=3)
    ckpt = save_hf_checkpoint(base_rz, tmp_path / "base")
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt)
    cfg = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, init_lora_weights=False
    )
    hf = peft.get_peft_model(hf, cfg)  # init_lora_weights=False: B random too, so the adapter counts
    hf.save_pretrained(tmp_path / "adapter")
    tokens = torch.randint(0, base_rz.config.vocab_size, (1, 29), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hf_logits = hf(tokens).logits[0]
    ours = build_policy(PolicySpec(checkpoint=ckpt, adapter=tmp_path / "adapter"))
    assert (_logits(ours, tokens[0]) - hf_logits).abs().max() <= 1e-5
    assert (_logits(base_rz, tokens[0]) - hf_logits).abs().max() > 1e-3


def test_peft_files_refuse_what_rz_cannot_compute(tmp_path):
    ours = _rz_adapted()
    ckpt = save_hf_checkpoint(ours, tmp_path / "ours")
    adapter = ckpt / ADAPTER_DIR
    raw = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**raw, "use_rslora": True}))
    with pytest.raises(ValueError, match="use_rslora"):
        read_peft_config(adapter)
    (adapter / "adapter_config.json").write_text(json.dumps(raw))
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    tensors.pop(PREFIX + "model.layers.0.self_attn.q_proj.lora_A.weight")
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match="missing"):
        load_hf_checkpoint(ckpt)


def test_merged_export_is_close_to_the_adapted_model_and_has_no_adapter(tmp_path):
    import runpy

    ours = _rz_adapted()
    ckpt = save_hf_checkpoint(ours, tmp_path / "ours")
    merge = runpy.run_path("scripts/merge_lora.py")["main"]
    assert merge([str(ckpt), str(tmp_path / "merged")]) == 0
    assert not (tmp_path / "merged" / ADAPTER_DIR).exists()
    merged = load_hf_checkpoint(tmp_path / "merged")
    tokens = torch.arange(3, 30)
    assert (_logits(merged, tokens) - _logits(ours, tokens)).abs().max() <= 1e-4
