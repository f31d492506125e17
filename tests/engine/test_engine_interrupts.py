"""An exception that is not the engine's to handle (KeyboardInterrupt, a caller's time limit such as
scripts/gpu_check.py's SectionTimeout: BaseException subclasses) reaches every waiting caller. The engine's
step handlers catch Exception only: before, such an exception killed the step loop and left the callers
waiting forever; had it been an Exception, they would have turned it into "error" completions that a check
could read as a finished run."""

from __future__ import annotations

import asyncio

import pytest

from rz_agents.engine import EngineConfig, RZEngine, SamplingParams


class CallerDeadline(BaseException):
    """What a caller's alarm raises in the middle of an engine step."""


def _engine(model, **overrides) -> RZEngine:
    return RZEngine(model, EngineConfig(max_running=4, max_len=64, num_threads=1, **overrides))


@pytest.mark.parametrize("step_in_thread", [False, True])
def test_a_base_exception_in_a_step_reaches_every_caller_and_frees_the_pages(tiny_model, step_in_thread):
    engine = _engine(tiny_model(), step_in_thread=step_in_thread)
    real_forward = engine.runner.forward
    calls = {"n": 0}

    def forward_interrupted(batch):  # the third model step is where the caller's deadline fires
        calls["n"] += 1
        if calls["n"] == 3:
            raise CallerDeadline("past its budget")
        return real_forward(batch)

    engine.runner.forward = forward_interrupted

    async def run():
        jobs = [engine.generate(p, SamplingParams(max_tokens=8)) for p in ([5, 6, 7], [1, 2])]
        return await asyncio.wait_for(asyncio.gather(*jobs), timeout=20)  # before: waited forever

    with pytest.raises(CallerDeadline, match="past its budget"):
        asyncio.run(run())
    assert engine.stats()["kv_bytes_held"] == 0  # the interrupted sequences' pages are free
    engine.runner.forward = real_forward
    (done,) = [asyncio.run(engine.generate([5, 6, 7], SamplingParams(max_tokens=4)))]
    assert done.finish_reason == "length" and len(done.tokens) == 4  # and the engine serves on
