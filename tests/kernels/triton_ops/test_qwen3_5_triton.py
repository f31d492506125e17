"""A tiny Qwen3.5 (one Gated DeltaNet layer, one full-attention layer) on the Triton op set, run by the
interpreter: the learner's packed forward, a prefill cut inside and on a delta-rule chunk boundary, and
one-token decode across the boundary give every token the same logits bit for bit; close to the CPU op set."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from rz_agents.model.qwen3_5 import Qwen35ForCausalLM, SequenceState  # noqa: E402
from rz_agents.model.qwen3_5_config import Qwen35Config  # noqa: E402
from rz_kernels.delta_rule import CHUNK  # noqa: E402
from rz_kernels.triton_ops.opset import TRITON  # noqa: E402

N = CHUNK + 6


def _model(kernels: str) -> Qwen35ForCausalLM:
    cfg = Qwen35Config.tiny(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
        layer_types=("linear_attention", "full_attention"),
    )  # fmt: skip
    model = Qwen35ForCausalLM(cfg, kernels=kernels)
    model.reset_parameters(std=0.3, seed=0)
    return model.eval()


def test_packed_prefill_cuts_and_decode_give_the_same_logits_on_the_triton_op_set():
    model = _model("triton")
    assert model.ops is TRITON
    gen = torch.Generator().manual_seed(1)
    seq, other = torch.randint(0, 64, (N,), generator=gen), torch.randint(0, 64, (9,), generator=gen)
    with torch.no_grad():
        packed = model.logits(model(torch.cat([other, seq]), seq_lens=[9, N]))[9:]
        cpu = _model("aligned")
        torch.testing.assert_close(packed, cpu.logits(cpu(seq, seq_lens=[N])), rtol=1e-4, atol=1e-4)
        for cuts in ((37, CHUNK), (CHUNK - 1,)):
            state, rows, prev = SequenceState(), [], 0
            for cut in (*cuts, N):
                rows.append(model.logits(model(seq[prev:cut], seq_lens=[cut - prev], states=[state])))
                prev = cut
            assert torch.equal(torch.cat(rows), packed), cuts
        state, rows = SequenceState(), []
        rows.append(model.logits(model(seq[: CHUNK - 2], seq_lens=[CHUNK - 2], states=[state])))
        for i in range(CHUNK - 2, N):  # across the chunk boundary, token by token
            rows.append(model.logits(model(seq[i : i + 1], seq_lens=[1], states=[state])))
        assert torch.equal(torch.cat(rows), packed)
