"""The engine on the Triton op set, decoding across the first 512-key attention split: its static decode
step runs the split-KV decode kernels (one program per token, kv head and split, then the combine), and
every sampled token's log-prob equals the trainer's packed forward bit for bit."""

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams, generate_batch  # noqa: E402
from rz_agents.model import ModelConfig, Transformer  # noqa: E402
from rz_agents.model.logprobs import packed_token_logprobs  # noqa: E402
from rz_kernels.triton_ops import attention as ta  # noqa: E402


def test_engine_decode_across_a_split_boundary_equals_the_trainer_forward(monkeypatch):
    shape = dict(
        vocab_size=200, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
    )
    model = Transformer(ModelConfig.tiny("qwen3", dtype="bfloat16", **shape), kernels="triton")
    model.reset_parameters(std=0.1, seed=0)
    splits = []  # the split bound of every decode step's attention calls
    real = ta.decode_partials

    def recording(q, k, v, plan, scale):
        splits.append(plan.decode_splits)
        return real(q, k, v, plan, scale)

    monkeypatch.setattr(ta, "decode_partials", recording)
    split = ta.SPLIT_BLOCKS * ta.BLOCK_N
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 200, (n,), generator=gen).tolist() for n in (split - 3, 20)]
    params = [SamplingParams(temperature=1.0, max_tokens=6, seed=i, ignore_eos=True) for i in range(2)]
    engine = RZEngine(model, EngineConfig(max_running=4, max_len=640, max_batch_tokens=256, num_threads=1))
    outs = generate_batch(engine, prompts, params)
    assert max(splits) == 2  # decode steps ran the split kernels, past the first boundary
    for prompt, out in zip(prompts, outs, strict=True):
        (lp,) = packed_token_logprobs(model, [prompt + out.tokens], temperature=1.0)
        assert torch.equal(out.logprobs, lp[len(prompt) - 1 :])
