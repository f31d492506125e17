"""Qwen2 and DeepSeek-V3: our model equals transformers' own (eager, fp32) on tiny random checkpoints that
transformers wrote, and checkpoints round-trip exactly.

Shapes cover tied / untied embeddings, head dims (derived and explicit), q/k/v biases, MLA with and without
a low-rank q, interleaved and rotate-half RoPE, YaRN, dense first layers, one and several expert groups.
Biases, norms and DeepSeek's correction bias are randomized (transformers initializes them to 0 / 1, which
would hide a path that drops one).
"""

import json

import pytest
import torch

from rz_agents.model import ModelConfig
from rz_agents.model.checkpoint import load_hf_checkpoint, save_hf_checkpoint

transformers = pytest.importorskip("transformers")

YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=96, max_position_embeddings=256)

QWEN2 = {
    "untied": dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    "tied-hd32-mqa": dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        tie_word_embeddings=True,
    ),
    "yarn": dict(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, rope_parameters=YARN),
}
_DS_BASE = dict(
    num_attention_heads=4,
    num_key_value_heads=4,
    moe_intermediate_size=32,
    n_routed_experts=8,
    num_experts_per_tok=2,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    kv_lora_rank=16,
)
DEEPSEEK = {
    # low-rank q, 4 groups (2 kept), v head dim != q/k head dim, YaRN with mscale, interleaved RoPE
    "groups-yarn": dict(
        _DS_BASE,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        n_group=4,
        topk_group=2,
        n_shared_experts=1,
        q_lora_rank=24,
        v_head_dim=12,
        routed_scaling_factor=2.5,
        rope_parameters=YARN,
    ),
    # full-rank q, one group, two dense first layers, tied, rotate-half RoPE, unnormalized weights
    "dense-first-tied": dict(
        _DS_BASE,
        num_hidden_layers=3,
        first_k_dense_replace=2,
        n_group=1,
        topk_group=1,
        n_shared_experts=2,
        q_lora_rank=None,
        v_head_dim=16,
        norm_topk_prob=False,
        rope_interleave=False,
        tie_word_embeddings=True,
        routed_scaling_factor=1.0,
    ),
}


def _hf_model(arch: str, fields: dict):
    torch.manual_seed(0)
    if arch == "qwen2":
        hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON, **fields))
    else:
        hf = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**COMMON, **fields))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, t in list(hf.named_parameters()) + list(hf.named_buffers()):
            if name.endswith("bias") or name.endswith("e_score_correction_bias"):
                t.copy_(torch.randn(t.shape, generator=gen) * 0.1)
            elif "norm" in name:
                t.copy_(1 + torch.randn(t.shape, generator=gen) * 0.1)
    return hf.eval()


def _cases():
    return [("qwen2", k, v) for k, v in QWEN2.items()] + [("deepseek_v3", k, v) for k, v in DEEPSEEK.items()]


@pytest.mark.parametrize("arch,name,fields", _cases(), ids=[f"{a}-{n}" for a, n, _ in _cases()])
def test_equal_to_transformers_and_round_trip(tmp_path, arch, name, fields):
    hf = _hf_model(arch, fields)
    hf.save_pretrained(tmp_path / "hf")
    tokens = torch.randint(0, COMMON["vocab_size"], (2, 80), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = torch.log_softmax(hf(tokens).logits.float(), -1)
    positions = torch.arange(80).expand(2, 80)
    for kernels in ("aligned", "standard"):
        ours = load_hf_checkpoint(tmp_path / "hf", kernels=kernels)
        assert ours.config.model_type == arch
        with torch.no_grad():
            logp = torch.log_softmax(ours.logits(ours(tokens, positions)), -1)
        dlogp = float((logp - ref).abs().max())
        assert dlogp <= 1e-4, f"{kernels}: max |dlogp| {dlogp:.3g}"

    # Our save reloads bit for bit (buffers included), and transformers reads it as the same model.
    saved = save_hf_checkpoint(ours, tmp_path / "ours")
    back = load_hf_checkpoint(saved, kernels="standard")
    mine, theirs = ours.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) and mine[k].dtype == theirs[k].dtype for k in mine)
    hf_back = transformers.AutoModelForCausalLM.from_pretrained(saved).eval()
    with torch.no_grad():
        assert torch.equal(torch.log_softmax(hf_back(tokens).logits.float(), -1), ref)


def test_qwen2_sliding_window_is_refused_in_one_line(tmp_path):
    cfg = ModelConfig.tiny("qwen2").to_hf()
    cfg.update(use_sliding_window=True, sliding_window=64)
    with pytest.raises(ValueError, match="use_sliding_window") as err:
        ModelConfig.from_hf(cfg)
    assert "\n" not in str(err.value)


def test_deepseek_config_fields_survive_to_hf_and_back():
    cfg = ModelConfig.tiny("deepseek_v3", q_lora_rank=None, rope_scaling=dict(YARN))
    back = ModelConfig.from_hf(json.loads(json.dumps(cfg.to_hf())))
    assert back == cfg
    assert cfg.head_dim == 32 and cfg.num_key_value_heads == cfg.num_attention_heads  # 16 + 8 -> 32
    with pytest.raises(ValueError, match="n_group"):
        ModelConfig.tiny("deepseek_v3", n_group=3)
    with pytest.raises(ValueError, match="topk_group"):
        ModelConfig.tiny("deepseek_v3", topk_group=4)
    with pytest.raises(ValueError, match="scoring_func"):
        ModelConfig.from_hf({**cfg.to_hf(), "scoring_func": "softmax"})


def test_deepseek_chat_formats_other_than_v31_are_refused_with_a_clear_error():
    from types import SimpleNamespace

    from rz_agents.model.chat_template import QWEN25_CHAT_TEMPLATE, template_for
    from rz_agents.model.deepseek_chat import DEEPSEEK_V31_CHAT_TEMPLATE

    r1_distill = (
        "{{bos_token}}{% for m in messages %}<\uff5cUser\uff5c>{{m.content}}{% endfor %}"
        "<\uff5cAssistant\uff5c><think>\n"
    )
    with pytest.raises(ValueError, match="DeepSeek's but not V3.1's") as err:
        template_for(SimpleNamespace(chat_template=r1_distill))
    assert "\n" not in str(err.value)
    v31 = "{{ bos_token }}{{'<\uff5cAssistant\uff5c></think>'}}"  # V3.1 (and V3.1-Terminus): rendered
    assert template_for(SimpleNamespace(chat_template=v31)) is DEEPSEEK_V31_CHAT_TEMPLATE
    qwen25 = (
        "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}"
    )
    assert template_for(SimpleNamespace(chat_template=qwen25)) is QWEN25_CHAT_TEMPLATE


def test_deepseek_multi_token_prediction_layer_is_skipped_on_load(tmp_path):
    from safetensors.torch import load_file, save_file

    from rz_agents.model import Transformer

    model = Transformer(ModelConfig.tiny("deepseek_v3", num_hidden_layers=2))
    ckpt = save_hf_checkpoint(model, tmp_path / "c")
    state = load_file(str(ckpt / "model.safetensors"))
    state["model.layers.2.eh_proj.weight"] = torch.zeros(64, 128)  # what the released checkpoints carry
    save_file(state, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    back = load_hf_checkpoint(ckpt)
    mine, theirs = model.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
