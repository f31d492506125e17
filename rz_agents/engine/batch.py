"""Synchronous convenience for evaluation: many prompts in, completions out (in order)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rz_agents.engine.params import Completion, SamplingParams
from rz_agents.engine.protocol import Engine


def generate_batch(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams] | None = None,
) -> list[Completion]:
    """Generate one completion per prompt, all in flight at once; returns them in prompt order.

    ``params`` is one SamplingParams for every prompt or a list with one per prompt. Not for use
    inside a running event loop (there, ``await asyncio.gather(*(engine.generate(...) ...))``).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            "generate_batch is synchronous; inside async code await engine.generate(...) instead"
        )
    if params is None or isinstance(params, SamplingParams):
        per_prompt = [params or SamplingParams()] * len(prompts)
    else:
        per_prompt = list(params)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"got {len(per_prompt)} SamplingParams for {len(prompts)} prompts")

    async def run() -> list[Completion]:
        return list(
            await asyncio.gather(
                *(engine.generate(list(p), sp) for p, sp in zip(prompts, per_prompt, strict=True))
            )
        )

    return asyncio.run(run())
