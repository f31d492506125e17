"""Qwen3.5 with its vision tower in the rz engine: requests carry images; the log-probs of every sampled token
equal the learner's packed forward (which re-encodes all images in one call) bit for bit (torch.equal), in
fp32 and bf16, with prefill chunks cutting through images and through the delta rule's 64-token chunks,
text-only requests in the same batches, and static decode steps rotating by index + the M-RoPE delta.
Negative control: the standard op set does not."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rz_agents.engine import EngineConfig, ImagePrompt, RZEngine, SamplingParams
from rz_agents.model.logprobs import packed_token_logprobs
from rz_agents.model.policy import PolicySpec, build_policy
from rz_agents.model.qwen3_5_vl import Qwen35VLForConditionalGeneration
from rz_agents.model.vision import VLSequence

IMG, START, END = 300, 302, 303
VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2}


def _model(kernels: str = "aligned", dtype: str = "float32") -> Qwen35VLForConditionalGeneration:
    """A tiny random Qwen3.5-VL with sharp logits (weights std 0.3, LM head x3) and a slow delta-rule decay
    (the state carries across chunks)."""
    spec = PolicySpec(
        model_type="qwen3_5", vocab_size=320, dtype=dtype, kernels=kernels, tiny_overrides={"vision": VISION}
    )
    model = build_policy(spec)
    model.reset_parameters(std=0.3, seed=3)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        model.lm_head.weight.mul_(3)
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.005, 0.05, generator=gen).log())
    return model.eval()


def _request(grids, seed: int, text_len: int) -> tuple[list[int], ImagePrompt | None]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 290, (text_len,), generator=gen).tolist()
    for t, h, w in grids:
        tokens += (
            [START] + [IMG] * (t * h * w // 4) + [END] + torch.randint(0, 290, (5,), generator=gen).tolist()
        )
    if not grids:
        return tokens, None
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), 3 * 2 * 8 * 8, generator=gen)
    return tokens, ImagePrompt(pixels, grids)


REQUESTS = [
    ([(1, 8, 6), (1, 2, 4)], 0, 56),  # 84 prompt tokens: the first image (tokens 56-69) crosses token 64
    ([], 1, 20),  # text only
    ([(1, 6, 6)], 2, 3),
]
PARAMS = [
    SamplingParams(temperature=1.0, max_tokens=6, seed=0),
    SamplingParams(temperature=0.7, top_k=20, max_tokens=6, seed=1),
    SamplingParams(temperature=1.3, top_p=0.8, max_tokens=6, seed=2),
]


def _run(model, engine=None, reqs=None, params=PARAMS):
    if engine is None:
        engine = RZEngine(model, EngineConfig(max_running=3, max_len=128, max_batch_tokens=23, num_threads=1))
    reqs = reqs or [_request(*r) for r in REQUESTS]

    async def go():
        return await asyncio.gather(
            *(engine.generate(p, sp, images=im) for (p, im), sp in zip(reqs, params, strict=True))
        )

    return engine, reqs, asyncio.run(go())


def _learner(model, reqs, outs, params=PARAMS) -> list[torch.Tensor]:
    """The learner's log-probs of the sampled tokens: one packed forward per sequence (its own sampling
    parameters), images re-encoded there."""
    out = []
    for (p, im), o, sp in zip(reqs, outs, params, strict=True):
        seq = VLSequence(p + o.tokens, im.image_grid_thw if im else None, im.pixel_values if im else None)
        with torch.no_grad():
            (lp,) = packed_token_logprobs(model, [seq], sp.temperature, sp.top_k, sp.top_p)
        out.append(lp[len(p) - 1 :])
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_with_images_equals_the_learner_bit_for_bit(dtype):
    model = _model(dtype=dtype)
    engine, reqs, outs = _run(model)
    assert engine.runner.images_encoded == 3  # every image once, though chunks and steps revisit them
    assert engine.stats()["static_decode_steps"] > 0
    for out, ref in zip(outs, _learner(model, reqs, outs), strict=True):
        assert out.finish_reason == "length" and len(out.tokens) == 6
        assert torch.equal(out.logprobs, ref)


def test_images_matter_and_the_standard_op_set_differs():
    model = _model()
    _, reqs, outs = _run(model)
    (p, _), o = reqs[0], outs[0]
    with torch.no_grad():  # the same tokens without the image rows: other log-probs (the images are used)
        (blind,) = packed_token_logprobs(model, [VLSequence(p + o.tokens)], 1.0)
    assert (blind[len(p) - 1 :] - o.logprobs).abs().max() > 1e-2
    model.set_kernels("standard")  # negative control: stock kernels in the engine and the learner
    _, reqs, outs = _run(model)
    refs = _learner(model, reqs, outs)
    assert not all(torch.equal(o.logprobs, r) for o, r in zip(outs, refs, strict=True))
    assert max((o.logprobs - r).abs().max().item() for o, r in zip(outs, refs, strict=True)) < 1e-3


def test_a_second_turn_reuses_the_screenshot_pages_and_preemption_recomputes_exactly():
    """Turn 2 repeats turn 1's prompt (two images), its reply and a new image: the prefix index reuses the
    pages (their recurrent-state snapshots with them); then too few pages for 2 sequences with images: one
    is preempted and recomputes. Every log-prob equals the learner's."""
    model = _model()
    engine = RZEngine(model, EngineConfig(max_running=3, max_len=192, max_batch_tokens=200, num_threads=1))
    _, (first,), (out,) = _run(model, engine, [_request(*REQUESTS[0])], PARAMS[:1])
    (grid_c,), seed = [(1, 2, 2)], 7
    tail, im_c = _request([grid_c], seed, 4)
    pixels = torch.cat([first[1].pixel_values, im_c.pixel_values])
    second = (first[0] + out.tokens + tail, ImagePrompt(pixels, [*first[1].image_grid_thw, grid_c]))
    _, _, (again,) = _run(model, engine, [second], PARAMS[:1])
    assert engine.stats()["prefix_tokens_reused"] >= 64  # whole pages by reference
    for o, ref in zip(
        [out, again], _learner(model, [first, second], [out, again], PARAMS[:1] * 2), strict=True
    ):
        assert torch.equal(o.logprobs, ref)
    # 3 pages (and the scratch page) for 2 sequences with images growing to 3 + 2 pages: preemptions
    params = [SamplingParams(temperature=1.0, max_tokens=50, seed=i) for i in range(2)]
    page = model.kv_page_bytes()
    tight = RZEngine(model, EngineConfig(max_len=192, max_batch_tokens=48, kv_cache_bytes=4 * page))
    _, reqs, outs = _run(model, tight, [_request(*REQUESTS[0]), _request(*REQUESTS[2])], params)
    assert tight.stats()["preemptions"] > 0
    for o, ref in zip(outs, _learner(model, reqs, outs, params), strict=True):
        assert torch.equal(o.logprobs, ref)
