"""Request lifecycle: stops, limits, queueing, cancellation, bad input, failures, weight-update checks."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rz_agents.engine import Engine, EngineConfig, RZEngine, SamplingParams, generate_batch
from rz_agents.model.kv_cache import bytes_per_page
from rz_agents.model.logprobs import packed_token_logprobs


def _engine(model, **overrides) -> RZEngine:
    cfg = dict(max_running=4, max_len=128, max_batch_tokens=32, num_threads=1)
    cfg.update(overrides)
    return RZEngine(model, EngineConfig(**cfg))


PROMPT = [5, 17, 42, 8, 99, 3]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


def _letters(ids: list[int]) -> str:
    """A toy detokenizer: one letter per token."""
    return "".join(chr(ord("a") + t % 26) for t in ids)


def test_engine_satisfies_the_engine_protocol(tiny_model):
    assert isinstance(_engine(tiny_model()), Engine)


def test_engine_stops_at_eos_and_keeps_the_eos_token(tiny_model):
    model = tiny_model()
    free = generate_batch(_engine(model), [PROMPT], GREEDY)[0].tokens
    eos = free[5]
    cut = free.index(eos)
    out = generate_batch(_engine(model, eos_token_ids=(eos,)), [PROMPT], GREEDY)[0]
    assert out.tokens == free[: cut + 1]
    assert out.finish_reason == "stop" and out.stop_reason == eos
    ignoring = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    assert generate_batch(_engine(model, eos_token_ids=(eos,)), [PROMPT], ignoring)[0].tokens == free


def test_engine_stops_at_stop_tokens_and_stop_strings(tiny_model):
    model = tiny_model()
    free = generate_batch(_engine(model), [PROMPT], GREEDY)[0].tokens
    stop_tok = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=(free[7],))
    out = generate_batch(_engine(model), [PROMPT], stop_tok)[0]
    assert out.tokens == free[: free.index(free[7]) + 1] and out.stop_reason == free[7]

    text = _letters(free)
    stop = text[9:12]
    end = text.index(stop) + len(stop)  # one letter per token: the stop completes at token end-1
    out = generate_batch(
        RZEngine(model, EngineConfig(max_running=2, max_len=128, num_threads=1), decode=_letters),
        [PROMPT],
        SamplingParams(temperature=0.0, max_tokens=24, stop=(stop, "never-seen")),
    )[0]
    assert out.tokens == free[:end] and out.finish_reason == "stop" and out.stop_reason == stop


def test_engine_finishes_with_length_at_max_tokens_or_max_len(tiny_model):
    model = tiny_model()
    out = generate_batch(_engine(model), [PROMPT], SamplingParams(max_tokens=3))[0]
    assert len(out.tokens) == 3 and out.finish_reason == "length"
    out = generate_batch(_engine(model, max_len=10), [PROMPT], SamplingParams(max_tokens=50))[0]
    assert len(PROMPT) + len(out.tokens) == 10 and out.finish_reason == "length"


def test_engine_queues_requests_when_the_cache_is_full_and_serves_them_all(tiny_model):
    model = tiny_model()
    engine = _engine(model, max_running=2, prefix_cache=False)
    prompts = [[i + 1] * (i + 2) for i in range(7)]
    outs = generate_batch(engine, prompts, SamplingParams(max_tokens=5, seed=0))
    assert [len(o.tokens) for o in outs] == [5] * 7
    stats = engine.stats()
    assert stats["kv_bytes_held"] == 0 and stats["waiting"] == 0 and stats["running"] == 0
    for p, o in zip(prompts, outs, strict=True):
        (ref,) = packed_token_logprobs(model, [p + o.tokens])
        assert torch.equal(o.logprobs, ref[len(p) - 1 :])


def test_engine_sizes_the_paged_cache_from_a_memory_budget(tiny_model):
    model = tiny_model()
    page = bytes_per_page(model.config)
    # default: 3 x max_len 128 for the sequences, plus the scratch page of padding rows
    assert _engine(model, max_running=3).stats()["kv_pages"] == 3 * 2
    engine = _engine(model, kv_cache_bytes=10 * page + page // 2)
    assert engine.kv_cache.num_pages == 10 and engine.stats()["kv_pages"] == 9
    assert engine.stats()["kv_bytes_total"] == 9 * page
    with pytest.raises(ValueError, match="needs 2"):  # one max_len sequence must always fit
        _engine(model, kv_cache_bytes=2 * page)


def test_cancelling_a_request_frees_its_pages_and_others_finish(tiny_model):
    model = tiny_model()
    engine = _engine(model, max_running=2)

    async def main():
        long = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_tokens=100, ignore_eos=True)))
        short = asyncio.create_task(engine.generate([1, 2, 3], SamplingParams(max_tokens=20)))
        while not engine.scheduler.running or len(engine.scheduler.running[0].output) < 3:
            await asyncio.sleep(0)
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        done = await short
        # A third request can use the freed pages, and nothing is left held.
        third = await engine.generate([4, 5], SamplingParams(max_tokens=4))
        return done, third

    done, third = asyncio.run(main())
    assert len(done.tokens) == 20 and len(third.tokens) == 4
    assert engine.stats()["kv_bytes_held"] == 0 and engine.stats()["running"] == 0


@pytest.mark.parametrize(
    "prompt,params,message",
    [
        ([], SamplingParams(), "at least one token"),
        ([1, 2, 10_000], SamplingParams(), "outside the vocabulary"),
        ([1] * 128, SamplingParams(), "max_len"),
        ([1, 2], SamplingParams(stop=("x",)), "decode"),
        (["a"], SamplingParams(), "token ids"),
        ([1, 2], {"temperature": 1.0}, "SamplingParams"),
    ],
)
def test_bad_requests_raise_a_clear_error_and_the_engine_keeps_working(tiny_model, prompt, params, message):
    engine = _engine(tiny_model())

    async def main():
        with pytest.raises(ValueError, match=message):
            await engine.generate(prompt, params)
        return await engine.generate([1, 2, 3], SamplingParams(max_tokens=2))

    assert len(asyncio.run(main()).tokens) == 2


def test_sampling_params_reject_invalid_values():
    for kwargs in [dict(temperature=-1), dict(top_p=0), dict(top_k=-2), dict(max_tokens=0), dict(stop=("",))]:
        with pytest.raises(ValueError):
            SamplingParams(**kwargs)


def test_load_weights_rejects_bad_state_and_changes_nothing(tiny_model, perturbed_state):
    model = tiny_model()
    engine = _engine(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    good = perturbed_state(model, seed=3)
    bad_shape = {**good, "model.norm.weight": torch.ones(3)}
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights(bad_shape, version=1)
    with pytest.raises(ValueError, match="unknown parameter"):
        engine.load_weights({**good, "model.layers.99.mlp.weight": torch.ones(1)}, version=1)
    assert engine.version == 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    engine.load_weights(good, version=4)
    assert engine.version == 4 and torch.equal(model.model.norm.weight, good["model.norm.weight"])
    out = generate_batch(engine, [PROMPT], SamplingParams(max_tokens=3))[0]
    assert out.versions == [4, 4, 4]


def test_a_failing_forward_fails_only_that_step_and_the_engine_recovers(tiny_model, monkeypatch):
    model = tiny_model()
    engine = _engine(model)
    real_forward = engine.runner.forward
    calls = {"n": 0}

    def forward_failing_once(batch):  # fault injection: the third model step raises, and so does the
        calls["n"] += 1  # retry of each of its two chunks alone (calls 4 and 5)
        if 3 <= calls["n"] <= 5:
            raise RuntimeError("simulated out of memory")
        return real_forward(batch)

    monkeypatch.setattr(engine.runner, "forward", forward_failing_once)
    failed = generate_batch(engine, [PROMPT, [1, 2]], SamplingParams(max_tokens=6))
    assert [o.finish_reason for o in failed] == ["error", "error"]
    assert "simulated out of memory" in failed[0].error and len(failed[0].tokens) == 2
    ok = generate_batch(engine, [PROMPT], SamplingParams(max_tokens=6))[0]
    assert ok.finish_reason == "length" and engine.stats()["kv_bytes_held"] == 0


def test_step_in_thread_gives_the_same_results_as_inline_steps(tiny_model):
    model = tiny_model()
    prompts = [[3, 4, 5], list(range(1, 50)), [9] * 20]
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=5)
    inline = generate_batch(_engine(model), prompts, params)
    threaded = generate_batch(_engine(model, step_in_thread=True), prompts, params)
    for a, b in zip(inline, threaded, strict=True):
        assert a.tokens == b.tokens and torch.equal(a.logprobs, b.logprobs)


def test_seeds_make_requests_reproducible(tiny_model):
    model = tiny_model()
    engine = _engine(model)
    p = SamplingParams(temperature=1.0, max_tokens=16, seed=123)
    a, b = generate_batch(engine, [PROMPT, PROMPT], p)
    c = generate_batch(engine, [PROMPT], SamplingParams(temperature=1.0, max_tokens=16, seed=124))[0]
    assert a.tokens == b.tokens and a.tokens != c.tokens


def test_generate_batch_refuses_to_run_inside_an_event_loop(tiny_model):
    engine = _engine(tiny_model())

    async def main():
        with pytest.raises(RuntimeError, match="synchronous"):
            generate_batch(engine, [PROMPT])

    asyncio.run(main())


def test_concurrent_multi_turn_episodes_reuse_prefixes_and_stay_aligned(tiny_model):
    model = tiny_model()
    engine = _engine(model, max_running=6, max_len=256)
    params = SamplingParams(temperature=1.0, max_tokens=8)

    async def episode(i: int):
        tokens = [10 + i, 20 + i, 30 + i]
        turns = []
        for turn in range(3):
            out = await engine.generate(tokens, params)
            turns.append((list(tokens), out))
            tokens = tokens + out.tokens + [40 + turn, 41 + i]  # an observation, as the env returns
            await asyncio.sleep(0)
        return turns

    async def main():
        return await asyncio.gather(*(episode(i) for i in range(5)))

    episodes = asyncio.run(main())
    reused = [out.num_cached_prompt_tokens for turns in episodes for _, out in turns[1:]]
    assert all(n > 0 for n in reused)
    for turns in episodes:
        for prompt, out in turns:
            (ref,) = packed_token_logprobs(model, [prompt + out.tokens])
            assert torch.equal(out.logprobs, ref[len(prompt) - 1 :])


def test_requests_arriving_while_a_threaded_step_runs_are_all_served(tiny_model):
    model = tiny_model()
    engine = _engine(model, max_running=3, step_in_thread=True)

    async def main():
        tasks = []
        for i in range(12):  # arrivals interleave with steps running in the worker thread
            # request 5 asks for 100 tokens, the others for 4: the other 11 are done (in ~30 steps on
            # the 3 slots) long before it can be, so cancelling it then never races its completion
            params = SamplingParams(max_tokens=100 if i == 5 else 4)
            tasks.append(asyncio.create_task(engine.generate([i + 1, i + 2, i + 3], params)))
            await asyncio.sleep(0.001)
        others = await asyncio.gather(*(t for i, t in enumerate(tasks) if i != 5))
        assert not tasks[5].done()
        tasks[5].cancel()
        return others, (await asyncio.gather(tasks[5], return_exceptions=True))[0]

    others, cancelled = asyncio.run(main())
    assert isinstance(cancelled, asyncio.CancelledError)
    assert [len(o.tokens) for o in others] == [4] * 11
    assert engine.stats()["kv_bytes_held"] == 0 and engine.stats()["running"] == 0
