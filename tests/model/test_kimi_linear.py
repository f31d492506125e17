"""Kimi Linear (KDA + NoPE MLA + MoE) on rz's op set: equal to transformers on a tiny random checkpoint
written by transformers with sharp logits; a 0.1% decay, output-gate or MLA error moves the figure past the
tolerance (controls); the save round trip is exact and transformers reloads it; a sequence's logits have
the same bits in any packed batch and through a prefill cut anywhere then decode (fp32 and bf16)."""

import math

import pytest
import torch

from rz_agents.model.kimi_linear import load_kimi_linear
from rz_agents.model.kimi_linear_config import KimiLinearConfig
from rz_agents.model.qwen3_5 import SequenceState

hf_models = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOL = 1e-4
LENS = [150, 70]  # several KDA chunks (64), a partial one at each end
VOCAB = 96


def _hf_config():
    cfg = hf_models.KimiLinearConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
        q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, num_local_experts=8,
        num_experts_per_tok=2, n_group=1, topk_group=1, linear_head_dim=16, linear_num_heads=4,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=512,
        layer_types=["linear_attention"] * 3 + ["full_attention"], mlp_layer_types=["dense"] + ["sparse"] * 3,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    return cfg


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny KimiLinearForCausalLM saved by transformers, its matrices scaled (x3, LM head x48) so the
    logits are sharp (std ~7.6): flat logits hide errors."""
    torch.manual_seed(0)
    model = hf_models.KimiLinearForCausalLM(_hf_config()).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "conv" not in name:
                p.mul_(3 * (16 if name == "lm_head.weight" else 1))
    path = tmp_path_factory.mktemp("kimi_linear")
    model.save_pretrained(path)
    tokens = torch.randint(0, VOCAB, (sum(LENS),), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        starts = [0, LENS[0]]
        ref = torch.cat(
            [model(tokens[s : s + n].unsqueeze(0)).logits[0] for s, n in zip(starts, LENS, strict=True)]
        )
    return path, tokens, ref.float()


def _figure(model, tokens, ref_logp):
    with torch.no_grad():
        logp = model.logits(model(tokens, seq_lens=LENS)).log_softmax(-1)
    return (logp - ref_logp).abs().max().item()


def test_equal_to_transformers_with_sharp_logits_and_controls_for_decay_gate_and_mla(checkpoint):
    path, tokens, ref_logits = checkpoint
    assert ref_logits.std(-1).mean() >= 3  # sharp logits
    ref = ref_logits.log_softmax(-1)
    model = load_kimi_linear(path)
    cfg = model.config
    assert cfg.layer_types.count("linear_attention") == 3 and cfg.mlp_layer_types.count("sparse") == 3
    assert _figure(model, tokens, ref) <= TOL
    # controls: each 0.1% error must move the figure past the tolerance
    kda = [layer.self_attn for layer in model.model.layers[:3]]
    mla = model.model.layers[3].self_attn
    with torch.no_grad():
        for attn in kda:
            attn.A_log.add_(math.log(1.001))  # the per-channel decay, 0.1% off
        assert _figure(model, tokens, ref) > TOL
        for attn in kda:
            attn.A_log.sub_(math.log(1.001))
            attn.g_b_proj.weight.mul_(1.001)  # the output gate's pre-activation, 0.1% off
        assert _figure(model, tokens, ref) > TOL
        for attn in kda:
            attn.g_b_proj.weight.div_(1.001)
        assert _figure(model, tokens, ref) <= TOL  # (undone exactly enough)
        good = mla.scale
        mla.scale = good * 1.001  # the MLA softmax scale, 0.1% off
        assert _figure(model, tokens, ref) > TOL
        mla.scale = good
        mla.kv_a_layernorm.weight.mul_(1.001)  # the MLA latent's norm, 0.1% off
        assert _figure(model, tokens, ref) > TOL


def test_save_round_trip_is_exact_and_transformers_reloads_it(checkpoint, tmp_path):
    from safetensors.torch import load_file

    from rz_agents.model.checkpoint import save_hf_checkpoint

    path, tokens, ref = checkpoint
    model = load_kimi_linear(path)
    save_hf_checkpoint(model, tmp_path / "saved")
    again = load_kimi_linear(tmp_path / "saved")
    assert again.config == model.config
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    ours, theirs = (
        load_file(str(tmp_path / "saved/model.safetensors")),
        load_file(str(path / "model.safetensors")),
    )
    assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    hf = hf_models.KimiLinearForCausalLM.from_pretrained(
        tmp_path / "saved", attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        logits = hf(tokens[: LENS[0]].unsqueeze(0)).logits[0].float()
    assert torch.equal(logits, ref[: LENS[0]])  # the same weights, so transformers' own bits


def test_a_checkpoint_missing_a_tensor_is_refused_naming_it(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    path, _, _ = checkpoint
    state = load_file(str(path / "model.safetensors"))
    del state["model.layers.1.self_attn.A_log"]
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(ValueError, match="missing.*layers.1.self_attn.A_log"):
        load_kimi_linear(tmp_path)


def test_config_reads_moonshots_form_and_refuses_bad_fields():
    moonshot = {
        "model_type": "kimi_linear", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "num_experts": 8,
        "num_experts_per_token": 2, "first_k_dense_replace": 2,
        "linear_attn_config": {"kda_layers": [1, 2, 4], "full_attn_layers": [3], "num_heads": 2,
                               "head_dim": 32, "short_conv_kernel_size": 3},
    }  # fmt: skip
    cfg = KimiLinearConfig.from_hf(moonshot)
    assert cfg.layer_types == ("linear_attention", "linear_attention", "full_attention", "linear_attention")
    assert cfg.mlp_layer_types == ("dense", "dense", "sparse", "sparse")
    assert (cfg.linear_num_heads, cfg.linear_head_dim, cfg.linear_conv_kernel_dim) == (2, 32, 3)
    assert KimiLinearConfig.from_hf(cfg.to_hf()) == cfg
    with pytest.raises(ValueError, match="mlp_layer_types has 3 entries for 4 layers"):
        KimiLinearConfig.from_hf({**moonshot, "mlp_layer_types": ["dense"] * 3})
    with pytest.raises(ValueError, match="not a Kimi Linear config"):
        KimiLinearConfig.from_hf({**moonshot, "model_type": "qwen3"})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_sequence_gets_the_same_logits_packed_cut_anywhere_and_decoded(checkpoint, dtype):
    """The triad at model level: the learner's packed forward (next to other sequences), a prefill in
    chunks (cuts inside a KDA chunk and on its boundary) and one-token decode give the same bits."""
    path, tokens, _ = checkpoint
    model = load_kimi_linear(path, dtype=dtype)
    a, b = tokens[: LENS[0]], tokens[LENS[0] :]
    with torch.no_grad():
        alone = model.logits(model(a, seq_lens=[LENS[0]]))
        packed = model.logits(model(torch.cat([b[:9], a, b]), seq_lens=[9, LENS[0], LENS[1]]))
        assert torch.equal(packed[9 : 9 + LENS[0]], alone)
        for cuts in ((37, 64, 90), (1, 64, 65), (63, 129)):
            state, rows, prev = SequenceState(), [], 0
            for cut in (*cuts, LENS[0]):
                rows.append(model.logits(model(a[prev:cut], seq_lens=[cut - prev], states=[state])))
                prev = cut
            assert torch.equal(torch.cat(rows), alone), cuts
        state, other, rows = SequenceState(), SequenceState(), []
        rows.append(model.logits(model(a[:120], seq_lens=[120], states=[state])))
        for i in range(120, LENS[0]):
            step = torch.cat([a[i : i + 1], b[i - 120 : i - 119]])
            rows.append(model.logits(model(step, seq_lens=[1, 1], states=[state, other]))[:1])
        assert torch.equal(torch.cat(rows), alone)
    if dtype != torch.float32:
        return
    # negative control: the standard op set (stock fp32 GEMMs) gives the same rows other bits in a short call
    model.kernels = "standard"
    with torch.no_grad():
        std_alone = model.logits(model(a, seq_lens=[LENS[0]]))
        std_short = model.logits(model(a[:2], seq_lens=[2]))
    assert not torch.equal(std_short, std_alone[:2])
