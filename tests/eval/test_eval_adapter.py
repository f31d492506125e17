"""`rz eval --checkpoint BASE --adapter DIR`: a PEFT adapter loaded on a base checkpoint evaluates exactly as
the adapted model saved whole (base + its lora_adapter/), and differs from the base alone."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from rz_agents.cli import main
from rz_agents.eval.checkpoint_policy import load_checkpoint_policy
from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.checkpoint import save_hf_checkpoint
from rz_agents.model.lora import LoraConfig, add_lora
from rz_agents.model.peft_files import save_peft_adapter

FAST = ["--max-tokens", "8", "--num-threads", "1", "--num-slots", "4", "--k", "1", "--temperature", "0"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(base dir, PEFT adapter dir, the adapted model saved whole) of a tiny Qwen3 (Qwen3's vocabulary)."""
    root = tmp_path_factory.mktemp("adapter")
    cfg = ModelConfig.tiny(
        "qwen3", vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024,
    )  # fmt: skip
    base = Transformer(cfg)
    base.reset_parameters(std=0.05, seed=0)
    adapted = copy.deepcopy(base)
    add_lora(adapted, LoraConfig(rank=2, alpha=4.0))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if ".lora_B." in name:  # a trained adapter (B = 0 would leave the base's function)
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return (
        save_hf_checkpoint(base, root / "base"),
        save_peft_adapter(adapted, root / "adapter"),
        save_hf_checkpoint(adapted, root / "whole"),
    )


def test_base_plus_adapter_is_the_adapted_model_bitwise(checkpoints):
    base, adapter, whole = checkpoints
    tokens = torch.tensor([5, 17, 300, 2048, 9])

    def logits(model):
        with torch.no_grad():
            return model.logits(model(tokens, torch.arange(tokens.numel())))

    both = load_checkpoint_policy(base, adapter=adapter)
    assert both.name == "base+adapter"
    got = logits(both.model)
    assert torch.equal(got, logits(load_checkpoint_policy(whole).model))
    assert not torch.equal(got, logits(load_checkpoint_policy(base).model))  # the adapter counts


def test_rz_eval_adapter_flag_samples_as_the_whole_adapted_checkpoint(checkpoints, capsys):
    base, adapter, whole = checkpoints
    argv = ["eval", "--benchmark", "gsm8k", "--limit", "2", "--save-text", "--quiet", "--json", *FAST]
    results = []
    for extra in (["--checkpoint", str(base), "--adapter", str(adapter)], ["--checkpoint", str(whole)]):
        assert main([*argv, *extra]) == 0
        results.append(json.loads(capsys.readouterr().out))
    with_adapter, saved_whole = results
    assert with_adapter["policy"] == "base+adapter" and saved_whole["policy"] == "whole"
    texts = [[s["text"] for s in p["samples"]] for p in with_adapter["problems"]]
    assert texts == [[s["text"] for s in p["samples"]] for p in saved_whole["problems"]]
    assert all(t for sample in texts for t in sample)


def test_a_directory_that_is_not_an_adapter_exits_2_naming_it(checkpoints, capsys):
    base, _, _ = checkpoints
    assert main(["eval", "--checkpoint", str(base), "--adapter", str(base), "--benchmark", "gsm8k"]) == 2
    assert "adapter" in (err := capsys.readouterr().err) and "no adapter_config.json" in err
