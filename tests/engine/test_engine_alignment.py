"""Engine log-probs equal the trainer's packed forward bit for bit (torch.equal, no tolerance)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams, generate_batch
from rz_agents.model import KVCache
from rz_agents.model.kv_cache import bytes_per_page
from rz_agents.model.logprobs import packed_token_logprobs, sampling_logprobs


def _prompts(n: int, vocab: int, seed: int, lengths=(3, 17, 40, 66, 9, 130, 1, 25)) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (lengths[i % len(lengths)],), generator=gen).tolist() for i in range(n)]


def _trainer_logprobs(model, prompt, completion, params: SamplingParams) -> torch.Tensor:
    """The learner's log-probs of the generated tokens (packed training forward, one sequence)."""
    full = prompt + completion.tokens
    (lp,) = packed_token_logprobs(
        model, [full], temperature=params.temperature, top_k=params.top_k, top_p=params.top_p
    )
    return lp[len(prompt) - 1 :]


MIXED_PARAMS = [
    SamplingParams(temperature=1.0, max_tokens=12, seed=1),
    SamplingParams(temperature=0.7, top_k=20, max_tokens=9, seed=2),
    SamplingParams(temperature=1.3, top_p=0.8, max_tokens=15, seed=3),
    SamplingParams(temperature=0.0, max_tokens=7),  # greedy
    SamplingParams(temperature=0.9, top_k=50, top_p=0.9, max_tokens=11),
]


@pytest.mark.parametrize(
    "model_type,dtype",
    [
        ("qwen3", "float32"),
        ("llama", "float32"),
        ("qwen3_moe", "float32"),
        ("qwen3", "bfloat16"),
        ("qwen2", "float32"),
        ("deepseek_v3", "float32"),
        ("deepseek_v3", "bfloat16"),
    ],
)
def test_engine_logprobs_equal_trainer_forward_in_mixed_chunked_batches(tiny_model, model_type, dtype):
    model = tiny_model(model_type, dtype=dtype)
    # 3 slots for 8 requests: requests queue and join between decode steps; a 24-token budget
    # chunks every prompt longer than that and mixes prefill chunks with decodes.
    engine = RZEngine(model, EngineConfig(max_running=3, max_len=256, max_batch_tokens=24, num_threads=1))
    prompts = _prompts(8, model.config.vocab_size, seed=5)
    params = [MIXED_PARAMS[i % len(MIXED_PARAMS)] for i in range(len(prompts))]
    outs = generate_batch(engine, prompts, params)
    for prompt, p, out in zip(prompts, params, outs, strict=True):
        assert out.finish_reason == "length" and len(out.tokens) == p.max_tokens
        assert out.logprobs.dtype == torch.float32
        assert torch.equal(out.logprobs, _trainer_logprobs(model, prompt, out, p))


def test_engine_results_do_not_depend_on_batch_composition_or_chunk_size(tiny_model):
    model = tiny_model()
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=20, seed=11)
    target = _prompts(1, model.config.vocab_size, seed=1, lengths=(70,))[0]
    alone = generate_batch(
        RZEngine(model, EngineConfig(max_running=1, max_len=256, max_batch_tokens=512, num_threads=1)),
        [target],
        params,
    )[0]
    others = _prompts(6, model.config.vocab_size, seed=2)
    crowded = generate_batch(
        RZEngine(model, EngineConfig(max_running=4, max_len=256, max_batch_tokens=13, num_threads=1)),
        others[:3] + [target] + others[3:],
        [SamplingParams(max_tokens=8)] * 3 + [params] + [SamplingParams(max_tokens=30)] * 3,
    )[3]
    assert crowded.tokens == alone.tokens  # same seed, same distribution -> same tokens
    assert torch.equal(crowded.logprobs, alone.logprobs)


def test_engine_prefix_reuse_is_bit_identical_to_cold_prefill(tiny_model):
    model = tiny_model()
    cfg = EngineConfig(max_running=2, max_len=256, max_batch_tokens=32, num_threads=1)
    warm = RZEngine(model, cfg)
    cold = RZEngine(model, EngineConfig(**{**cfg.__dict__, "prefix_cache": False}))
    p = SamplingParams(temperature=1.0, max_tokens=10, seed=4)
    turn1 = _prompts(1, model.config.vocab_size, seed=3, lengths=(50,))[0]
    first = generate_batch(warm, [turn1], p)[0]
    # Next turn: previous prompt + completion + an observation, as a multi-turn episode does.
    turn2 = turn1 + first.tokens + [7, 8, 9, 10, 11]
    second_warm = generate_batch(warm, [turn2], p)[0]
    second_cold = generate_batch(cold, [turn2], p)[0]
    # Everything fed through the model in turn 1 (all but its last sampled token) is reused.
    assert second_warm.num_cached_prompt_tokens == len(turn1) + len(first.tokens) - 1
    assert second_cold.num_cached_prompt_tokens == 0
    assert second_warm.tokens == second_cold.tokens
    assert torch.equal(second_warm.logprobs, second_cold.logprobs)
    assert torch.equal(second_warm.logprobs, _trainer_logprobs(model, turn2, second_warm, p))
    # A prompt that diverges inside the cached prefix reuses only the common part.
    turn2b = turn1[:30] + [1, 2, 3]
    third = generate_batch(warm, [turn2b], p)[0]
    assert third.num_cached_prompt_tokens == 30
    assert torch.equal(third.logprobs, _trainer_logprobs(model, turn2b, third, p))


