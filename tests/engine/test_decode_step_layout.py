"""One decode-buffer layout for every model family: each bucket's block is [tokens | positions | rows | RoPE
positions | page tables] (engine/decode_step.py), for a text model and a vision-language one alike, so the
static step and its CUDA graphs have no family switch. A text model's RoPE row is its positions; the row is
what the model rotates by (negative control: a text model's decode fed RoPE positions one behind its positions
gives log-probs that differ from the learner's, while the real row's equal them bit for bit)."""

from __future__ import annotations

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams, generate_batch
from rz_agents.engine.decode_step import HEAD_ROWS, DecodeStep, StepBuffers
from rz_agents.engine.runner import ModelRunner
from rz_agents.model.kv_cache import KVCache
from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.model.qwen3_vl import Qwen3VLModel
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig


def _vl_model() -> Qwen3VLModel:
    model = Qwen3VLModel(Qwen3VLConfig.tiny(vocab_size=320), kernels="aligned")
    model.reset_parameters(std=0.1, seed=5)
    return model


def test_text_and_vision_language_decode_steps_share_one_buffer_layout(tiny_model):
    width = 3
    for model in (tiny_model("qwen3"), tiny_model("deepseek_v3"), _vl_model()):
        cache = KVCache(model.config, num_pages=4, device="cpu")
        step = DecodeStep(model, cache, max_batch=4, width=width, scratch_page=3)
        buf = step.fill([5, 6], [7, 9], [[0], [1]])
        assert buf.host.numel() == StepBuffers.size(2, width) == 2 * (HEAD_ROWS + width)
        assert buf.tokens.tolist() == [5, 6] and buf.positions.tolist() == [7, 9]
        assert buf.rope_positions.tolist() == [7, 9]  # no RoPE positions given: the positions
        assert buf.page_table.tolist() == [[0, 3, 3], [1, 3, 3]]
        buf = step.fill([5, 6], [7, 9], [[0], [1]], rope_positions=[4, 9])
        assert buf.rope_positions.tolist() == [4, 9]
        with pytest.raises(ValueError, match=r"must lie in \[0, position\]"):
            step.fill([5], [7], [[0]], rope_positions=[8])


def _learner_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    (lp,) = packed_token_logprobs(model, [prompt + tokens])
    return lp[len(prompt) - 1 :]


def _decode(model, prompts: list[list[int]]) -> tuple[list, int]:
    engine = RZEngine(model, EngineConfig(max_running=4, max_len=256, static_decode=True, num_threads=1))
    params = [SamplingParams(temperature=1.0, max_tokens=8, seed=i, ignore_eos=True) for i in range(3)]
    outs = generate_batch(engine, prompts, params)
    return outs, engine.stats()["static_decode_steps"]


def test_a_text_model_rotates_decode_rows_by_the_rope_row(tiny_model, monkeypatch):
    model = tiny_model("qwen3")
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 320, (n,), generator=gen).tolist() for n in (5, 19, 40)]
    outs, steps = _decode(model, prompts)
    assert steps >= 6
    for p, o in zip(prompts, outs, strict=True):
        assert torch.equal(o.logprobs, _learner_logprobs(model, p, o.tokens))
    real = ModelRunner._text_rope_positions
    # negative control: the decode rows rotate one position behind their index
    monkeypatch.setattr(ModelRunner, "_text_rope_positions", staticmethod(lambda b: [r - 1 for r in real(b)]))
    wrong, steps = _decode(model, prompts)
    assert steps >= 6
    for p, o in zip(prompts, wrong, strict=True):
        assert not torch.equal(o.logprobs, _learner_logprobs(model, p, o.tokens))
