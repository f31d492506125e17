"""HF checkpoint round trips: we save -> transformers loads -> same logits, and vice versa."""

import json

import pytest
import torch

from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.checkpoint import CheckpointError, load_hf_checkpoint, save_hf_checkpoint

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe", "llama"])
@pytest.mark.parametrize("tied", [False, True])
def test_hf_round_trip_same_logits(tmp_path, arch, tied):
    cfg = ModelConfig.tiny(arch, tie_word_embeddings=tied)
    ours = Transformer(cfg, kernels="standard")
    ours.reset_parameters(std=0.05, seed=7)
    ckpt = save_hf_checkpoint(ours, tmp_path / "ours", max_shard_bytes=60_000)  # force several shards
    assert (ckpt / "model.safetensors.index.json").exists()
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt)
    tokens = torch.randint(0, cfg.vocab_size, (1, 33))
    with torch.no_grad():
        hf_logits = hf(tokens).logits[0]
        our_logits = ours.logits(ours(tokens[0], torch.arange(33)))
    torch.testing.assert_close(our_logits, hf_logits, rtol=1e-5, atol=1e-5)

    hf.save_pretrained(tmp_path / "theirs")
    back = load_hf_checkpoint(tmp_path / "theirs", kernels="standard")
    with torch.no_grad():
        torch.testing.assert_close(
            back.logits(back(tokens[0], torch.arange(33))), hf_logits, rtol=1e-5, atol=1e-5
        )
    reloaded = load_hf_checkpoint(ckpt)
    for (n1, a), (n2, b) in zip(ours.state_dict().items(), reloaded.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(a, b)


def test_load_rejects_missing_tensors_with_clear_error(tmp_path):
    model = Transformer(ModelConfig.tiny("qwen3"))
    ckpt = save_hf_checkpoint(model, tmp_path / "c")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="missing"):
        load_hf_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match="config.json"):
        load_hf_checkpoint(tmp_path / "nowhere")
