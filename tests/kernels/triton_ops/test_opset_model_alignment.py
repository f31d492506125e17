"""The Triton op set inside the model: selected for "aligned" on CUDA, and the engine's cached path
(full/chunked prefill, decode, random cache slots with stale data) bit-identical to the packed and
padded training forwards — the same check `rz align-check` runs, here through the interpreter."""

import os
import random

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from rz_agents.model import ModelConfig, Transformer  # noqa: E402
from rz_agents.model.alignment import check_model  # noqa: E402
from rz_agents.model.logprobs import packed_token_logprobs  # noqa: E402
from rz_kernels import ALIGNED, STANDARD, get_ops  # noqa: E402
from rz_kernels.triton_ops.opset import TRITON  # noqa: E402


def _model(arch: str, dtype: str, kernels: str = "triton", **overrides) -> Transformer:
    shape = dict(
        vocab_size=200, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
    )
    cfg = ModelConfig.tiny(arch, dtype=dtype, **{**shape, **overrides})
    model = Transformer(cfg, kernels=kernels)
    model.reset_parameters(std=0.1, seed=0)
    return model


def test_aligned_resolves_to_triton_on_cuda_and_to_the_cpu_kernels_on_cpu():
    assert get_ops("aligned", "cuda") is TRITON
    assert get_ops("aligned", torch.device("cuda:1")) is TRITON
    assert get_ops("aligned", "cpu") is ALIGNED
    assert get_ops("aligned") is ALIGNED
    assert get_ops("standard", "cuda") is STANDARD
    assert get_ops("triton", "cpu") is TRITON
    assert _model("qwen3", "float32", kernels="aligned").ops is ALIGNED
    with pytest.raises(ValueError, match="unknown kernels"):
        get_ops("fast")


# deepseek_v3: MLA (padded 32-dim heads) + a MoE layer (first_k_dense_replace=0: its one layer is sparse)
@pytest.mark.parametrize(
    "arch,overrides",
    [("qwen3", {}), ("qwen3_moe", {}), ("qwen2", {}), ("deepseek_v3", {"first_k_dense_replace": 0})],
    ids=["qwen3", "qwen3_moe", "qwen2", "deepseek_v3"],
)
def test_cached_inference_and_training_forward_bit_identical_bf16(arch, overrides):
    report = check_model(_model(arch, "bfloat16", **overrides), seed=0, batch_sizes=(2,), max_len=10)
    assert report.tokens_checked > 20
    assert report.bit_identical, report.failures


def test_model_gradients_on_triton_match_the_cpu_aligned_op_set():
    model = _model("qwen3_moe", "float32")
    seqs = [torch.tensor(s) for s in ([1, 5, 9, 13, 2, 7], [4, 4, 8, 15, 16])]
    grads = {}
    for kernels in ("triton", "aligned"):
        model.set_kernels(kernels)
        model.zero_grad()
        sum(lp.sum() for lp in packed_token_logprobs(model, seqs)).backward()
        grads[kernels] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads["triton"].keys() == grads["aligned"].keys()
    for name, g in grads["triton"].items():
        torch.testing.assert_close(g, grads["aligned"][name], rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("RZ_SLOW_INTERPRETER_TESTS") != "1", reason="~5 min each: set RZ_SLOW_INTERPRETER_TESTS=1"
)
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe", "llama"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cached_inference_and_training_forward_bit_identical_more_batches(arch, dtype):
    # ~5 minutes each on one core: the interpreter runs every program of every launch in Python.
    rng = random.Random(f"{arch}-{dtype}")
    model = _model(arch, dtype, num_hidden_layers=2)
    model.reset_parameters(std=0.1, seed=rng.randrange(2**31))
    report = check_model(model, seed=1, batch_sizes=(1, 7), max_len=40)
    assert report.bit_identical, report.failures


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_projections_give_the_separate_gemms_bits_on_triton(dtype):
    from rz_agents.model import KVCache

    model = _model("qwen3", dtype)
    tokens = torch.randint(0, 200, (9,), generator=torch.Generator().manual_seed(1))

    def cached_logits():
        cache = KVCache(model.config, num_pages=2)
        with torch.no_grad():
            hidden = model(
                tokens, torch.arange(9), torch.zeros(9, dtype=torch.long), cache.view(torch.tensor([[1]]))
            )
            return model.logits(hidden)

    ref = cached_logits()
    model.fuse_projections()
    assert model.model.layers[0].self_attn.qkv.usable(TRITON)
    assert torch.equal(cached_logits(), ref)
