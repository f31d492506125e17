"""A forward error fails only the sequence whose own forward fails, never its batch-mates: after a failed
step the engine runs each chunk alone, and the batch-mates' tokens and log-probs are the ones they get with no
failing neighbour (the forward is batch invariant)."""

from __future__ import annotations

import asyncio

import torch

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams

SHORT = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]


def _engine(tiny_model) -> RZEngine:
    # max_len beyond the model's 64 positions: a long prompt fails in the forward itself (rope.check_top)
    model = tiny_model(max_position_embeddings=64).requires_grad_(False)
    config = EngineConfig(max_running=8, max_len=256, max_batch_tokens=512, num_threads=1)
    return RZEngine(model, config)


def _run(engine: RZEngine, prompts: list[list[int]]):
    async def go():
        params = [SamplingParams(temperature=1.0, max_tokens=8, seed=10 + i) for i in range(len(prompts))]
        return await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))

    return asyncio.run(go())


def test_a_sequence_whose_forward_fails_does_not_fail_its_batch_mates(tiny_model):
    long = list(range(1, 100))  # 99 positions > 64
    mixed = _run(_engine(tiny_model), [*SHORT, long])
    alone = _run(_engine(tiny_model), SHORT)
    assert mixed[-1].finish_reason == "error" and "max_position_embeddings" in mixed[-1].error
    for got, want in zip(mixed[:-1], alone, strict=True):
        assert got.finish_reason == "length" and got.tokens == want.tokens
        assert torch.equal(got.logprobs, want.logprobs)


def test_a_forward_failing_for_every_chunk_fails_them_all_and_the_engine_goes_on(tiny_model):
    engine = _engine(tiny_model)
    failed = _run(engine, [list(range(1, 100)), list(range(1, 90))])
    assert [c.finish_reason for c in failed] == ["error", "error"]
    ok = _run(engine, SHORT[:1])[0]
    assert ok.finish_reason == "length" and engine.stats()["kv_bytes_held"] == 0