async def _wait_until_all_decoding(engine: RZEngine, min_tokens: int) -> None:
    """Yield to the step loop until every running sequence has generated min_tokens tokens."""
    for _ in range(10_000):
        running = engine.scheduler.running
        if running and not engine.scheduler.waiting and all(len(s.output) >= min_tokens for s in running):
            return
        await asyncio.sleep(0)
    raise AssertionError("engine made no progress")


def _run_with_update(engine, prompts, params, state, version, min_tokens):
    async def main():
        tasks = [asyncio.create_task(engine.generate(p, params)) for p in prompts]
        await _wait_until_all_decoding(engine, min_tokens)
        engine.load_weights(state, version)
        return await asyncio.gather(*tasks)

    return asyncio.run(main())


def test_engine_update_with_recompute_matches_trainer_with_new_weights(tiny_model, perturbed_state):
    model = tiny_model()
    old = tiny_model()  # a frozen copy of the initial weights
    engine = RZEngine(
        model,
        EngineConfig(
            max_running=4, max_len=256, max_batch_tokens=32, kv_on_update="recompute", num_threads=1
        ),
    )
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=9)
    prompts = _prompts(4, model.config.vocab_size, seed=8, lengths=(5, 33, 60, 12))
    state = perturbed_state(model, seed=1)
    outs = _run_with_update(engine, prompts, params, state, version=1, min_tokens=4)
    new = tiny_model()
    new.load_state_dict(state, strict=False)
    assert engine.version == 1
    for prompt, out in zip(prompts, outs, strict=True):
        split = out.versions.index(1)
        assert split >= 4 and set(out.versions[:split]) == {0} and set(out.versions[split:]) == {1}
        before = _trainer_logprobs(old, prompt, out, params)[:split]
        after = _trainer_logprobs(new, prompt, out, params)[split:]
        assert torch.equal(out.logprobs[:split], before)
        assert torch.equal(out.logprobs[split:], after)


def _keep_reference(old, new, prompt, out, params, split):
    """Log-probs when positions fed before the swap hold old-weight K/V and the rest new-weight K/V."""
    full = torch.tensor(prompt + out.tokens)
    fed_before = len(prompt) + split - 1  # tokens whose K/V the old weights wrote
    cache = KVCache(old.config, num_pages=6).view(torch.tensor([[5, 2, 0, 3]]))  # pages out of order
    with torch.no_grad():
        old(full[:fed_before], torch.arange(fed_before), torch.zeros(fed_before, dtype=torch.long), cache)
        rest = full[fed_before:-1]
        hidden = new(
            rest,
            torch.arange(fed_before, full.numel() - 1),
            torch.zeros(rest.numel(), dtype=torch.long),
            cache,
        )
        logp = sampling_logprobs(new.logits(hidden), params.temperature, params.top_k, params.top_p)
    return logp.gather(1, full[fed_before + 1 :, None])[:, 0]


