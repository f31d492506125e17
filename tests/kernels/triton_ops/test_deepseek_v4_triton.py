"""DeepSeek-V4's MoE and a whole tiny V4 model on the Triton op set, run by the interpreter.

The clamped SwiGLU kernel: a row's bits alone equal its bits among other rows, close to the torch form (the
CPU op sets'), the clamp applied (a negative control: the unclamped kernel differs), gradients as torch's.
The V4 MoE runs its routed experts as the grouped GEMMs with the clamp (no per-expert fallback): a token's
output alone equals its output packed with others, close to the CPU op set. The whole model (sliding window +
CSA with its indexer, learned-routed MoE) through the engine's paged cache: every sampled token's log-prob
equals the learner's packed forward bit for bit (torch.equal), bf16, with decode across a CSA block boundary.
"""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from rz_agents.engine import EngineConfig, RZEngine, generate_batch  # noqa: E402
from rz_agents.engine.host_reads import HostReads  # noqa: E402
from rz_agents.model.deepseek_v4 import DeepseekV4ForCausalLM  # noqa: E402
from rz_agents.model.deepseek_v4_config import DeepseekV4Config  # noqa: E402
from rz_agents.model.deepseek_v4_layers import clamped_swiglu as torch_clamped_swiglu  # noqa: E402
from rz_kernels import get_ops  # noqa: E402
from rz_kernels.triton_ops import moe as triton_moe  # noqa: E402
from rz_kernels.triton_ops.clamped_swiglu import _limit_in, clamped_swiglu  # noqa: E402
from rz_kernels.triton_ops.opset import TRITON  # noqa: E402
from rz_kernels.triton_ops.rowwise import silu_mul  # noqa: E402
from tests.engine.engine_alignment import assert_equal_to_learner, random_prompts, seeded_params  # noqa: E402
from tests.engine.test_engine_deepseek_v4_graph_decode import ReplayEmulator  # noqa: E402

VOCAB = 96
LIMIT = 0.75  # small: the tiny model's expert pre-activations cross it, so the clamp is exercised


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_clamped_swiglu_rows_are_batch_invariant_close_to_torch_and_clamped(dtype):
    gen = torch.Generator().manual_seed(0)
    gate = (torch.randn(7, 40, generator=gen) * 2).to(dtype)
    up = (torch.randn(7, 40, generator=gen) * 2).to(dtype)
    full = clamped_swiglu(gate, up, LIMIT)
    torch.testing.assert_close(full, torch_clamped_swiglu(gate, up, LIMIT), **_tol(dtype))
    for i in (0, 6):
        assert torch.equal(clamped_swiglu(gate[i : i + 1], up[i : i + 1], LIMIT), full[i : i + 1])
    # negative control: values past the limit are what the clamp changes (silu_mul's are not clamped)
    assert (gate > LIMIT).any() and (up.abs() > LIMIT).any()
    assert not torch.equal(silu_mul(gate, up), full)
    a = [x.float().clone().requires_grad_() for x in (gate, up)]
    b = [x.float().clone().requires_grad_() for x in (gate, up)]
    clamped_swiglu(*a, LIMIT).square().sum().backward()
    torch_clamped_swiglu(*b, LIMIT).square().sum().backward()
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.grad, y.grad)


def test_the_clamp_limit_is_rounded_as_torch_rounds_it_without_a_tensor():
    # (a tensor would be read back with .item(): the host-read check before a CUDA-graph capture refuses it)
    gen = torch.Generator().manual_seed(0)
    values = [0.75, 7.0, 10.0, 1 / 3, 1e-8, 65504.0, 65519.0, 65520.0, 1e5, 3e38]
    values += (torch.rand(2000, generator=gen, dtype=torch.float64) * 200 - 100).tolist()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        torch_rounded = torch.tensor(values, dtype=torch.float32).to(dtype).float().tolist()
        with HostReads() as reads:
            ours = [_limit_in(dtype, v) for v in values]
        assert ours == torch_rounded and reads.reads == []


def _config(dtype: str) -> DeepseekV4Config:
    return DeepseekV4Config(
        vocab_size=VOCAB, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, head_dim=16, q_lora_rank=16, num_experts_per_tok=2, n_routed_experts=4,
        layer_types=("compressed_sparse_attention",), mlp_layer_types=("moe",), csa_rate=4, hca_rate=16,
        qk_rope_head_dim=8, hc_mult=2, hc_sinkhorn_iters=4, sliding_window=8, o_groups=2, o_lora_rank=8,
        index_n_heads=1, index_head_dim=16, index_topk=2, max_position_embeddings=128, swiglu_limit=LIMIT,
        dtype=dtype, hf={"model_type": "deepseek_v4"},
    )  # fmt: skip


def _model(dtype: str, kernels: str) -> DeepseekV4ForCausalLM:
    """A tiny random V4 with sharp logits (the head x3) and random sinks and router biases."""
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM(_config(dtype), kernels)
    model.reset_parameters(std=0.3, seed=0)
    model.randomize_biases(0)
    with torch.no_grad():
        model.head.weight.mul_(3)
    return model.eval()


def test_v4_moe_runs_the_grouped_kernels_with_the_clamp_and_each_token_alone_gets_its_packed_bits(
    monkeypatch,
):
    model = _model("bfloat16", "triton")
    assert model.ops_for("cpu") is TRITON
    moe = model.model.layers[0].ffn
    calls = []
    real = triton_moe.grouped_matmul
    monkeypatch.setattr(triton_moe, "grouped_matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(9, 32, generator=gen) * 2).bfloat16()
    tokens = torch.randint(0, VOCAB, (9,), generator=gen)
    with torch.no_grad():
        packed = moe(x, tokens, TRITON)
        assert len(calls) == 3  # gate, up, down: the grouped GEMMs (no per-expert torch fallback)
        for i in (0, 4, 8):
            assert torch.equal(moe(x[i : i + 1], tokens[i : i + 1], TRITON), packed[i : i + 1])
        cpu = _model("bfloat16", "aligned").model.layers[0].ffn
        torch.testing.assert_close(packed, cpu(x, tokens, get_ops("aligned")), rtol=3e-2, atol=3e-2)
        # negative control: the same MoE without the clamp (the stock SwiGLU) gives other bits
        monkeypatch.setattr(moe.shared_experts, "limit", 1e4)
        assert not torch.equal(moe(x, tokens, TRITON), packed)


def test_engine_on_the_triton_op_set_equals_the_learner_bit_for_bit():
    """Decode steps run as CUDA-graph replays would (tests/engine/test_engine_deepseek_v4_graph_decode.py's
    emulator: the graph's position bound, the capture's host positions): equal to the learner, and on the
    Triton op set the whole step reads nothing back to the host, its MoE included (a capture's condition)."""
    model = _model("bfloat16", "triton")
    prompts = random_prompts([6, 3], VOCAB, seed=0)  # decode from position 6 crosses the CSA block at 8
    engine = RZEngine(model, EngineConfig(max_running=4, max_len=64, max_batch_tokens=32, num_threads=1))
    replays = ReplayEmulator(engine, trace=False)
    outs = generate_batch(engine, prompts, seeded_params(2, 3))
    assert_equal_to_learner(model, prompts, outs)
    assert sorted(replays.captured) == [(2, 63)] and len(replays.positions[(2, 63)]) == 2 * 2
    assert replays.reads == []
