"""The static (CUDA-graph-capturable) decode step with a vision-language model (Qwen3-VL): text tokens
decoded after an image prefill rotate by index + the sequence's M-RoPE delta, fed as the RoPE row of the
step's static buffers (engine/decode_step.py: one layout for every family). Its log-probs equal the eager
general forward's and the learner's packed forward's bit for bit (torch.equal), padding rows included; its
forward reads nothing back to the host (what a CUDA-graph capture needs: engine/cuda_graphs.py). Negative
control: without the delta (RoPE at the token index) the log-probs differ from the learner's.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from rz_agents.engine import EngineConfig, ImagePrompt, RZEngine, SamplingParams
from rz_agents.engine.cuda_graphs import warm_up
from rz_agents.engine.images import SequenceImages
from rz_agents.model.qwen3_vl import Qwen3VLModel, VLSequence, packed_logprobs
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig

IMG, START, END = 300, 302, 303


def _model(dtype: str = "float32") -> Qwen3VLModel:
    model = Qwen3VLModel(Qwen3VLConfig.tiny(dtype=dtype, vocab_size=320), kernels="aligned")
    model.reset_parameters(std=0.1, seed=5)
    return model


def _requests() -> list[tuple[list[int], ImagePrompt | None]]:
    """Two image requests (M-RoPE deltas -3 and -6), a text-only one: decoded together in one bucket of 4
    (one padding row)."""
    out = []
    for seed, grids in ((0, [(1, 4, 6)]), (1, [(1, 6, 6), (1, 2, 4)]), (2, [])):
        gen = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, 290, (4,), generator=gen).tolist()
        for t, h, w in grids:
            tokens += [START] + [IMG] * (t * h * w // 4) + [END] + [7, 8]
        pixels = torch.randn(sum(t * h * w for t, h, w in grids), 3 * 2 * 8 * 8, generator=gen)
        out.append((tokens, ImagePrompt(pixels, grids) if grids else None))
    return out


PARAMS = [SamplingParams(temperature=1.0, max_tokens=8, seed=i) for i in range(3)]


def _run(model, static_decode: bool):
    """The three requests at once; a static engine records the bucket of every decode step it runs."""
    engine = RZEngine(model, EngineConfig(max_running=4, max_len=128, max_batch_tokens=64, num_threads=1,
                                          static_decode=static_decode))  # fmt: skip
    engine.buckets_run = []
    step = engine.runner.decode_step
    if step is not None:
        real = step.run

        def run(tokens, positions, tables, rope=None):
            engine.buckets_run.append(step.bucket(len(tokens)))
            return real(tokens, positions, tables, rope)

        step.run = run
    reqs = _requests()

    async def go():
        return await asyncio.gather(
            *(engine.generate(p, sp, images=im) for (p, im), sp in zip(reqs, PARAMS, strict=True))
        )

    return engine, reqs, asyncio.run(go())


def _learner(model, reqs, outs):
    seqs = [
        VLSequence(p + o.tokens, im.image_grid_thw if im else None, im.pixel_values if im else None)
        for (p, im), o in zip(reqs, outs, strict=True)
    ]
    with torch.no_grad():
        lps = packed_logprobs(model, seqs)
    return [lp[len(p) - 1 :] for lp, (p, _) in zip(lps, reqs, strict=True)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_static_decode_after_images_equals_eager_and_the_learner(dtype):
    model = _model(dtype)
    static, reqs, outs = _run(model, static_decode=True)
    eager, _, ref = _run(model, static_decode=False)
    assert static.stats()["static_decode_steps"] >= 6 and eager.stats()["static_decode_steps"] == 0
    assert 4 in static.buckets_run  # 3 rows + 1 padding row
    assert [r.delta for r in (SequenceImages(p, im, model) for p, im in reqs[:2])] == [-3, -6]
    for a, b, c in zip(outs, ref, _learner(model, reqs, outs), strict=True):
        assert a.tokens == b.tokens and len(a.tokens) == 8
        assert torch.equal(a.logprobs, b.logprobs)
        assert torch.equal(a.logprobs, c)


def test_negative_control_rope_without_the_delta_differs(monkeypatch):
    model = _model()
    # the decode rows rotate by their token index, as a text model's would: wrong after an image
    monkeypatch.setattr(SequenceImages, "text_rope_position", lambda self, index: index)
    _, reqs, outs = _run(model, static_decode=True)
    learner = _learner(model, reqs, outs)
    assert torch.equal(outs[2].logprobs, learner[2])  # the text-only request has no delta
    assert not torch.equal(outs[0].logprobs, learner[0]) and not torch.equal(outs[1].logprobs, learner[1])


def test_vl_decode_step_reads_nothing_back_and_refuses_bad_rope_positions():
    model = _model()
    engine = RZEngine(model, EngineConfig(max_running=4, max_len=128, num_threads=1))
    step = engine.runner.decode_step
    buf = step.buffers(4)
    warm_up(step, buf)  # raises CaptureRefused naming the read if the forward read a device value back
    with pytest.raises(ValueError, match="needs one RoPE position per token"):
        step.fill([1], [5], [[0]], rope_positions=[5, 5])
    with pytest.raises(ValueError, match=r"must lie in \[0, position\]"):
        step.fill([1], [5], [[0]], rope_positions=[6])
    # a prompt's placeholder (length-1 final chunk) is not a text row: the general forward takes it
    prompt, images = _requests()[0]
    seq = SequenceImages(prompt, images, model)
    assert seq.text_rope_position(int(seq.slots[0])) is None
    assert seq.text_rope_position(len(prompt) + 3) == len(prompt) + 3 + seq.delta
    assert seq.text_rope_position(len(prompt) - 1) == int(seq.rope[0, len(prompt) - 1])