def test_engine_update_with_keep_attends_to_old_kv_exactly(tiny_model, perturbed_state):
    model = tiny_model()
    old = tiny_model()
    engine = RZEngine(
        model,
        EngineConfig(max_running=4, max_len=256, max_batch_tokens=32, kv_on_update="keep", num_threads=1),
    )
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=9)
    prompts = _prompts(4, model.config.vocab_size, seed=8, lengths=(5, 33, 60, 12))
    state = perturbed_state(model, seed=1, scale=0.05)
    outs = _run_with_update(engine, prompts, params, state, version=1, min_tokens=4)
    new = tiny_model()
    new.load_state_dict(state, strict=False)
    differs_from_recompute = False
    for prompt, out in zip(prompts, outs, strict=True):
        split = out.versions.index(1)
        assert torch.equal(out.logprobs[:split], _trainer_logprobs(old, prompt, out, params)[:split])
        assert torch.equal(out.logprobs[split:], _keep_reference(old, new, prompt, out, params, split))
        recomputed = _trainer_logprobs(new, prompt, out, params)[split:]
        differs_from_recompute |= not torch.equal(out.logprobs[split:], recomputed)
    # Keeping old K/V is a real approximation: it differs from a full recompute with new weights.
    assert differs_from_recompute
    # Mixed-version K/V never becomes a cached page (reuse must equal a cold prefill).
    assert engine.stats()["prefix_cached_pages"] == 0


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2", "deepseek_v3"])
def test_engine_standard_kernels_negative_control_differs_from_trainer(tiny_model, model_type):
    model = tiny_model(model_type, kernels="standard")
    engine = RZEngine(model, EngineConfig(max_running=4, max_len=256, max_batch_tokens=24, num_threads=1))
    prompts = _prompts(6, model.config.vocab_size, seed=5)
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=3)
    outs = generate_batch(engine, prompts, params)
    equal = [
        torch.equal(o.logprobs, _trainer_logprobs(model, p, o, params))
        for p, o in zip(prompts, outs, strict=True)
    ]
    assert not all(equal)
    # ... while each value is still close: the standard path is a correct model, just not bit-aligned.
    for p, o in zip(prompts, outs, strict=True):
        torch.testing.assert_close(o.logprobs, _trainer_logprobs(model, p, o, params), atol=1e-4, rtol=1e-4)


def test_engine_group_of_one_prompt_prefills_it_once_and_stays_bit_identical(tiny_model):
    model = tiny_model()
    engine = RZEngine(
        model,
        EngineConfig(
            max_running=8, max_len=256, max_batch_tokens=24, share_prefix_min_tokens=16, num_threads=1
        ),
    )
    system = _prompts(1, model.config.vocab_size, seed=21, lengths=(40,))[0]
    group = [system + [5, 6, 7]] * 4  # four samples of one prompt
    other = [system + [9, 9]]  # another prompt with the same system prefix
    prompts = group + other
    outs = generate_batch(engine, prompts, SamplingParams(temperature=1.0, max_tokens=6))
    reused = [o.num_cached_prompt_tokens for o in outs]
    assert reused[0] == 0 and reused[1:4] == [42, 42, 42] and reused[4] == 40
    assert engine.stats()["shared_prefix_tokens"] == 3 * 42 + 40
    assert len({tuple(o.tokens) for o in outs[:4]}) > 1  # unseeded samples still differ
    for p, o in zip(prompts, outs, strict=True):
        assert torch.equal(o.logprobs, _trainer_logprobs(model, p, o, SamplingParams()))


def test_engine_logprobs_equal_trainer_forward_at_a_2k_token_context(tiny_model):
    # Past IN_PLACE_BLOCKS key blocks the attention reads K/V in place, tile by tile; the prompt is
    # prefilled in chunks, then decoded: every generated token must still equal the packed forward.
    model = tiny_model(max_position_embeddings=2304)
    engine = RZEngine(model, EngineConfig(max_running=2, max_len=2304, max_batch_tokens=512, num_threads=1))
    prompt = _prompts(1, model.config.vocab_size, seed=9, lengths=(2100,))[0]
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=5)
    out = generate_batch(engine, [prompt], params)[0]
    assert len(out.tokens) == 12
    assert torch.equal(out.logprobs, _trainer_logprobs(model, prompt, out, params))


def test_sampling_in_row_chunks_gives_the_same_tokens_and_logprobs(tiny_model, monkeypatch):
    import rz_agents.engine.runner as runner

    model = tiny_model()
    prompts = _prompts(20, model.config.vocab_size, seed=13)
    params = [SamplingParams(temperature=1.0, max_tokens=6, seed=i) for i in range(10)] + [
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=6)
    ] * 10  # unseeded rows draw from the engine's generator in row order

    def run():
        cfg = EngineConfig(max_running=20, max_len=256, max_batch_tokens=512, num_threads=1, seed=3)
        return generate_batch(RZEngine(model, cfg), prompts, params)

    whole = run()
    monkeypatch.setattr(runner, "LOGIT_CHUNK_BYTES", 4 * model.config.vocab_size * 8)  # 8 rows a chunk
    heads = []  # rows of each LM-head GEMM
    real_logits = type(model).logits
    monkeypatch.setattr(
        type(model), "logits", lambda self, h: heads.append(h.shape[0]) or real_logits(self, h)
    )
    chunked = run()
    for a, b in zip(whole, chunked, strict=True):
        assert a.tokens == b.tokens and torch.equal(a.logprobs, b.logprobs)
    assert max(heads) == 20  # one LM-head GEMM over every sampling row of a step, not one per 8-row chunk


