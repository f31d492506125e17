"""DeepSeek-V4's pages behind the sliding window given back while the sequence runs (engine/window_release.py,
model/deepseek_v4_cache.py's archive pages): a sequence crossing several windows gives back its early pages,
another sequence writes into them while it still runs, and every sampled log-prob stays `torch.equal` to the
learner's packed forward. The negative control gives back one page too early (a wrong window): the pages it
still reads are lost and its log-probs move."""

from __future__ import annotations

import asyncio
import dataclasses

import torch

from rz_agents.engine import EngineConfig, RZEngine, generate_batch
from tests.engine.engine_alignment import (
    assert_equal_to_learner,
    assert_update_recomputes_exactly,
    learner_logprobs,
    seeded_params,
)
from tests.engine.test_engine_deepseek_v4_alignment import _model, _prompts


class TableRecorder:
    """Each engine step's page tables: [(sequence id, pages, columns given back)] per step."""

    def __init__(self, engine: RZEngine) -> None:
        self.steps: list[list[tuple[int, list[int], int]]] = []
        original = engine.runner.forward

        def forward(batch):
            self.steps.append([(c.seq.seq_id, list(c.seq.pages), c.seq.pages_released) for c in batch.chunks])
            return original(batch)

        engine.runner.forward = forward

    def reused_while_running(self) -> int:
        """Pages that one sequence gave back and another then held while the first still ran."""
        reused = set()
        last_step = {}
        for s, rows in enumerate(self.steps):
            for sid, _, _ in rows:
                last_step[sid] = s
        for s1, rows in enumerate(self.steps):
            for a, pages, released in rows:
                for page in pages[released:]:  # a live page of a
                    for s2 in range(s1 + 1, last_step[a] + 1):
                        held = {p for b, ps, r in self.steps[s2] if b != a for p in ps[r:]}
                        mine = {p for b, ps, _ in self.steps[s2] if b == a for p in ps}
                        if page in held and page not in mine:
                            reused.add(page)
                            break
        return len(reused)


def _long(n: int, max_tokens: list[int]):
    """Seeded sampling params that run to max_tokens (no EOS stop)."""
    params = seeded_params(n, 1)
    return [
        dataclasses.replace(p, ignore_eos=True, max_tokens=m) for p, m in zip(params, max_tokens, strict=True)
    ]


def test_a_long_sequence_gives_back_pages_another_reuses_and_stays_equal_to_the_learner():
    model = _model("float32")  # sliding window 16, CSA m=4, HCA m'=16
    page = model.kv_page_bytes()
    # 5 pages (+ the scratch page). A (120 + 40 = 160 positions, ~9 windows) holds 3 pages at 128 and gives
    # back its first (an archive page taken for its entries); B (40 + 30) grows at 64 with no free page left:
    # it takes A's given-back page while A still runs.
    config = EngineConfig(max_len=256, max_batch_tokens=64, kv_cache_bytes=6 * page, num_threads=1)
    engine = RZEngine(model, config)
    recorder = TableRecorder(engine)
    prompts = _prompts([120, 40], seed=5)
    outs = generate_batch(engine, prompts, _long(2, [40, 30]))
    assert_equal_to_learner(model, prompts, outs)
    stats = engine.stats()
    assert stats["kv_pages_released_behind_window"] >= 1 and stats["kv_archive_pages"] >= 1, stats
    assert stats["preemptions"] == 0, stats
    assert recorder.reused_while_running() > 0


def test_giving_back_a_page_the_window_still_reads_corrupts_the_logprobs():
    """The negative control: the cache's reach moved one page forward (pages given back one page too early)
    makes the engine's log-probs differ from the learner's; the true reach keeps them equal."""
    model = _model("float32", sliding_window=96)
    prompts = _prompts([190], seed=6)
    params = _long(1, [14])  # positions up to 203: the true reach gives back page 0, the wrong one page 1 too
    config = EngineConfig(max_len=256, max_batch_tokens=64, num_threads=1)
    right = RZEngine(model, config)
    assert_equal_to_learner(model, prompts, generate_batch(right, prompts, params))
    assert right.stats()["kv_pages_released_behind_window"] == 1
    wrong = RZEngine(model, config)
    cache = wrong.kv_cache
    reach = cache.pages_behind
    cache.pages_behind = lambda position: reach(position) + 1
    outs = generate_batch(wrong, prompts, params)
    (lp,) = learner_logprobs(model, prompts, outs)
    assert wrong.stats()["kv_pages_released_behind_window"] == 2
    assert (outs[0].logprobs - lp).abs().max() > 1e-3


