"""The rz engine with a vision-language model (Qwen3-VL): requests carry images, each sequence's images are
encoded once (at the first prefill chunk holding a placeholder) and kept with it; the log-probs of every
sampled token equal the learner's packed forward (which re-encodes all images in one call) bit for bit,
with prefill chunks cutting through images and text-only requests in the same batches. Negative control:
the standard op set does not.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from rz_agents.engine import EngineConfig, ImagePrompt, RZEngine, SamplingParams
from rz_agents.engine.images import SequenceImages
from rz_agents.model.qwen3_vl import Qwen3VLModel, VLSequence, packed_logprobs
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig

IMG, START, END = 300, 302, 303


def _model(kernels: str = "aligned", dtype: str = "float32") -> Qwen3VLModel:
    model = Qwen3VLModel(Qwen3VLConfig.tiny(dtype=dtype, vocab_size=320), kernels=kernels)
    model.reset_parameters(std=0.1, seed=3)
    return model


def _request(grids, seed: int, text_len: int = 5) -> tuple[list[int], ImagePrompt | None]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 290, (text_len,), generator=gen).tolist()
    for t, h, w in grids:
        tokens += (
            [START] + [IMG] * (t * h * w // 4) + [END] + torch.randint(0, 290, (3,), generator=gen).tolist()
        )
    if not grids:
        return tokens, None
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), 3 * 2 * 8 * 8, generator=gen)
    return tokens, ImagePrompt(pixels, grids)


REQUESTS = [
    ([(1, 8, 6), (1, 2, 4)], 0),  # two images, 14 placeholders: chunked through the first
    ([], 1),  # text only
    ([(1, 6, 6)], 2),
    ([(1, 2, 2)], 3),
]


def _run(model, params: list[SamplingParams], max_batch_tokens: int = 10):
    engine = RZEngine(model, EngineConfig(max_running=3, max_len=128, max_batch_tokens=max_batch_tokens,
                                          num_threads=1))  # fmt: skip
    reqs = [_request(g, s) for g, s in REQUESTS]

    async def go():
        return await asyncio.gather(
            *(engine.generate(p, sp, images=im) for (p, im), sp in zip(reqs, params, strict=True))
        )

    return engine, reqs, asyncio.run(go())


def _learner(model, reqs, outs, params=None) -> list[torch.Tensor]:
    """The learner's log-probs of the sampled tokens: all sequences in one packed forward when they share
    sampling parameters, else one packed forward per sequence."""
    seqs = [
        VLSequence(p + out.tokens, im.image_grid_thw if im else None, im.pixel_values if im else None)
        for (p, im), out in zip(reqs, outs, strict=True)
    ]
    with torch.no_grad():
        if params is None:
            lps = packed_logprobs(model, seqs)
        else:
            lps = [
                packed_logprobs(model, [s], temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p)[0]
                for s, sp in zip(seqs, params, strict=True)
            ]
    return [lp[len(p) - 1 :] for lp, (p, _) in zip(lps, reqs, strict=True)]


MIXED = [
    SamplingParams(temperature=1.0, max_tokens=6, seed=0),
    SamplingParams(temperature=0.7, top_k=20, max_tokens=6, seed=1),
    SamplingParams(temperature=1.3, top_p=0.8, max_tokens=6, seed=2),
    SamplingParams(temperature=0.9, top_k=50, top_p=0.9, max_tokens=6, seed=3),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_with_images_equals_the_learner_bit_for_bit(dtype):
    model = _model(dtype=dtype)
    engine, reqs, outs = _run(model, MIXED)
    assert engine.runner.images_encoded == 4  # every image once, though chunks and steps revisit them
    assert engine.runner.graphs is None and engine.stats()["static_decode_steps"] > 0  # static decode on CPU
    for out, ref in zip(outs, _learner(model, reqs, outs, MIXED), strict=True):
        assert out.finish_reason == "length" and len(out.tokens) == 6
        assert torch.equal(out.logprobs, ref)


def test_negative_control_standard_kernels_differ():
    model = _model(kernels="standard")
    params = [SamplingParams(temperature=1.0, max_tokens=6, seed=i) for i in range(len(REQUESTS))]
    _, reqs, outs = _run(model, params)
    refs = _learner(model, reqs, outs)
    assert not all(torch.equal(o.logprobs, r) for o, r in zip(outs, refs, strict=True))
    assert max((o.logprobs - r).abs().max().item() for o, r in zip(outs, refs, strict=True)) < 1e-3


def test_images_change_the_completion_and_bad_requests_are_refused():
    model = _model()
    prompt, images = _request([(1, 2, 2)], 7)
    other = ImagePrompt(images.pixel_values + 1.0, images.image_grid_thw)
    engine = RZEngine(model, EngineConfig(max_running=2, max_len=64, max_batch_tokens=64, num_threads=1))
    greedy = SamplingParams(temperature=0.0, max_tokens=1)

    async def go(im):
        return await engine.generate(prompt, greedy, images=im)

    a, b = asyncio.run(go(images)), asyncio.run(go(other))
    assert a.logprobs.item() != b.logprobs.item()  # same tokens, other pixels: no stale prefix reuse
    with pytest.raises(ValueError, match="1 image grids given but the tokens hold placeholders for 0"):
        asyncio.run(engine.generate(prompt[:-6] + [5] * 6, greedy, images=images))
    with pytest.raises(ValueError, match="needs a vision-language model|has none"):
        asyncio.run(RZEngine(tiny_text_model()).generate(prompt, greedy, images=images))
    with pytest.raises(ValueError, match="pixel_values must be"):
        asyncio.run(engine.generate(prompt, greedy, images=ImagePrompt(images.pixel_values[:2], [(1, 2, 2)])))


def tiny_text_model():
    from rz_agents.model import ModelConfig, Transformer

    return Transformer(ModelConfig.tiny("qwen3", vocab_size=320))


def test_rope_columns_cross_the_end_of_the_prompt():
    model = _model()
    prompt, images = _request([(1, 4, 6)], 9)  # 5 text, start, 6 placeholders, end, 3 text
    seq = SequenceImages(prompt, images, model)
    full, delta = model.rope_positions(prompt + [7, 8, 9], images.image_grid_thw)
    assert delta == seq.delta == 3 - 6
    for a, b in [(0, len(prompt)), (3, 9), (9, len(prompt) + 2), (len(prompt), len(prompt) + 3), (0, 1)]:
        assert torch.equal(seq.rope_columns(a, b), full[:, a:b]), (a, b)


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_multi_turn_encodes_only_new_images_and_a_weight_update_reencodes(prefix_cache):
    model = _model()
    engine = RZEngine(
        model,
        EngineConfig(
            max_running=2, max_len=128, max_batch_tokens=16, num_threads=1, prefix_cache=prefix_cache
        ),
    )
    params = SamplingParams(temperature=1.0, max_tokens=4, seed=5)
    prompt, images = _request([(1, 4, 6)], 11)
    first = asyncio.run(engine.generate(prompt, params, images=images))
    assert engine.runner.images_encoded == 1
    # turn 2: the history (prompt + completion) and a new screenshot
    second_prompt, second_images = _request([(1, 2, 4)], 12, text_len=2)
    history = prompt + first.tokens + second_prompt
    both = ImagePrompt(torch.cat([images.pixel_values, second_images.pixel_values]), [(1, 4, 6), (1, 2, 4)])
    second = asyncio.run(engine.generate(history, params, images=both))
    assert engine.runner.images_encoded == 2  # the first screenshot is not encoded again
    # with the prefix cache its placeholders' K/V are reused (the encoding is not even read); without it
    # they are prefilled again from the image cache
    assert engine.stats()["images_reused"] == (0 if prefix_cache else 1)
    assert engine.stats()["images_prefix_reused"] == (1 if prefix_cache else 0)
    assert second.num_cached_prompt_tokens == (len(prompt) + len(first.tokens) - 1 if prefix_cache else 0)
    (ref,) = _learner(model, [(history, both)], [second])
    assert torch.equal(second.logprobs, ref)
    engine.load_weights({"lm_head.weight": model.lm_head.weight.detach() * 1.0}, version=1)
    asyncio.run(engine.generate(history, params, images=both))
    assert engine.runner.images_encoded == 4  # the cache belonged to the old weights
    assert engine.stats()["images_reused"] == (0 if prefix_cache else 1)  # nothing reused across the update
    assert engine.stats()["prefix_hits"] == (1 if prefix_cache else 0)
