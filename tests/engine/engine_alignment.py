"""What the engine-vs-learner alignment tests of every family share: random prompts, seeded sampling
parameters, the learner's log-probs of what the engine sampled and their bitwise comparison, and a weight
update applied while sequences run."""

from __future__ import annotations

import asyncio

import torch

from rz_agents.engine import RZEngine, SamplingParams
from rz_agents.model.logprobs import packed_token_logprobs


def random_prompts(lengths, vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def seeded_params(n: int, max_tokens: int) -> list[SamplingParams]:
    return [SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=i) for i in range(n)]


def learner_logprobs(model, prompts, outs) -> list[torch.Tensor]:
    """The learner's packed-forward log-probs of each completion's tokens."""
    with torch.no_grad():
        lps = packed_token_logprobs(model, [p + o.tokens for p, o in zip(prompts, outs, strict=True)])
    return [lp[len(p) - 1 :] for p, lp in zip(prompts, lps, strict=True)]


def assert_equal_to_learner(model, prompts, outs) -> None:
    for p, o, lp in zip(prompts, outs, learner_logprobs(model, prompts, outs), strict=True):
        assert o.finish_reason == "length", o.error
        assert torch.equal(o.logprobs, lp), (len(p), (o.logprobs - lp).abs().max().item())


def assert_update_recomputes_exactly(engine: RZEngine, new, prompts, params, after_tokens: int) -> None:
    """Load ``new``'s weights (version 1) once ``after_tokens`` tokens are generated; every token sampled at
    version 1 must equal ``new``'s learner log-prob bit for bit (and some must be)."""

    async def run():
        tasks = [asyncio.ensure_future(engine.generate(p, q)) for p, q in zip(prompts, params, strict=True)]
        while engine.counters["generated_tokens"] < after_tokens:
            await asyncio.sleep(0)
        engine.load_weights(new.state_dict(), version=1)
        return await asyncio.gather(*tasks)

    outs = asyncio.run(run())
    seen = 0
    for o, lp in zip(outs, learner_logprobs(new, prompts, outs), strict=True):
        after = torch.tensor([v == 1 for v in o.versions])
        seen += int(after.sum())
        assert torch.equal(o.logprobs[after], lp[after])
    assert seen > 0
