"""The engine on the Triton op set, decoding across the first attention split: its static decode step runs
the split-KV decode kernels (one program per token, kv head and split, then the combine), and every sampled
token's log-prob equals the trainer's packed forward bit for bit.

At 128-key splits (SPLIT_BLOCKS = 2 on the module, which engine and trainer alike read at every call, as
scripts/gpu_check.py's dry run does): the interpreter runs every program in Python, and a prompt past the
production 512-key boundary cost it a minute; the same kernels cross the same kind of boundary at 128 keys
(test_attention_splitkv.py checks the production split's decode against the trainer)."""

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
    monkeypatch.setattr(ta, "SPLIT_BLOCKS", 2)
    split = ta.SPLIT_BLOCKS * ta.BLOCK_N
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 200, (n,), generator=gen).tolist() for n in (split - 3, 20)]
    params = [SamplingParams(temperature=1.0, max_tokens=6, seed=i, ignore_eos=True) for i in range(2)]
    # prompts prefilled in chunks (split // 2 tokens) with decode rows riding along, as before at 512 keys
    cfg = EngineConfig(max_running=4, max_len=2 * split, max_batch_tokens=split // 2, num_threads=1)
    engine = RZEngine(model, cfg)
    outs = generate_batch(engine, prompts, params)
    assert max(splits) == 2  # decode steps ran the split kernels, past the first boundary
    for prompt, out in zip(prompts, outs, strict=True):
        (lp,) = packed_token_logprobs(model, [prompt + out.tokens], temperature=1.0)
        assert torch.equal(out.logprobs, lp[len(prompt) - 1 :])