def test_a_later_prompt_reuses_given_back_pages_exactly():
    """A finished sequence's pages, one of them given back while it ran (kept in the prefix cache, its
    content intact), serve the next turn's prompt: the match runs through them and the log-probs equal the
    learner's."""
    model = _model("float32")
    engine = RZEngine(model, EngineConfig(max_len=256, max_batch_tokens=64, num_threads=1))
    (first,) = _prompts([150], seed=7)
    (out,) = generate_batch(engine, [first], _long(1, [20]))
    assert engine.stats()["kv_pages_released_behind_window"] >= 1
    prompts = [first + out.tokens + _prompts([10], seed=8)[0]]
    again = generate_batch(engine, prompts, _long(1, [8]))
    assert again[0].num_cached_prompt_tokens >= 128  # through the given-back page 0 and page 1
    assert_equal_to_learner(model, prompts, again)


def test_a_weight_update_recomputes_a_sequence_that_gave_pages_back():
    model, new = _model("float32"), _model("float32", seed=1)
    engine = RZEngine(model, EngineConfig(max_len=256, max_batch_tokens=64, num_threads=1))
    # the 150-token prompt gives page 0 back right after its prefill, before the update at 5 tokens
    assert_update_recomputes_exactly(engine, new, _prompts([150, 30], seed=9), _long(2, [15, 15]), 5)
    assert engine.stats()["kv_pages_released_behind_window"] >= 2  # once per version


def test_a_kept_cache_across_a_weight_update_gives_the_same_bits_with_pages_given_back():
    """kv_on_update "keep": the sequences go on over their old-weight pages (no learner to equal); giving
    pages back (before and after the update) changes no bit of what they sample."""
    new = _model("float32", seed=1)
    outs, released = [], []
    for free in (True, False):
        config = EngineConfig(
            max_len=256, max_batch_tokens=64, num_threads=1, kv_on_update="keep", free_behind_window=free
        )
        engine = RZEngine(_model("float32"), config)
        prompts, params = _prompts([140, 20], seed=9), _long(2, [8, 8])

        async def run(engine=engine, prompts=prompts, params=params):
            tasks = [
                asyncio.ensure_future(engine.generate(p, q)) for p, q in zip(prompts, params, strict=True)
            ]
            while engine.counters["generated_tokens"] < 5:
                await asyncio.sleep(0)
            engine.load_weights(new.state_dict(), version=1)
            return await asyncio.gather(*tasks)

        outs.append(asyncio.run(run()))
        released.append(engine.stats()["kv_pages_released_behind_window"])
    assert released[0] >= 2 and released[1] == 0
    assert all(1 in o.versions for o in outs[0])
    assert all(torch.equal(a.logprobs, b.logprobs) for a, b in zip(*outs, strict=True))


def test_every_page_behind_the_window_goes_back_none_held_for_the_prefix_chain():
    """At 170 positions (window 16) the first two pages lie behind every later call's reach: both go back,
    the second although it is the last page the prefix index is done with (the index continues its chain from
    the node the sequence keeps, not from the page). The log-probs equal the learner's, and the next turn's
    prompt reuses the chain through both given-back pages and the finished sequence's partial third page."""
    model = _model("float32")
    engine = RZEngine(model, EngineConfig(max_len=256, max_batch_tokens=64, num_threads=1))
    (first,) = _prompts([150], seed=10)
    (out,) = generate_batch(engine, [first], _long(1, [20]))
    assert engine.stats()["kv_pages_released_behind_window"] == 2  # (was 1: the last indexed page was held)
    assert_equal_to_learner(model, [first], [out])
    prompts = [first + out.tokens + _prompts([10], seed=11)[0]]
    again = generate_batch(engine, prompts, _long(1, [8]))
    assert again[0].num_cached_prompt_tokens >= 160
    assert_equal_to_learner(model, prompts, again)


def test_entries_are_read_from_the_archive_page_or_their_own_page_in_one_gather():
    """``DeepseekV4Cache.read_entries`` picks each entry's place on the device (an archive page's part
    column % span, else the page's own slot) and reads it once: equal to reading both and choosing; a page
    whose flag is flipped reads the other place."""
    model = _model("bfloat16")
    cache = model.new_kv_cache(5, "cpu")
    gen = torch.Generator().manual_seed(0)
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=gen).to(cache.storage.dtype))
    cache.archived.copy_(torch.tensor([False, True, False, True, False]))
    for key, spec in cache.specs.items():
        page = torch.randint(0, 5, (3, 7), generator=gen)
        column = torch.randint(0, 3 * cache.archive_span, (3, 7), generator=gen)
        slot = torch.randint(0, spec.slots, (3, 7), generator=gen)
        live = cache.entries[key][page, slot]
        kept = cache.archive[key][page, column % cache.archive_span, slot]
        both = torch.where(cache.archived[page].unsqueeze(-1), kept, live)
        assert torch.equal(cache.read_entries(key, page, column, slot), both)
    cache.archived.logical_not_()
    assert torch.equal(cache.read_entries(key, page, column, slot), torch.where(
        cache.archived[page].unsqueeze(-1), kept, live))  # fmt: skip
    assert not torch.equal(cache.read_entries(key, page, column, slot), both)
