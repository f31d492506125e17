"""Qwen3.5 (Gated DeltaNet + gated full attention) on rz's op set: equal to transformers on a tiny random
checkpoint written by transformers with sharp logits, a 0.1% RoPE or gate error moves the figure past the
tolerance (control), and a sequence's logits have the same bits in any packed batch (fp32 and bf16)."""

import math

import pytest
import torch

from rz_agents.model.qwen3_5 import SequenceState, load_qwen3_5
from rz_agents.model.qwen3_5_config import Qwen35Config
from rz_kernels import RopeTable

hf_models = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOL = 1e-4
LENS = [150, 70]  # several delta-rule chunks (64), a partial one at each end
VOCAB, HEAD_DIM, ROTARY = 96, 32, 8


def _hf_config():
    cfg = hf_models.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    return cfg


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Qwen3_5ForCausalLM saved by transformers, its matrices scaled (x3, LM head x48) so the
    logits are sharp (std ~7.7): flat logits hide errors (a 0.1% RoPE error moved a flat model's figure
    only ~2e-5)."""
    torch.manual_seed(0)
    model = hf_models.Qwen3_5ForCausalLM(_hf_config()).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(3 * (16 if name == "lm_head.weight" else 1))
    path = tmp_path_factory.mktemp("qwen3_5")
    model.save_pretrained(path)
    tokens = torch.randint(0, VOCAB, (sum(LENS),), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        starts = [0, LENS[0]]
        ref = torch.cat(
            [model(tokens[s : s + n].unsqueeze(0)).logits[0] for s, n in zip(starts, LENS, strict=True)]
        )
    return path, tokens, ref.float().log_softmax(-1)


def _figure(model, tokens, ref_logp):
    with torch.no_grad():
        logp = model.logits(model(tokens, seq_lens=LENS)).log_softmax(-1)
    return (logp - ref_logp).abs().max().item()


def test_equal_to_transformers_with_sharp_logits_and_a_control_for_rope_and_gates(checkpoint):
    path, tokens, ref = checkpoint
    assert ref.exp().max(-1).values.mean() > 0.5  # sharp: the top token carries most of the mass
    model = load_qwen3_5(path)
    assert model.config.layer_types.count("linear_attention") == 3 and model.config.rotary_dim == ROTARY
    assert _figure(model, tokens, ref) <= TOL
    # controls: each 0.1% error must move the figure past the tolerance
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, ROTARY, 2).float() / ROTARY))
    good_rope, model.rope = model.rope, RopeTable(ROTARY, 0.0, 512, inv_freq=inv_freq * 1.001)
    assert _figure(model, tokens, ref) > TOL
    model.rope = good_rope
    attn = model.model.layers[3].self_attn
    with torch.no_grad():
        gate_rows = attn.q_proj.weight.view(4, 2 * HEAD_DIM, -1)[:, HEAD_DIM:]
        gate_rows.mul_(1.001)  # the output gate's pre-activation, 0.1% off
        assert _figure(model, tokens, ref) > TOL
        gate_rows.div_(1.001)
        for layer in model.model.layers[:3]:
            layer.linear_attn.A_log.add_(math.log(1.001))  # the delta rule's decay gate, 0.1% off
        assert _figure(model, tokens, ref) > TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_sequence_gets_the_same_logits_in_any_packed_batch(checkpoint, dtype):
    path, tokens, _ = checkpoint
    model = load_qwen3_5(path, dtype=dtype)
    a, b = tokens[: LENS[0]], tokens[LENS[0] :]
    with torch.no_grad():
        alone = model.logits(model(a, seq_lens=[LENS[0]]))
        packed = model.logits(model(torch.cat([b[:9], a, b]), seq_lens=[9, LENS[0], LENS[1]]))
        # a shorter call: the first 100 rows do not change; two rows: stock GEMMs take another path below 4
        prefix = model.logits(model(a[:100], seq_lens=[100]))
        short = model.logits(model(a[:2], seq_lens=[2]))
    assert torch.equal(packed[9 : 9 + LENS[0]], alone)
    assert torch.equal(prefix, alone[:100]) and torch.equal(short, alone[:2])
    if dtype != torch.float32:
        return  # stock bf16 GEMMs happen to be row-invariant at these shapes here (see NOTES-cpu-alignment)
    # negative control: the standard op set (stock fp32 GEMMs) gives the same rows other bits in a short call
    model.kernels = "standard"
    with torch.no_grad():
        std_alone = model.logits(model(a, seq_lens=[LENS[0]]))
        std_short = model.logits(model(a[:2], seq_lens=[2]))
    assert not torch.equal(std_short, std_alone[:2])


def test_config_reads_a_vision_language_checkpoints_text_config_and_refuses_bad_fields():
    text = _hf_config().to_dict()
    cfg = Qwen35Config.from_hf({"model_type": "qwen3_5", "text_config": text})
    assert cfg.num_hidden_layers == 4 and cfg.partial_rotary_factor == 0.25 and cfg.rope_theta == 10000.0
    with pytest.raises(ValueError, match="layer_types has 3 entries for 4 layers"):
        Qwen35Config.from_hf({**text, "layer_types": ["full_attention"] * 3})
    with pytest.raises(ValueError, match="num_experts_per_tok 9 not in 1..num_experts"):
        Qwen35Config.from_hf({**text, "num_experts": 8, "num_experts_per_tok": 9})
    moe = {**text, "model_type": "qwen3_5_moe_text", "num_experts": 8, "num_experts_per_tok": 2}
    read = Qwen35Config.from_hf({"model_type": "qwen3_5_moe", "text_config": moe})
    assert read.model_type == "qwen3_5_moe_text" and read.num_experts == 8


def test_a_checkpoint_missing_a_tensor_is_refused_naming_it(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    path, _, _ = checkpoint
    state = load_file(str(path / "model.safetensors"))
    del state["model.layers.0.linear_attn.A_log"]
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(ValueError, match="missing.*layers.0.linear_attn.A_log"):
        load_qwen3_5(tmp_path)


def test_save_round_trip_is_exact_and_transformers_loads_it(checkpoint, tmp_path):
    from rz_agents.model.checkpoint import save_hf_checkpoint

    path, tokens, ref = checkpoint
    model = load_qwen3_5(path)
    save_hf_checkpoint(model, tmp_path / "saved")
    again = load_qwen3_5(tmp_path / "saved")
    assert again.config == model.config
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    hf = hf_models.Qwen3_5ForCausalLM.from_pretrained(tmp_path / "saved", attn_implementation="eager").eval()
    with torch.no_grad():
        logp = hf(tokens[: LENS[0]].unsqueeze(0)).logits[0].float().log_softmax(-1)
    assert torch.equal(logp, ref[: LENS[0]])  # the same weights, so transformers' own bits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cached_prefill_cut_anywhere_then_decode_equals_the_packed_forward(checkpoint, dtype):
    """The triad at model level: the learner's packed forward, a prefill in chunks (cuts inside a delta-rule
    chunk and on its boundary) and one-token decode give every token the same logits bit for bit."""
    path, tokens, _ = checkpoint
    model = load_qwen3_5(path, dtype=dtype)
    seq = tokens[:100]
    with torch.no_grad():
        packed = model.logits(model(seq, seq_lens=[100]))
        for cuts in ((37, 64, 90), (1, 64, 65), (63, 99)):
            state, rows, prev = SequenceState(), [], 0
            for cut in (*cuts, 100):
                rows.append(model.logits(model(seq[prev:cut], seq_lens=[cut - prev], states=[state])))
                prev = cut
            assert torch.equal(torch.cat(rows), packed), cuts
            assert state.position == 100
        # decode next to another sequence's prefill chunk, token by token
        state, other, rows = SequenceState(), SequenceState(), []
        rows.append(model.logits(model(seq[:50], seq_lens=[50], states=[state])))
        for i in range(50, 100):
            step = torch.cat([seq[i : i + 1], tokens[100 + i : 101 + i]])
            rows.append(model.logits(model(step, seq_lens=[1, 1], states=[state, other]))[:1])
        assert torch.equal(torch.cat(rows), packed)
