"""Run env calls off the event loop: the rollout loop awaits them while other episodes proceed.

Env steps block (a sandbox call, a browser action), so they run on a thread pool; the threads
mostly wait on pipes with the GIL released, which is why a few dozen threads serve hundreds of
concurrent episodes on two cores. More threads are not better: every one that wakes competes
for the GIL with the event loop (measured on 2 cores, 200 concurrent episodes: 32 threads keep
loop stalls under ~0.3 s, 64 threads let them reach ~0.6 s). Size ``max_workers`` to the number
of env calls that may block at the same time (e.g. tool calls running to their time limit).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import gymnasium

StepResult = tuple[list[dict[str, str]], float, bool, bool, dict[str, Any]]


class EnvWorkerPool:
    """A thread pool for env ``reset``/``step``/``close`` calls, awaitable from asyncio.

    Use one pool per process and pass it to ``astep``/``areset`` (or call its methods).
    """

    def __init__(self, max_workers: int = 32) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="rz-env")
        self._start_threads(max_workers)

    def _start_threads(self, n: int) -> None:
        # ThreadPoolExecutor starts threads lazily inside submit(), and Thread.start() waits for the
        # new thread to get the GIL: under load that stalls the event loop for seconds. Start them
        # all now, while nothing else runs.
        barrier = threading.Barrier(n + 1)
        for _ in range(n):
            self.executor.submit(barrier.wait)
        barrier.wait()

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))

    async def reset(
        self, env: gymnasium.Env, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """``env.reset`` on a worker thread."""
        return await self._call(env.reset, seed=seed, options=options)

    async def step(self, env: gymnasium.Env, action: str) -> StepResult:
        """``env.step`` on a worker thread."""
        return await self._call(env.step, action)

    async def close(self, env: gymnasium.Env) -> None:
        """``env.close`` on a worker thread."""
        await self._call(env.close)

    def shutdown(self) -> None:
        """Wait for running calls and stop the threads."""
        self.executor.shutdown(wait=True)

    def __enter__(self) -> EnvWorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


async def astep(env: gymnasium.Env, action: str, pool: EnvWorkerPool | None = None) -> StepResult:
    """Await ``env.step(action)`` without blocking the event loop (the loop's default executor
    when no pool is given)."""
    if pool is not None:
        return await pool.step(env, action)
    return await asyncio.get_running_loop().run_in_executor(None, env.step, action)


async def areset(
    env: gymnasium.Env,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    pool: EnvWorkerPool | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Await ``env.reset(...)`` without blocking the event loop."""
    if pool is not None:
        return await pool.reset(env, seed=seed, options=options)
    return await asyncio.get_running_loop().run_in_executor(
        None, lambda: env.reset(seed=seed, options=options)
    )
