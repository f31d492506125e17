"""Screenshot prompts in the prefix index (engine/pages.py, Sequence.index_tokens): a page is keyed by its
token ids plus the content of the images whose placeholders it holds, so a multi-turn episode's next turn
prefills only its new tokens and a group's members share the first prompt's pages, and every log-prob
equals a cold engine's (no reuse) and the learner's packed forward (torch.equal). Equal ids with other
pixels (or another grid) are not reused: the match stops at the first differing placeholder. A reuse that
ends inside an image's placeholders (a page boundary, a copied partial page) prefills the rest of that image
with rows of its full encoding, from the image cache or the tower again: the same bits. Negative controls:
keying pages by token ids alone reuses stale K/V (the log-probs then differ from the learner's), and the
standard op set differs from the learner.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from rz_agents.engine import EngineConfig, ImagePrompt, RZEngine, SamplingParams
from rz_agents.engine.images import SequenceImages
from rz_agents.engine.sequence import Sequence, SequenceStatus, placeholder_labels
from rz_agents.model.qwen3_vl import Qwen3VLModel
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig

IMG, START, END = 300, 302, 303
PATCH_DIM = 3 * 2 * 8 * 8


def _model(kernels: str = "aligned") -> Qwen3VLModel:
    model = Qwen3VLModel(Qwen3VLConfig.tiny(vocab_size=320), kernels=kernels)
    model.reset_parameters(std=0.1, seed=5)
    return model


def _engine(model, reuse: bool = True, **kw) -> RZEngine:
    config = {"max_running": 4, "max_len": 512, "max_batch_tokens": 64, "num_threads": 1, **kw}
    if not reuse:  # the same engine with no prefix reuse at all: every prompt prefilled cold
        config.update(prefix_cache=False, share_prefix_min_tokens=0)
    return RZEngine(model, EngineConfig(**config))


def _pixels(seed: int, grid) -> torch.Tensor:
    gen = torch.Generator().manual_seed(500 + seed)
    return torch.randn(grid[0] * grid[1] * grid[2], PATCH_DIM, generator=gen)


def _part(seed: int, grid, text: int = 3) -> tuple[list[int], torch.Tensor]:
    """Some text, then one image's placeholder run (with its start/end tokens), then some text."""
    gen = torch.Generator().manual_seed(seed)
    head = torch.randint(0, 290, (text,), generator=gen).tolist()
    tail = torch.randint(0, 290, (3,), generator=gen).tolist()
    t, h, w = grid
    return head + [START] + [IMG] * (t * h * w // 4) + [END] + tail, _pixels(seed, grid)


def _images(pixels: list[torch.Tensor], grids: list) -> ImagePrompt:
    return ImagePrompt(torch.cat(pixels), list(grids))


def _generate(engine, requests, params):
    """Run ``requests`` ((prompt, images) pairs) at once; returns their completions."""

    async def go():
        return await asyncio.gather(
            *(engine.generate(p, sp, images=im) for (p, im), sp in zip(requests, params, strict=True))
        )

    return asyncio.run(go())


def _episode(model, engine, turns: int = 3):
    """A multi-turn screenshot episode: each turn's prompt is the history (earlier prompts and completions)
    plus new text and a new screenshot. Returns [(prompt, images)], completions, prefill tokens per turn."""
    grids = [(1, 8, 8), (1, 6, 8), (1, 8, 4)]
    params = SamplingParams(temperature=1.0, max_tokens=5, seed=9, ignore_eos=True)
    history: list[int] = []
    pixels: list[torch.Tensor] = []
    requests, outs, prefills = [], [], []
    for turn in range(turns):
        tokens, px = _part(40 + turn, grids[turn], text=5 if turn == 0 else 2)
        history, pixels = history + tokens, pixels + [px]
        request = (list(history), _images(pixels, grids[: turn + 1]))
        before = engine.stats()["prefill_tokens"]
        (out,) = _generate(engine, [request], [params])
        prefills.append(engine.stats()["prefill_tokens"] - before)
        requests.append(request)
        outs.append(out)
        history = history + out.tokens
    return requests, outs, prefills


def test_a_later_turn_prefills_only_its_new_tokens_and_keeps_every_bit(vl_learner):
    model = _model()
    warm, cold = _engine(model), _engine(model, reuse=False)
    requests, outs, prefills = _episode(model, warm)
    _, cold_outs, cold_prefills = _episode(model, cold)
    assert cold_prefills == [len(p) for p, _ in requests]
    # turn t reuses the previous turn's prompt and completion (all but its last token, which has no K/V)
    for t in range(1, len(requests)):
        reused = len(requests[t - 1][0]) + len(outs[t - 1].tokens) - 1
        assert outs[t].num_cached_prompt_tokens == reused
        assert prefills[t] == len(requests[t][0]) - reused
    assert prefills[1] < cold_prefills[1] / 2 and prefills[2] < cold_prefills[2] / 3
    stats = warm.stats()
    assert stats["prefix_hits"] == 2 and stats["images_encoded"] == 3  # earlier screenshots not even read
    assert stats["images_prefix_reused"] == 1 + 2 and stats["images_reused"] == 0
    for a, b, c in zip(outs, cold_outs, vl_learner(model, requests, outs), strict=True):
        assert a.tokens == b.tokens and len(a.tokens) == 5
        assert torch.equal(a.logprobs, b.logprobs) and torch.equal(a.logprobs, c)


def test_a_group_shares_its_screenshot_prompt_pages(vl_learner):
    model = _model()
    tokens, px = _part(7, (1, 16, 16), text=5)  # 74 tokens, the image across the first page boundary
    request = (tokens, _images([px], [(1, 16, 16)]))
    params = [SamplingParams(temperature=1.0, max_tokens=4, seed=s, ignore_eos=True) for s in range(4)]
    warm = _engine(model, max_batch_tokens=32)  # the first member's prefill is chunked
    outs = _generate(warm, [request] * 4, params)
    stats = warm.stats()
    # once for the group (the others feed only the prompt's last token, a one-token chunk like a decode)
    assert stats["prefill_tokens"] == len(tokens)
    assert stats["shared_prefix_tokens"] == 3 * (len(tokens) - 1)
    assert [o.num_cached_prompt_tokens for o in outs] == [0] + [len(tokens) - 1] * 3
    assert stats["images_encoded"] == 1 and stats["images_prefix_reused"] == 3
    alone = [_generate(_engine(model, reuse=False), [request], [sp])[0] for sp in params]
    for a, b, c in zip(outs, alone, vl_learner(model, [request] * 4, outs), strict=True):
        assert a.tokens == b.tokens and torch.equal(a.logprobs, b.logprobs) and torch.equal(a.logprobs, c)


def _other_pixels_same_ids(model, engine):
    """A prompt, then the same token ids with other pixels (then with the same pixels under another grid of
    as many placeholders); returns the requests and completions."""
    tokens, px = _part(3, (1, 8, 8), text=5)
    params = SamplingParams(temperature=1.0, max_tokens=4, seed=1, ignore_eos=True)
    requests = [
        (tokens, _images([px], [(1, 8, 8)])),
        (tokens, _images([px + 0.5], [(1, 8, 8)])),
        (tokens, _images([px], [(1, 4, 16)])),
    ]
    outs = [_generate(engine, [r], [params])[0] for r in requests]
    return requests, outs


def test_equal_ids_with_other_pixels_or_grid_are_not_reused(vl_learner):
    model = _model()
    engine = _engine(model)
    requests, outs = _other_pixels_same_ids(model, engine)
    first_placeholder = requests[0][0].index(IMG)
    # only the text before the first placeholder is reused (the copied part of the first page)
    assert [o.num_cached_prompt_tokens for o in outs] == [0, first_placeholder, first_placeholder]
    assert engine.stats()["images_encoded"] == 3
    for a, b in zip(outs, vl_learner(model, requests, outs), strict=True):
        assert torch.equal(a.logprobs, b)
    assert not torch.equal(outs[0].logprobs, outs[1].logprobs)


def test_index_tokens_name_each_placeholder_by_its_image_content():
    model = _model()
    tokens, px = _part(5, (1, 4, 4), text=2)  # 2 text, start, 4 placeholders, end, 3 text
    seq = Sequence(tokens, SamplingParams())
    seq.images = SequenceImages(tokens, _images([px], [(1, 4, 4)]), model)
    items = seq.index_tokens()
    assert items[:3] == tokens[:3] and items[7:] == tokens[7:]
    assert len(set(items[3:7])) == 1 and all(isinstance(x, str) for x in items[3:7])
    seq.append(IMG, -1.0, 0)  # a sampled placeholder id is an ordinary token
    assert seq.index_tokens()[-1] == IMG and len(seq.index_tokens()) == seq.num_tokens
    # the label follows what the tower sees: pixels, their dtype and shape, and the grid
    others = [
        ([px + 1e-3], [(1, 4, 4)]),
        ([px.double()], [(1, 4, 4)]),
        ([px], [(1, 2, 8)]),
    ]
    for pixels, grids in others:
        other = SequenceImages(tokens, _images(pixels, grids), model)
        assert placeholder_labels(tokens, other)[3] != items[3]
    same = SequenceImages(tokens, _images([px.clone()], [(1, 4, 4)]), model)
    assert placeholder_labels(tokens, same)[3] == items[3]


def test_negative_control_pages_keyed_by_token_ids_alone_reuse_stale_kv(monkeypatch, vl_learner):
    # Today's text keys applied to images (no image content in the key): the second request reuses the
    # first one's K/V for other pixels, and the comparison with the learner catches it.
    monkeypatch.setattr(Sequence, "index_tokens", lambda self: self.tokens)
    model = _model()
    engine = _engine(model)
    requests, outs = _other_pixels_same_ids(model, engine)
    assert outs[1].num_cached_prompt_tokens == len(requests[0][0]) - 1
    learner = vl_learner(model, requests, outs)
    assert torch.equal(outs[0].logprobs, learner[0])
    assert not torch.equal(outs[1].logprobs, learner[1])


@pytest.mark.parametrize("cut", [40, 64, 80])
@pytest.mark.parametrize("drop_encodings", [False, True])
def test_a_reuse_ending_inside_an_image_prefills_the_rest_of_it_with_the_same_bits(
    cut, drop_encodings, vl_learner
):
    # A request cancelled after its first prefill chunk keeps its computed pages: a later request with the
    # same prompt reuses them up to ``cut``, inside the image's 128 placeholders (positions 6..133): a copied
    # partial page (40), a full page (64), a full page and a copied partial one (80).
    model = _model()
    engine = _engine(model, max_batch_tokens=cut)
    tokens, px = _part(11, (1, 16, 32), text=5)
    images = _images([px], [(1, 16, 32)])
    params = SamplingParams(temperature=1.0, max_tokens=4, seed=2, ignore_eos=True)
    first = Sequence(tokens, params)
    first.images = SequenceImages(tokens, images, model)
    engine.scheduler.add(first)
    engine.step()
    assert first.num_cached == cut and engine.runner.images_encoded == 1
    first.cancelled = True
    engine.step()  # the cancelled sequence's computed pages stay in the prefix index
    if drop_encodings:
        engine.runner.image_cache.clear()  # the tower encodes the image again for its uncovered rows
    before = engine.stats()["prefill_tokens"]
    (out,) = _generate(engine, [(tokens, images)], [params])
    assert out.num_cached_prompt_tokens == cut
    assert engine.stats()["prefill_tokens"] - before == len(tokens) - cut
    assert engine.runner.images_encoded == 1 + drop_encodings
    assert engine.stats()["images_prefix_reused"] == 0  # the image is only partly in the reused prefix
    (cold,) = _generate(_engine(model, reuse=False), [(tokens, images)], [params])
    (ref,) = vl_learner(model, [(tokens, images)], [out])
    assert out.tokens == cold.tokens and torch.equal(out.logprobs, cold.logprobs)
    assert torch.equal(out.logprobs, ref)


def _episodes(engine, n: int = 3, turns: int = 2):
    """``n`` screenshot episodes at once, ``turns`` turns each (the history grows by a screenshot a turn)."""
    params = [SamplingParams(temperature=1.0, max_tokens=16, seed=s, ignore_eos=True) for s in range(n)]
    history: list[list[int]] = [[] for _ in range(n)]
    pixels: list[list[torch.Tensor]] = [[] for _ in range(n)]
    grids: list[list] = [[] for _ in range(n)]
    requests, outs = [], []
    for turn in range(turns):
        wave = []
        for e in range(n):
            grid = (1, 12, 16) if turn == 0 else (1, 12, 12)  # each turn crosses a page boundary
            tokens, px = _part(100 * e + turn, grid, text=5)
            history[e] += tokens
            pixels[e].append(px)
            grids[e].append(grid)
            wave.append((list(history[e]), _images(pixels[e], grids[e])))
        got = _generate(engine, wave, params)
        for e, out in enumerate(got):
            history[e] += out.tokens
        requests += wave
        outs += got
    return requests, outs


def test_reuse_with_chunked_prefill_and_preemption_keeps_every_bit(vl_learner):
    model = _model()
    roomy = _engine(model, reuse=False)
    page = roomy.scheduler.pages.bytes_per_page
    tight = _engine(model, max_len=192, max_batch_tokens=24, kv_cache_bytes=8 * page)
    requests, outs = _episodes(tight)
    _, ref = _episodes(roomy)
    stats = tight.stats()
    assert stats["preemptions"] > 0 and stats["prefix_tokens_reused"] > 0
    assert any(o.num_cached_prompt_tokens > 0 for o in outs[3:])  # a second turn reused its history
    for a, b, c in zip(outs, ref, vl_learner(model, requests, outs), strict=True):
        assert a.tokens == b.tokens and torch.equal(a.logprobs, b.logprobs) and torch.equal(a.logprobs, c)


def test_a_sequence_that_reused_a_screenshot_prefix_and_is_preempted_recomputes_the_same_bits(vl_learner):
    model = _model()
    engine = _engine(model, max_batch_tokens=16)
    ((first, images),), (out,), _ = _episode(model, engine, turns=1)
    tokens, px = _part(77, (1, 8, 8), text=2)
    prompt = first + out.tokens + tokens
    request = (prompt, _images([images.pixel_values, px], [*images.image_grid_thw, (1, 8, 8)]))
    params = SamplingParams(temperature=1.0, max_tokens=5, seed=4, ignore_eos=True)
    seq = Sequence(prompt, params)
    seq.images = SequenceImages(prompt, request[1], model)
    engine.scheduler.add(seq)
    engine.step()
    reused = len(first) + len(out.tokens) - 1
    assert seq.num_cached_prompt_tokens == reused and seq.num_cached == reused + 16
    engine.scheduler.preempt(seq)  # its pages go (the reused ones too): it recomputes the whole history
    while seq.status is not SequenceStatus.FINISHED:
        engine.step()
    assert seq.num_preemptions == 1 and seq.finish_reason == "length"
    got = seq.to_completion()
    (cold,) = _generate(_engine(model, reuse=False), [request], [params])
    (ref,) = vl_learner(model, [request], [got])
    assert got.tokens == cold.tokens and torch.equal(got.logprobs, cold.logprobs)
    assert torch.equal(got.logprobs, ref)


def test_negative_control_standard_kernels_differ_from_the_learner(vl_learner):
    model = _model(kernels="standard")
    requests, outs, _ = _episode(model, _engine(model), turns=2)
    learner = vl_learner(model, requests, outs)
    assert not all(torch.equal(o.logprobs, r) for o, r in zip(outs, learner, strict=True))
    assert max((o.logprobs - r).abs().max().item() for o, r in zip(outs, learner, strict=True)) < 1e-3
