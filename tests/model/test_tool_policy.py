"""model/tool_policy.py: a packaged adapter merged into its base on first use, cached, rebuilt when the
adapter changes, with the base's tokenizer files beside the merged weights; a clear error when the package
data is missing. A tiny random Llama stands in for SmolLM2 (the merge does not care which base it is)."""

from __future__ import annotations

import pytest
import torch

from rz_agents.model import ModelConfig, Transformer, tool_policy
from rz_agents.model.checkpoint import load_hf_checkpoint, save_hf_checkpoint
from rz_agents.model.lora import LoraConfig, add_lora
from rz_agents.model.peft_files import save_peft_adapter
from rz_agents.model.tool_policy import TOKENIZER_FILES, merged_checkpoint


def _tiny_base_and_adapter(tmp_path, seed: int = 0):
    cfg = ModelConfig.tiny("llama", vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16)  # fmt: skip
    model = Transformer(cfg, kernels="standard")
    model.reset_parameters(std=0.2, seed=0)  # sharp logits
    base = save_hf_checkpoint(model, tmp_path / "base")
    for name in TOKENIZER_FILES:  # what the merge carries over (their content is not read here)
        (base / name).write_text(f'{{"file": "{name}"}}')
    add_lora(model, LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj"], init_seed=seed))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:  # B starts at 0: give the adapter an effect
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)) * 0.5)
    return model, base, save_peft_adapter(model, tmp_path / f"adapter{seed}")


def test_the_merge_is_built_once_with_the_tokenizer_files_and_computes_the_adapted_model(tmp_path):
    adapted, base, adapter = _tiny_base_and_adapter(tmp_path)
    out = merged_checkpoint(base, adapter, tmp_path / "merged")
    assert all((out / name).read_text() == (base / name).read_text() for name in TOKENIZER_FILES)
    merged = load_hf_checkpoint(out, kernels="standard")
    assert not any(".lora_" in k for k in merged.state_dict())
    tokens = torch.arange(12) % 97
    with torch.no_grad():
        want = adapted.logits(adapted(tokens, torch.arange(12)))
        got = merged.logits(merged(tokens, torch.arange(12)))
        plain = load_hf_checkpoint(base, kernels="standard")
        without = plain.logits(plain(tokens, torch.arange(12)))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (without - want).abs().max() > 1e-2  # the adapter changes the function: the merge is seen
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert merged_checkpoint(base, adapter, out) == out  # cached: not rewritten
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_a_changed_adapter_rebuilds_the_merge(tmp_path):
    _, base, first = _tiny_base_and_adapter(tmp_path, seed=0)
    _, _, second = _tiny_base_and_adapter(tmp_path, seed=1)
    out = merged_checkpoint(base, first, tmp_path / "merged")
    q = "model.layers.0.self_attn.q_proj.weight"
    before = load_hf_checkpoint(out, kernels="standard").state_dict()[q]
    merged_checkpoint(base, second, out)
    after = load_hf_checkpoint(out, kernels="standard").state_dict()[q]
    assert not torch.equal(before, after)


def test_missing_package_data_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(tool_policy, "POLICIES", tmp_path)
    with pytest.raises(FileNotFoundError, match="smollm2-135m-tools is missing from .*train_tool_policy.py"):
        tool_policy.smollm2_tools_checkpoint_dir(cache_dir=tmp_path / "cache")
