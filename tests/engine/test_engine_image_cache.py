"""The engine's cache of encoded images within its byte budget (engine.image_cache_bytes, engine/images.py):
a long multi-image stream keeps the cache under the budget, evicts (least recently used, encodings no live
sequence needs first), and an evicted encoding that is needed again is encoded again to the same bits: every
log-prob equals the run without eviction and the learner's packed forward (torch.equal). Negative control:
with the standard op set the engine no longer equals the learner, so the comparison can fail.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from rz_agents.engine import EngineConfig, ImagePrompt, RZEngine, SamplingParams
from rz_agents.engine.images import ImageCache, encoding_bytes, image_key
from rz_agents.model.qwen3_vl import Qwen3VLModel
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig
from rz_agents.model.vision import ImageEmbeddings

IMG, START, END = 300, 302, 303
PATCH_DIM = 3 * 2 * 8 * 8
TOKEN_BYTES = 64 * 3 * 4  # text hidden 64 x (1 + 2 deepstack) x fp32, per merged image token


def _model(kernels: str = "aligned") -> Qwen3VLModel:
    model = Qwen3VLModel(Qwen3VLConfig.tiny(vocab_size=320), kernels=kernels)
    model.reset_parameters(std=0.1, seed=4)
    return model


def _image(seed: int, grid=(1, 4, 4)) -> tuple[torch.Tensor, tuple]:
    gen = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(grid[0] * grid[1] * grid[2], PATCH_DIM, generator=gen), grid


def _stream() -> list[tuple[list[int], ImagePrompt]]:
    """12 requests of 2-3 images each (4 merged tokens an image): a shared 'desktop' image in every third,
    the others fresh or repeated from the request before (a next turn)."""
    reqs = []
    for r in range(12):
        ids = [r + 100, r + 101] + ([0] if r % 3 == 0 else []) + [r + 200]
        if r % 2:
            ids.append(r + 199)  # the previous request's last image again
        images = [_image(i) for i in ids]
        gen = torch.Generator().manual_seed(r)
        tokens = torch.randint(0, 290, (3,), generator=gen).tolist()
        for _, (t, h, w) in images:
            tokens += (
                [START]
                + [IMG] * (t * h * w // 4)
                + [END]
                + torch.randint(0, 290, (2,), generator=gen).tolist()
            )
        pixels = torch.cat([p for p, _ in images])
        reqs.append((tokens, ImagePrompt(pixels, [g for _, g in images])))
    return reqs


def _run(model, image_cache_bytes: int, reqs):
    engine = RZEngine(
        model,
        EngineConfig(max_running=3, max_len=128, max_batch_tokens=6, num_threads=1,
                     image_cache_bytes=image_cache_bytes),
    )  # fmt: skip
    params = [SamplingParams(temperature=1.0, max_tokens=4, seed=i) for i in range(len(reqs))]
    peaks = []

    async def one(i):
        p, im = reqs[i]
        return await engine.generate(p, params[i], images=im)

    async def go():
        outs = []
        for a in range(0, len(reqs), 4):  # waves of 4 requests: 3 running, one waiting
            outs += await asyncio.gather(*(one(i) for i in range(a, min(a + 4, len(reqs)))))
            peaks.append(engine.stats()["image_cache_bytes_held"])
        return outs

    return engine, asyncio.run(go()), peaks


def test_a_long_multi_image_stream_stays_under_the_budget_and_eviction_changes_no_bit(vl_learner):
    model = _model()
    reqs = _stream()
    budget = 3 * 4 * TOKEN_BYTES  # three images
    small, outs, _ = _run(model, budget, reqs)
    roomy, ref, _ = _run(model, 1 << 30, reqs)
    s, r = small.stats(), roomy.stats()
    assert s["image_cache_bytes_peak"] <= budget and s["image_cache_bytes_held"] <= budget
    assert s["image_cache_bytes_budget"] == budget
    assert s["image_cache_evictions"] > 0 and r["image_cache_evictions"] == 0
    assert s["image_cache_evictions_needed"] > 0  # the budget forced out encodings still to be fed
    assert s["static_decode_steps"] > 0
    # some evicted encodings were needed again (a later chunk, another turn): encoded again
    assert s["images_encoded"] > r["images_encoded"] == 26  # distinct images of the stream
    assert r["image_cache_hits"] > 0 and s["image_cache_misses"] == s["images_encoded"]
    assert r["image_cache_bytes_held"] == r["image_cache_entries"] * 4 * TOKEN_BYTES
    learner = vl_learner(model, reqs, outs)
    for a, b, c in zip(outs, ref, learner, strict=True):
        assert a.tokens == b.tokens and len(a.tokens) == 4
        assert torch.equal(a.logprobs, b.logprobs)  # re-encoded after eviction: the same bits
        assert torch.equal(a.logprobs, c)  # and the learner's


def test_negative_control_standard_kernels_differ_from_the_learner(vl_learner):
    model = _model(kernels="standard")
    reqs = _stream()[:4]
    _, outs, _ = _run(model, 3 * 4 * TOKEN_BYTES, reqs)
    learner = vl_learner(model, reqs, outs)
    assert not all(torch.equal(o.logprobs, r) for o, r in zip(outs, learner, strict=True))
    assert max((o.logprobs - r).abs().max().item() for o, r in zip(outs, learner, strict=True)) < 1e-3


def _emb(value: float, tokens: int = 4) -> ImageEmbeddings:
    return ImageEmbeddings(torch.full((tokens, 8), value), (torch.full((tokens, 8), -value),), (tokens,))


def test_cache_evicts_unneeded_first_never_the_step_and_copies_views():
    one = encoding_bytes(_emb(0.0))
    assert one == 2 * 4 * 8 * 4
    cache = ImageCache(max_bytes=3 * one)
    for k in "abc":
        cache.put(k, _emb(1.0))
    assert cache.get("a") is not None  # a is now the most recently used: b, c, a
    cache.put("d", _emb(2.0), needed={"b"})  # b is needed: c (unneeded, least recent) goes
    assert "c" not in cache and {"a", "b", "d"} <= set(cache._entries) and cache.evictions_needed == 0
    cache.put("e", _emb(3.0), protect={"b", "a"}, needed=lambda: {"b", "a", "d"})  # all needed: d goes
    assert "d" not in cache and cache.evictions == 2 and cache.evictions_needed == 1
    assert cache.bytes == 3 * one and cache.peak_bytes == 3 * one
    big = ImageEmbeddings(torch.zeros(8, 8), (torch.zeros(8, 8),), (4, 4))
    first = big.split()[0]
    stored = cache.put("f", first)
    assert stored.embeds.untyped_storage().nbytes() == 4 * 8 * 4  # its own storage, not the call's
    assert torch.equal(stored.embeds, first.embeds)
    assert cache.stats()["image_cache_hits"] == 1 and cache.stats()["image_cache_misses"] == 0


def test_an_image_larger_than_the_budget_is_refused():
    model = _model()
    engine = RZEngine(model, EngineConfig(max_running=2, max_len=64, max_batch_tokens=16, num_threads=1,
                                          image_cache_bytes=4 * TOKEN_BYTES - 1))  # fmt: skip
    pixels, grid = _image(1)
    prompt = [1, START] + [IMG] * 4 + [END, 2]
    with pytest.raises(ValueError, match="image 0 .* 4 tokens.*engine.image_cache_bytes"):
        asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=1), images=ImagePrompt(pixels, [grid])))
    with pytest.raises(ValueError, match="image_cache_bytes must be an int > 0"):
        EngineConfig(image_cache_bytes=0)
    assert image_key(pixels, torch.tensor(grid)) == image_key(pixels.clone(), torch.tensor(grid))