def test_preemption_and_readmission_give_the_same_tokens_and_logprobs(tiny_model):
    # Six pages for six sequences that grow past two pages each: running sequences are preempted,
    # recompute their K/V (prompt + generated tokens) when re-admitted into other pages, and go on.
    model = tiny_model()
    page = bytes_per_page(model.config)
    prompts = _prompts(6, model.config.vocab_size, seed=17, lengths=(60, 100, 20, 130, 45, 70))
    params = [SamplingParams(temperature=1.0, max_tokens=40, seed=i, ignore_eos=True) for i in range(6)]
    tight = RZEngine(
        model,
        EngineConfig(max_running=6, max_len=256, max_batch_tokens=48, kv_cache_bytes=6 * page, num_threads=1),
    )
    roomy = RZEngine(model, EngineConfig(max_running=6, max_len=256, max_batch_tokens=48, num_threads=1))
    got, want = generate_batch(tight, prompts, params), generate_batch(roomy, prompts, params)
    assert tight.stats()["preemptions"] > 0 and roomy.stats()["preemptions"] == 0
    for p, sp, a, b in zip(prompts, params, got, want, strict=True):
        assert a.tokens == b.tokens and torch.equal(a.logprobs, b.logprobs)
        assert torch.equal(a.logprobs, _trainer_logprobs(model, p, a, sp))
    assert tight.stats()["kv_bytes_held"] == 0


def test_shared_prompt_pages_give_the_same_bits_as_private_ones(tiny_model):
    # A 150-token prompt: two full pages shared by reference among the group, the third copied.
    model = tiny_model()
    prompt = _prompts(1, model.config.vocab_size, seed=23, lengths=(150,))[0]
    params = [SamplingParams(temperature=1.0, max_tokens=8, seed=i) for i in range(4)]
    cfg = dict(max_running=4, max_len=256, max_batch_tokens=64, prefix_cache=False, num_threads=1)
    shared = RZEngine(model, EngineConfig(**cfg, share_prefix_min_tokens=16))
    private = RZEngine(model, EngineConfig(**cfg, share_prefix_min_tokens=0))

    async def run(engine):
        tasks = [asyncio.create_task(engine.generate(prompt, p)) for p in params]
        refcounts = set()
        while not all(t.done() for t in tasks):
            for seq in engine.scheduler.running:
                refcounts |= {engine.scheduler.pages.refcount(p) for p in seq.pages}
            await asyncio.sleep(0)
        return [t.result() for t in tasks], refcounts

    (a, shared_refs), (b, private_refs) = asyncio.run(run(shared)), asyncio.run(run(private))
    assert max(shared_refs) == 4 and max(private_refs) == 1  # the group really shared pages
    assert shared.stats()["shared_prefix_tokens"] == 3 * 149
    for sp, x, y in zip(params, a, b, strict=True):
        assert x.tokens == y.tokens and torch.equal(x.logprobs, y.logprobs)
        assert torch.equal(x.logprobs, _trainer_logprobs(model, prompt, x, sp))


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe", "qwen2", "deepseek_v3"])
def test_static_decode_step_padding_changes_no_bit(tiny_model, model_type):
    # 3 and 11 decoding sequences are padded to buckets of 4 and 16 rows (scratch-page sequences).
    model = tiny_model(model_type)
    prompts = _prompts(11, model.config.vocab_size, seed=31)
    params = [SamplingParams(temperature=1.0, max_tokens=10, seed=i, ignore_eos=True) for i in range(11)]
    cfg = dict(max_len=256, max_batch_tokens=512, num_threads=1)
    for n in (3, 11):
        static = RZEngine(model, EngineConfig(max_running=16, static_decode=True, **cfg))
        eager = RZEngine(model, EngineConfig(max_running=16, static_decode=False, **cfg))
        rows = []
        real_run = static.runner.decode_step.run

        def run(
            tokens, positions, tables, rope, real_run=real_run, rows=rows, step=static.runner.decode_step
        ):
            rows.append(step.bucket(len(tokens)))
            return real_run(tokens, positions, tables, rope)

        static.runner.decode_step.run = run
        a = generate_batch(static, prompts[:n], params[:n])
        b = generate_batch(eager, prompts[:n], params[:n])
        assert max(rows) == {3: 4, 11: 16}[n]  # padded steps really ran
        for p, sp, x, y in zip(prompts, params, a, b, strict=False):
            assert x.tokens == y.tokens and torch.equal(x.logprobs, y.logprobs)
            assert torch.equal(x.logprobs, _trainer_logprobs(model, p, x, sp))


def test_decode_buckets_cover_every_batch_size():
    from rz_agents.engine.decode_step import decode_buckets

    assert decode_buckets(1) == [1]
    assert decode_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert decode_buckets(64)[-3:] == [48, 56, 64]
